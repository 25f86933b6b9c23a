package pki

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

const (
	fileMode = 0o600
	dirMode  = 0o700
)

func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("pki: create %s: %w", dir, err)
	}
	// MkdirAll leaves an existing directory's mode alone; set it exactly.
	if err := os.Chmod(dir, dirMode); err != nil {
		return fmt.Errorf("pki: restrict mode of %s: %w", dir, err)
	}
	return nil
}

// writeFile replaces path with data so that a reader, or the next start
// after a crash or a power cut, sees either the old content or the new.
func writeFile(path string, data []byte) error {
	if err := atomicfile.Write(path, data, fileMode); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return nil
}

// writeIfChanged writes data to path unless path holds it already: a start
// with nothing to change writes nothing.
func writeIfChanged(path string, data []byte) error {
	have, err := readOptional(path)
	if err != nil || bytes.Equal(have, data) {
		return err
	}
	return writeFile(path, data)
}

// readOptional returns nil data and no error when path does not exist.
func readOptional(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pki: read %s: %w", path, err)
	}
	return data, nil
}
