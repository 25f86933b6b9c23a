package token

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/testlog"
)

func TestParse(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		in      string
		want    Token
		wantErr string
	}{
		{in: "KELP1" + hash + "::server:s3cret", want: Token{CAHash: hash, User: ServerUser, Secret: "s3cret"}},
		{in: " KELP1" + hash + "::node:s3cret\n", want: Token{CAHash: hash, User: NodeUser, Secret: "s3cret"}},
		{in: "s3cret", want: Token{User: NodeUser, Secret: "s3cret"}},
		{in: "", wantErr: "empty"},
		{in: "K10" + hash + "::server:s3cret", wantErr: "does not start with KELP1"},
		{in: "KELP1abc::server:s3cret", wantErr: "CA hash is malformed"},
		{in: "KELP1" + strings.Repeat("zz", 32) + "::server:s3cret", wantErr: "CA hash is malformed"},
		{in: "KELP1" + hash + "::root:s3cret", wantErr: "credentials are malformed"},
		{in: "KELP1" + hash + "::server:", wantErr: "credentials are malformed"},
	} {
		got, err := Parse(tc.in, NodeUser)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if again, err := Parse(got.String(), NodeUser); err != nil || again != got {
			t.Errorf("round trip of %q: %+v, %v", got.String(), again, err)
		}
	}
}

func TestEnsure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server", "token")
	hashA, hashB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	first, err := Ensure(path, ServerUser, "", hashA)
	if err != nil || len(first.Secret) != 32 || first.CAHash != hashA {
		t.Fatalf("first token %+v, %v", first, err)
	}
	if again, err := Ensure(path, ServerUser, "", hashA); err != nil || again != first {
		t.Errorf("a second start changed the token: %+v, %v", again, err)
	}
	// A new CA keeps the secret; a flag replaces it.
	if moved, err := Ensure(path, ServerUser, "", hashB); err != nil || moved.Secret != first.Secret || moved.CAHash != hashB {
		t.Errorf("after a CA change: %+v, %v", moved, err)
	}
	if chosen, err := Ensure(path, ServerUser, "mine", hashB); err != nil || chosen.Secret != "mine" {
		t.Errorf("--token: %+v, %v", chosen, err)
	}
	data, _ := os.ReadFile(path)
	if got := strings.TrimSpace(string(data)); got != "KELP1"+hashB+"::server:mine" {
		t.Errorf("file holds %q", got)
	}
	if err := os.WriteFile(path, []byte("KELP1broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(path, ServerUser, "", hashB); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("a damaged file: %v", err)
	}
}

// A power cut can leave a token file empty; the server must still start,
// with the configured secret or a new one, and say so.
func TestEnsureEmptyFile(t *testing.T) {
	hash := strings.Repeat("a", 64)
	for _, tc := range []struct {
		name, content, want string
	}{
		{"empty, --token given", "", "given"},
		{"whitespace, --token given", " \n\t", "given"},
		{"empty, no --token", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hook := testlog.Capture(t)
			path := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := Ensure(path, ServerUser, tc.want, hash)
			if err != nil {
				t.Fatalf("Ensure: %v", err)
			}
			if tc.want != "" && got.Secret != tc.want || tc.want == "" && len(got.Secret) != 32 {
				t.Errorf("secret %q, want %q (or a new one)", got.Secret, tc.want)
			}
			data, _ := os.ReadFile(path)
			if strings.TrimSpace(string(data)) != got.String() {
				t.Errorf("file holds %q, want %q", data, got)
			}
			warned := false
			for _, e := range hook.AllEntries() {
				warned = warned || e.Level == logrus.WarnLevel && e.Data["file"] == path && strings.Contains(e.Message, "empty")
			}
			if !warned {
				t.Errorf("no warning about the empty file; logged %v", hook.AllEntries())
			}
		})
	}
}
