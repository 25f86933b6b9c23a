package token

import (
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// maxFile caps what a file holding a secret may hold: a full token is
// about 100 bytes.
const maxFile = 64 << 10

// ReadFile returns the secret or token in the file at path (given with
// flag, for messages), without surrounding white space. An empty file is
// an error, never an empty secret, and so is anything but a regular file.
func ReadFile(flag, path string) (string, error) {
	// O_NONBLOCK: opening a FIFO would wait for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s %s: not a regular file", flag, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	if len(data) > maxFile {
		return "", fmt.Errorf("%s %s: larger than %d KiB, which no token is", flag, path, maxFile>>10)
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return "", fmt.Errorf("%s %s is empty: write the secret into it", flag, path)
	}
	return s, nil
}
