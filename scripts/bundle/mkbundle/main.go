// Command mkbundle writes the runtime bundle that kelp embeds: a zstd-compressed
// tar whose first entry is a MANIFEST of every other file, and a sha256 file
// naming the compressed archive's hash.
//
//	mkbundle -out embed/bundle.tar.zst -sha256 embed/bundle.sha256 bin/runc=/path/to/runc ...
//
// MANIFEST has one line per file, sorted by path: "<sha256 hex> <size> <path>".
// The archive is reproducible: entries are sorted, owners and times are fixed.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
)

// manifestName must match what embed.Stage expects as the first entry.
const manifestName = "MANIFEST"

type entry struct {
	name string // path inside the bundle
	src  string // file on disk
	mode int64
	size int64
	sum  string
}

func main() {
	out := flag.String("out", "", "compressed bundle to write (.tar.zst)")
	sumFile := flag.String("sha256", "", "file to write the bundle's sha256 to")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: mkbundle -out FILE -sha256 FILE NAME=SRC...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*out, *sumFile, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "mkbundle:", err)
		os.Exit(1)
	}
}

func run(out, sumFile string, specs []string) error {
	if out == "" || sumFile == "" || len(specs) == 0 {
		return fmt.Errorf("-out, -sha256 and at least one NAME=SRC are required")
	}
	entries, err := readEntries(specs)
	if err != nil {
		return err
	}

	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	if err != nil {
		return err
	}
	if err := writeTar(zw, entries); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("compress: %w", err)
	}

	sum := sha256.Sum256(buf.Bytes())
	if err := writeAtomic(out, buf.Bytes()); err != nil {
		return err
	}
	line := hex.EncodeToString(sum[:]) + "  " + filepath.Base(out) + "\n"
	return writeAtomic(sumFile, []byte(line))
}

func readEntries(specs []string) ([]entry, error) {
	seen := map[string]bool{}
	var entries []entry
	for _, spec := range specs {
		name, src, ok := strings.Cut(spec, "=")
		if !ok || name == "" || src == "" {
			return nil, fmt.Errorf("argument %q is not NAME=SRC", spec)
		}
		if clean := path.Clean(name); clean != name || path.IsAbs(name) || strings.HasPrefix(name, "../") || name == manifestName {
			return nil, fmt.Errorf("bundle path %q must be relative, clean and not %s", name, manifestName)
		}
		if seen[name] {
			return nil, fmt.Errorf("bundle path %q given twice", name)
		}
		seen[name] = true

		f, err := os.Open(src)
		if err != nil {
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			f.Close()
			return nil, fmt.Errorf("%s is not a regular file", src)
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("hash %s: %w", src, err)
		}
		mode := int64(0o644)
		if fi.Mode()&0o111 != 0 {
			mode = 0o755
		}
		entries = append(entries, entry{name: name, src: src, mode: mode, size: fi.Size(), sum: hex.EncodeToString(h.Sum(nil))})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	return entries, nil
}

func writeTar(w io.Writer, entries []entry) error {
	var manifest strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&manifest, "%s %d %s\n", e.sum, e.size, e.name)
	}
	tw := tar.NewWriter(w)
	header := func(name string, mode, size int64) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: size, ModTime: time.Unix(0, 0)}
	}
	if err := tw.WriteHeader(header(manifestName, 0o644, int64(manifest.Len()))); err != nil {
		return err
	}
	if _, err := io.WriteString(tw, manifest.String()); err != nil {
		return err
	}
	for _, e := range entries {
		if err := tw.WriteHeader(header(e.name, e.mode, e.size)); err != nil {
			return err
		}
		f, err := os.Open(e.src)
		if err != nil {
			return err
		}
		n, err := io.Copy(tw, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("add %s: %w", e.src, err)
		}
		if n != e.size {
			return fmt.Errorf("%s changed while packing", e.src)
		}
	}
	return tw.Close()
}

// writeAtomic replaces path in one step, so a concurrent go build never embeds
// half a file.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
