package secretsencrypt

import (
	"errors"
	"fmt"
	"time"

	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
)

// The steps of `kelp secrets-encrypt`, each a change of the configuration
// file that the apiserver picks up on its own. None rewrites a Secret:
// Reencrypt does, and only then are keys no longer needed dropped.

// Enable makes new writes encrypted, with a new key if there is none.
func Enable(path string, now time.Time) error {
	return change(path, true, func(c *Config) error {
		if len(c.Keys) == 0 {
			k, err := NewKey(now)
			if err != nil {
				return err
			}
			c.Keys = append(c.Keys, k)
		}
		c.Enabled = true
		return nil
	})
}

// Disable makes new writes plain; the keys still read what they wrote.
func Disable(path string) error {
	return change(path, false, func(c *Config) error {
		c.Enabled = false
		return nil
	})
}

// Prepare adds a new key that reads but does not yet write, so that every
// apiserver can read what it will encrypt before any writes with it.
func Prepare(path string, now time.Time) error {
	return change(path, false, func(c *Config) error {
		k, err := NewKey(now)
		if err != nil {
			return err
		}
		c.Keys = append(c.Keys, k)
		return nil
	})
}

// Rotate makes the newest key, added by Prepare, the one that writes.
func Rotate(path string) error {
	return change(path, false, func(c *Config) error {
		if len(c.Keys) < 2 {
			return errors.New("there is no prepared key to rotate to: run `kelp secrets-encrypt prepare` first")
		}
		newest := c.Keys[len(c.Keys)-1]
		c.Keys = append([]apiserverv1.Key{newest}, c.Keys[:len(c.Keys)-1]...)
		return nil
	})
}

// dropUnused keeps only the key that writes; with encryption off, none.
func dropUnused(path string) error {
	return change(path, false, func(c *Config) error {
		if c.Enabled {
			c.Keys = c.Keys[:1]
		} else {
			c.Keys = nil
		}
		return nil
	})
}

// change edits the configuration at path; only enabling may make one (the
// server makes one at its first start).
func change(path string, create bool, edit func(*Config) error) error {
	c, ok, err := Load(path)
	if err != nil {
		return err
	}
	if !ok && !create {
		return fmt.Errorf("secrets encryption was never enabled on this server (%s does not exist): start kelp server with --secrets-encryption, or run `kelp secrets-encrypt enable`", path)
	}
	if err := edit(&c); err != nil {
		return err
	}
	return Save(path, c)
}
