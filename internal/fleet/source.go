package fleet

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/kelp-dev/kelp/internal/version"
)

const (
	// fetchTimeout bounds the download of a new kelp.
	fetchTimeout = 10 * time.Minute
	// versionTimeout bounds `<new kelp> --version`.
	versionTimeout = 30 * time.Second
	// maxRedirects is as many as Go's client follows by default.
	maxRedirects = 10
)

// fetched is a new kelp written to a file and checked.
type fetched struct {
	Path string
	// Kelp is the first line of its --version; Kubernetes the version of
	// the Kubernetes it runs.
	Kelp, Kubernetes string
}

// fetch writes the new kelp of spec into a new file in dir, checks its
// size (at most spec.maxSize), sha256 and that it runs (--version), and
// returns it. upgrades is the node's directory a spec.path is in. On any
// failure nothing is left in dir.
func fetch(ctx context.Context, spec Spec, upgrades, dir string) (fetched, error) {
	src, err := open(ctx, spec, upgrades)
	if err != nil {
		return fetched{}, err
	}
	defer src.Close()
	f, err := os.CreateTemp(dir, ".kelp-upgrade-*")
	if err != nil {
		return fetched{}, fmt.Errorf("make a file for the new kelp in %s: %w", dir, err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	sum := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, sum), io.LimitReader(src, spec.maxSize()+1))
	if err == nil && n > spec.maxSize() {
		return fetched{}, errTooLarge(spec)
	}
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return fetched{}, fmt.Errorf("write the new kelp in %s: the disk is full: free space there and create the Upgrade again; nothing was swapped", dir)
		}
		return fetched{}, fmt.Errorf("write the new kelp in %s: %w; nothing was swapped", dir, err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); !strings.EqualFold(got, spec.SHA256) {
		return fetched{}, fmt.Errorf("the new kelp from %s has the sha256 %s, not spec.sha256 %s: nothing was swapped; check the file and the Upgrade's checksum", source(spec), got, strings.ToLower(spec.SHA256))
	}
	if err := f.Chmod(0o755); err != nil {
		return fetched{}, err
	}
	if err := f.Sync(); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return fetched{}, fmt.Errorf("write the new kelp in %s: the disk is full: free space there and create the Upgrade again; nothing was swapped", dir)
		}
		return fetched{}, fmt.Errorf("sync the new kelp %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return fetched{}, fmt.Errorf("write the new kelp %s: %w", f.Name(), err)
	}
	got, err := versionOf(ctx, f.Name())
	if err != nil {
		return fetched{}, err
	}
	got.Path = f.Name()
	ok = true
	return got, nil
}

func errTooLarge(spec Spec) error {
	return fmt.Errorf("the new kelp from %s is more than spec.maxSize %s: nothing was swapped; check the source, or raise spec.maxSize if the binary is that large", source(spec), spec.MaxSize)
}

// source names where spec's kelp comes from, for messages.
func source(spec Spec) string {
	if spec.URL != "" {
		return spec.URL
	}
	return spec.Path
}

// open opens spec's kelp: a GET of its URL, or its file in upgrades.
func open(ctx context.Context, spec Spec, upgrades string) (io.ReadCloser, error) {
	if spec.URL == "" {
		path, err := ResolvePath(upgrades, spec.Path)
		if err != nil {
			return nil, err
		}
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no new kelp at %s on this node: copy it there on every node before the Upgrade", path)
		}
		if err != nil {
			return nil, fmt.Errorf("open the new kelp: %w", err)
		}
		return f, nil
	}
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, spec.URL, nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("spec.url %s: %w", spec.URL, err)
	}
	resp, err := downloadClient(http.DefaultTransport).Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("fetch the new kelp from %s: %w: check that this node reaches it", spec.URL, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("fetch the new kelp from %s: %s", spec.URL, resp.Status)
	}
	if resp.ContentLength > spec.maxSize() {
		resp.Body.Close()
		cancel()
		return nil, errTooLarge(spec)
	}
	return cancelOnClose{resp.Body, cancel}, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error { defer c.cancel(); return c.ReadCloser.Close() }

// versionOf runs path --version, which must exit 0 and say which kelp and
// Kubernetes it is.
func versionOf(ctx context.Context, path string) (fetched, error) {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").CombinedOutput()
	first, _, _ := strings.Cut(string(bytes.TrimSpace(out)), "\n")
	if err != nil {
		return fetched{}, fmt.Errorf("the new kelp does not run here (--version: %v, %q): is it built for this machine (amd64, arm64)? nothing was swapped", err, first)
	}
	got := fetched{Kelp: first}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "kubernetes "); ok {
			got.Kubernetes = strings.TrimSpace(v)
		}
	}
	if !strings.HasPrefix(first, "kelp ") || !strings.HasPrefix(got.Kubernetes, "v1.") {
		return fetched{}, fmt.Errorf("the new kelp's --version says %q, not which kelp and Kubernetes it is: is it a kelp? nothing was swapped", first)
	}
	return got, nil
}

// checkNotOlder refuses a kelp whose Kubernetes minor is older than
// running's: the apiserver cannot read what a newer one stored.
func checkNotOlder(newKubernetes, running string) error {
	if version.NewerMinor(running, newKubernetes) {
		return fmt.Errorf("the new kelp runs Kubernetes %s, an older minor than %s here: the apiserver cannot read what a newer one stored; upgrade to a kelp with Kubernetes %s or newer", newKubernetes, running, running)
	}
	return nil
}

// fileSHA256 is the sha256 of the file at path, in hex.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// downloadClient fetches a new kelp through rt. It follows redirects, as
// Go's client does, but never from https to http: the sha256 would still
// refuse a changed binary, but what https was asked for (nobody on the
// way sees or answers the fetch) would be gone.
func downloadClient(rt http.RoundTripper) *http.Client {
	return &http.Client{Transport: rt, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		if via[len(via)-1].URL.Scheme == "https" && req.URL.Scheme != "https" {
			return fmt.Errorf("refused: a redirect from https to http (%s): give spec.url the https address the file is served at", req.URL.Redacted())
		}
		return nil
	}}
}
