package secretsencrypt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The steps change the configuration the way a rotation needs: a
// prepared key decrypts before it encrypts, rotate makes it encrypt, and
// dropping the unused keys leaves the one that encrypts; disabled, the
// clear comes first and the keys still decrypt.
func TestSteps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "encryption-config.json")
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	load := func() Config {
		t.Helper()
		c, ok, err := Load(path)
		if err != nil || !ok {
			t.Fatalf("Load: %v %v", ok, err)
		}
		return c
	}
	if err := Prepare(path, now); err == nil || !strings.Contains(err.Error(), "--secrets-encryption") {
		t.Errorf("prepare before enable: %v", err)
	}
	if err := Enable(path, now); err != nil {
		t.Fatal(err)
	}
	first := load()
	if !first.Enabled || len(first.Keys) != 1 || first.Active() != "key-20261123T120000Z" {
		t.Fatalf("after enable: %+v", first)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if err := Rotate(path); err == nil || !strings.Contains(err.Error(), "prepare") {
		t.Errorf("rotate with nothing prepared: %v", err)
	}
	if err := Prepare(path, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if c := load(); c.Active() != first.Active() || len(c.Keys) != 2 {
		t.Errorf("prepare changed the key that encrypts: %+v", c)
	}
	if err := Rotate(path); err != nil {
		t.Fatal(err)
	}
	if c := load(); c.Active() != "key-20261123T130000Z" || c.Keys[1].Name != first.Active() {
		t.Errorf("after rotate: %+v", c)
	}
	if err := dropUnused(path); err != nil {
		t.Fatal(err)
	}
	if c := load(); len(c.Keys) != 1 || c.Active() != "key-20261123T130000Z" {
		t.Errorf("after reencrypt: %+v", c)
	}
	if err := Disable(path); err != nil {
		t.Fatal(err)
	}
	if c := load(); c.Enabled || c.Active() != "identity" || len(c.Keys) != 1 {
		t.Errorf("after disable: %+v", c)
	}
	data, _ := os.ReadFile(path)
	if strings.Index(string(data), `"identity"`) > strings.Index(string(data), `"secretbox"`) {
		t.Errorf("disabled, the clear must come first:\n%s", data)
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Load(path); err == nil || !strings.Contains(err.Error(), "from a backup") {
		t.Errorf("a damaged configuration: %v", err)
	}
}

func TestStoredWith(t *testing.T) {
	for value, want := range map[string]string{
		"k8s:enc:secretbox:v1:key-20261123T120000Z:\x01\x02": "key-20261123T120000Z",
		"k8s\x00\n\x0c\n\x02v1\x12\x06Secret":                "identity",
	} {
		if got := storedWith([]byte(value)); got != want {
			t.Errorf("storedWith(%q) = %q, want %q", value, got, want)
		}
	}
}
