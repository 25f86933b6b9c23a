package token

import (
	"fmt"
	"strings"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// maxFile caps what a file holding a secret may hold: a full token is
// about 100 bytes.
const maxFile = 64 << 10

// ReadFile returns the secret or token in the file at path (given with
// flag, for messages), without surrounding white space. An empty file is
// an error, never an empty secret, and so is anything but a regular file
// (atomicfile.ReadRegular).
func ReadFile(flag, path string) (string, error) {
	data, err := atomicfile.ReadRegular(path, maxFile)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return "", fmt.Errorf("%s %s is empty: write the secret into it", flag, path)
	}
	return s, nil
}

// FromFlagOrFile is a secret given either as the value of --flag or in the
// file that --fileFlag names (ReadFile), never both.
func FromFlagOrFile(flag, value, fileFlag, file string) (string, error) {
	value = strings.TrimSpace(value)
	switch {
	case file == "":
		return value, nil
	case value != "":
		return "", fmt.Errorf("--%s and --%s exclude each other", flag, fileFlag)
	}
	return ReadFile("--"+fileFlag, file)
}
