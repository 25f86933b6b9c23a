// Package secretsencrypt keeps Secrets encrypted at rest: the apiserver's
// EncryptionConfiguration, which kelp writes and the apiserver reloads
// when it changes, and `kelp secrets-encrypt` to enable, disable and
// rotate its keys and rewrite every Secret with the active one.
package secretsencrypt

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// Provider is the encryption every key is for: XSalsa20 and Poly1305,
// which, unlike AES-GCM with a fixed key, has no limit on the writes a key
// may protect.
const Provider = "secretbox"

// Config is the EncryptionConfiguration in kelp's terms.
type Config struct {
	// Enabled: new writes are encrypted with Keys[0]; else written in
	// the clear, while the keys still read what they encrypted.
	Enabled bool
	Keys    []apiserverv1.Key
}

// Active names what new writes are encrypted with: a key's name, or
// "identity" for none.
func (c Config) Active() string {
	if !c.Enabled || len(c.Keys) == 0 {
		return "identity"
	}
	return c.Keys[0].Name
}

// Load reads the configuration at path; ok is false when there is none.
func Load(path string) (c Config, ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) || err == nil && len(data) == 0 {
		return Config{}, false, nil
	}
	if err != nil {
		return Config{}, false, err
	}
	var ec apiserverv1.EncryptionConfiguration
	if err := json.Unmarshal(data, &ec); err != nil || len(ec.Resources) != 1 {
		return Config{}, false, fmt.Errorf("%s is not an encryption configuration kelp wrote (%v): restore it from a backup, or from another server of the cluster", path, err)
	}
	for i, p := range ec.Resources[0].Providers {
		switch {
		case p.Secretbox != nil:
			c.Keys = p.Secretbox.Keys
			c.Enabled = i == 0
		case p.Identity != nil:
		default:
			return Config{}, false, fmt.Errorf("%s: a provider kelp does not manage", path)
		}
	}
	return c, true, nil
}

// Save writes c to path for the apiserver, mode 0600.
func Save(path string, c Config) error {
	identity := apiserverv1.ProviderConfiguration{Identity: &apiserverv1.IdentityConfiguration{}}
	var providers []apiserverv1.ProviderConfiguration
	if len(c.Keys) > 0 {
		providers = append(providers, apiserverv1.ProviderConfiguration{Secretbox: &apiserverv1.SecretboxConfiguration{Keys: c.Keys}})
	}
	// The first provider writes; every provider reads.
	if c.Enabled {
		providers = append(providers, identity)
	} else {
		providers = append([]apiserverv1.ProviderConfiguration{identity}, providers...)
	}
	ec := apiserverv1.EncryptionConfiguration{
		TypeMeta:  metav1.TypeMeta{APIVersion: "apiserver.config.k8s.io/v1", Kind: "EncryptionConfiguration"},
		Resources: []apiserverv1.ResourceConfiguration{{Resources: []string{"secrets"}, Providers: providers}},
	}
	data, err := json.MarshalIndent(ec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	return atomicfile.Write(path, append(data, '\n'), 0o600)
}

// NewKey makes a key named for when it was made.
func NewKey(now time.Time) (apiserverv1.Key, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return apiserverv1.Key{}, err
	}
	return apiserverv1.Key{Name: "key-" + now.UTC().Format("20060102T150405Z"), Secret: base64.StdEncoding.EncodeToString(secret)}, nil
}
