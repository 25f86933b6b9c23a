package token

import (
	"cmp"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

var log = logrus.WithField("component", "token")

// prefix marks the full form and its version.
const prefix = "KELP1"

// Users a secret can be presented as: a server token also joins agents;
// an agent token (--agent-token) joins agents only.
const (
	ServerUser = "server"
	NodeUser   = "node"
)

// Token is a parsed join token.
type Token struct {
	CAHash string // hex SHA-256 of the server CA; empty in the short form
	User   string // ServerUser or NodeUser
	Secret string
}

// String is the full form when the CA hash is known, else the secret.
func (t Token) String() string {
	if t.CAHash == "" {
		return t.Secret
	}
	return prefix + t.CAHash + "::" + t.User + ":" + t.Secret
}

// Parse reads a token in either form. A short form's user is user.
func Parse(s, user string) (Token, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Token{}, errors.New("the token is empty")
	}
	rest, full := strings.CutPrefix(s, prefix)
	if !full {
		if strings.Contains(s, "::") {
			return Token{}, fmt.Errorf("the token does not start with %s: copy it whole from the server's <data-dir>/server/token", prefix)
		}
		return Token{User: user, Secret: s}, nil
	}
	hash, cred, ok := strings.Cut(rest, "::")
	if !ok || len(hash) != 64 || !isHex(hash) {
		return Token{}, fmt.Errorf("the token's CA hash is malformed: copy it whole from the server's <data-dir>/server/token")
	}
	u, secret, ok := strings.Cut(cred, ":")
	if !ok || secret == "" || (u != ServerUser && u != NodeUser) {
		return Token{}, fmt.Errorf("the token's credentials are malformed: want %s<hash>::%s:<secret> or ::%s:<secret>", prefix, ServerUser, NodeUser)
	}
	return Token{CAHash: hash, User: u, Secret: secret}, nil
}

// MinSecretLength is the shortest secret a user may choose for a token
// that joins nodes; the secrets kelp makes have 32 hex digits.
const MinSecretLength = 16

// CheckChosen refuses a secret that a user chose with flag when it is
// too short to hold out against guessing ("" is none chosen).
func CheckChosen(flag, secret string) error {
	if secret == "" || len(secret) >= MinSecretLength {
		return nil
	}
	return fmt.Errorf("%s: a secret of %d characters is too easy to guess: choose one of at least %d, such as the output of `openssl rand -hex 16`",
		flag, len(secret), MinSecretLength)
}

// Random makes a new secret.
func Random() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// Equal compares secrets in constant time.
func Equal(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// Ensure returns the token kept at path, for user, pinned to caHash. It
// writes one when there is none, or when the CA hash in it is stale, and
// keeps the secret: want (from a flag) if set, else the file's, else a new
// one. Changing the secret of a running cluster is `--token` with another
// value. An empty file counts as none: it is what a power cut during an
// unsynced write leaves, and it holds no secret to keep.
func Ensure(path, user, want, caHash string) (Token, error) {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Token{}, fmt.Errorf("read token %s: %w", path, err)
	}
	var have Token
	switch {
	case err != nil:
		// No file yet.
	case strings.TrimSpace(string(data)) == "":
		l := log.WithField("file", path)
		if want != "" {
			l.Warn("the token file is empty; writing it again from the configured token")
		} else {
			l.Warn("the token file is empty, its secret lost; writing a new one: nodes must join with the new token from this file, or start the server with the old secret as --token")
		}
	default:
		if have, err = Parse(string(data), user); err != nil {
			return Token{}, fmt.Errorf("token file %s: %w; remove it to make a new one", path, err)
		}
	}
	secret := cmp.Or(want, have.Secret)
	if secret == "" {
		if secret, err = Random(); err != nil {
			return Token{}, err
		}
	}
	t := Token{CAHash: caHash, User: user, Secret: secret}
	if t == have {
		return t, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return Token{}, fmt.Errorf("write token: %w", err)
	}
	if err := atomicfile.Write(path, []byte(t.String()+"\n"), 0o600); err != nil {
		return Token{}, err
	}
	return t, nil
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}
