package snapshot

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/token"
)

// A sidecar carries an HMAC-SHA256 of its other fields, and with them of
// the snapshot's sha256, so that whoever may write to a bucket cannot hand
// a restore a snapshot of their own. The key is derived from the secret of
// the server token: every server holds it (<data-dir>/server/token), and
// the user who restores on a new machine after a disaster has it too,
// where a key kept only on the lost server would be gone. A `kelp token
// rotate` changes it: a snapshot saved before is checked with the old
// secret, given with --token-file (the key ID in the sidecar tells the
// two cases apart).
const (
	macKeyContext = "kelp snapshot metadata v1"
	macIDContext  = "kelp snapshot key id v1"
)

// macKey is the key sidecars are authenticated with.
type macKey []byte

func keyFrom(secret string) macKey {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(macKeyContext))
	return h.Sum(nil)
}

// id names the key without giving it away: which token a snapshot was
// saved under, to tell a rotated token from a forged sidecar.
func (k macKey) id() string {
	h := hmac.New(sha256.New, k)
	h.Write([]byte(macIDContext))
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// sum is the MAC of m without its MAC fields.
func (k macKey) sum(m Metadata) string {
	m.MAC, m.MACKeyID = "", ""
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // a struct of strings, ints and a time
	}
	h := hmac.New(sha256.New, k)
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

func (k macKey) sign(m *Metadata) {
	m.MACKeyID = k.id()
	m.MAC = k.sum(*m)
}

// serverKey is the key of the token this server holds, which Save signs
// with.
func serverKey(dataDir string) (macKey, error) {
	secret, err := tokenSecret(layout.Server(dataDir).Token)
	if err != nil {
		return nil, fmt.Errorf("read the server token, whose secret authenticates snapshots: %w: run kelp snapshot on a server, with its --data-dir", err)
	}
	return keyFrom(secret), nil
}

func tokenSecret(path string) (string, error) {
	data, err := token.ReadFile("the server token", path)
	if err != nil {
		return "", err
	}
	t, err := token.Parse(data, token.ServerUser)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return t.Secret, nil
}

// keys are the keys a restore checks sidecars with: of the token given
// (Dir.Token), and of the data dir's server token, if there is one.
func (d Dir) keys() ([]macKey, error) {
	var keys []macKey
	if d.Token != "" {
		t, err := token.Parse(d.Token, token.ServerUser)
		if err != nil {
			return nil, fmt.Errorf("--token: %w", err)
		}
		keys = append(keys, keyFrom(t.Secret))
	}
	secret, err := tokenSecret(layout.Server(d.DataDir).Token)
	switch {
	case err == nil:
		keys = append(keys, keyFrom(secret))
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("read the server token: %w", err)
	}
	return keys, nil
}

var errUnsigned = errors.New("its metadata carries no MAC (it was saved by an older kelp, or the MAC was removed)")

// authenticate checks the MAC of the sidecar m of the snapshot at where
// against keys. A sidecar without one, saved by an older kelp, passes
// only when it was read from the snapshot directory or a path (which only
// root writes, and which a user who copies a snapshot there vouches for),
// with a warning; from S3, it is refused: stripping the MAC must not
// downgrade a forged sidecar to an old one.
func authenticate(m *Metadata, where string, fromS3 bool, keys []macKey) error {
	if m.MAC == "" {
		if fromS3 {
			return fmt.Errorf("snapshot %s is not authenticated: %w; kelp restores from S3 only snapshots whose metadata the cluster's token authenticates. If you trust this copy, download the snapshot and its .json yourself and restore that file by its path", where, errUnsigned)
		}
		log.WithField("snapshot", where).Warnf("the snapshot is not authenticated: %v; restoring it because it is a local file, which only root can put there", errUnsigned)
		return nil
	}
	var key macKey
	for _, k := range keys {
		if k.id() == m.MACKeyID {
			key = k
			break
		}
	}
	if key == nil {
		if len(keys) == 0 {
			return fmt.Errorf("snapshot %s is authenticated with the server token of its cluster, and this data dir has none: give the token with --token-file (kelp snapshot restore, kelp server); nothing was changed", where)
		}
		ids := make([]string, len(keys))
		for i, k := range keys {
			ids[i] = k.id()
		}
		return fmt.Errorf("snapshot %s is authenticated with another server token than this server's or the one given (key %s, not %s): it was saved before a `kelp token rotate` or in another cluster, or its metadata was forged; give the token it was saved under with --token-file; nothing was changed", where, m.MACKeyID, strings.Join(ids, ", "))
	}
	if !hmac.Equal([]byte(key.sum(*m)), []byte(m.MAC)) {
		return fmt.Errorf("snapshot %s was altered or forged: its metadata does not match its MAC; nothing was changed: restore another snapshot", where)
	}
	return nil
}
