package pki

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// writePair replaces the certificate and key of p. Both are written and
// synced aside first, then renamed into place one right after the other:
// a reader that loads them while kelp runs finds the new key with the old
// certificate only in that instant. client-go keeps what it loaded for a
// second, failing every new connection in that second if it loaded a
// mismatch; etcd loads at every handshake. The apiserver's and the
// kubelet's file watchers wake on the first rename and often do see the
// mismatch: they log it as an error and load the pair again when the
// second rename wakes them. A crash between the renames leaves the same
// mismatch, which the next start repairs.
func writePair(p Pair, certPEM, keyPEM []byte) error {
	key, err := tempFile(p.Key, keyPEM)
	if err != nil {
		return err
	}
	cert, err := tempFile(p.Cert, certPEM)
	if err != nil {
		os.Remove(key)
		return err
	}
	if err := os.Rename(key, p.Key); err != nil {
		os.Remove(key)
		os.Remove(cert)
		return fmt.Errorf("pki: write %s: %w", p.Key, err)
	}
	if err := os.Rename(cert, p.Cert); err != nil {
		os.Remove(cert)
		return fmt.Errorf("pki: write %s: %w", p.Cert, err)
	}
	dirs := []string{filepath.Dir(p.Key)}
	if d := filepath.Dir(p.Cert); d != dirs[0] {
		dirs = append(dirs, d)
	}
	var errs []error
	for _, dir := range dirs {
		if err := atomicfile.SyncDir(dir); err != nil {
			errs = append(errs, fmt.Errorf("pki: %w", err))
		}
	}
	return errors.Join(errs...)
}

// tempFile writes data to a synced temporary file beside path, named as
// atomicfile names its own, so that Ensure removes it after a crash.
func tempFile(path string, data []byte) (string, error) {
	name, err := atomicfile.Temp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-", fileMode, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("pki: write %s: %w", path, err)
	}
	return name, nil
}

// WriteRenewed puts a joined node's renewed credentials in f, each
// certificate with its key as writePair does, after the CA certificates
// serverCA and clientCA. Those change only in a CA rotation (RotateCA),
// whose bundles trust what the old ones did and the new leaves too: they
// go first, so that the node trusts the new leaves before it uses them.
func (f NodeFiles) WriteRenewed(serverCA, clientCA []byte, certs NodeCerts) error {
	pairs := f.pairsOf(certs)
	for path, data := range map[string][]byte{f.ServerCA: serverCA, f.ClientCA: clientCA} {
		if len(data) == 0 {
			return fmt.Errorf("pki: no %s to write", filepath.Base(path))
		}
	}
	for _, p := range pairs {
		for path, data := range map[string][]byte{p.files.Cert: p.pem.Cert, p.files.Key: p.pem.Key} {
			if len(data) == 0 {
				return fmt.Errorf("pki: no %s to write", filepath.Base(path))
			}
		}
	}
	for _, ca := range []struct {
		path string
		data []byte
	}{{f.ServerCA, serverCA}, {f.ClientCA, clientCA}} {
		if err := writeIfChanged(ca.path, ca.data); err != nil {
			return err
		}
	}
	for _, p := range pairs {
		if err := writePair(p.files, p.pem.Cert, p.pem.Key); err != nil {
			return err
		}
	}
	return nil
}
