package cluster

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// snapshotsDir holds the saved clusters under root; its name is no
// cluster's (names start with a letter or digit).
const snapshotsDir = ".snapshots"

func snapshotDir(root, snapshot string) string {
	return filepath.Join(root, snapshotsDir, snapshot)
}

// Save keeps a copy of cluster name as snapshot: its nodes' data
// (datastore, certificates, images, volumes) and configuration, taken
// while its nodes are stopped, so that Create can make clusters from it.
// A running cluster is stopped for the copy and started again; Save
// returns once its kelps run.
func Save(root, name, snapshot string) error {
	if err := checkName(snapshot); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	dir := filepath.Join(root, name)
	s, err := load(dir)
	if err != nil {
		return notFound(name, err)
	}
	dst := snapshotDir(root, snapshot)
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("a snapshot named %s exists already: `kelp cluster snapshots delete %s` first, or choose another name", snapshot, snapshot)
	}
	l, err := lock(dir)
	if err != nil {
		return err
	}
	defer l.Close()
	wasRunning := s.Running
	if wasRunning {
		stopKelps(s)
		err = teardown(s)
		if e := save(dir, s); err == nil {
			err = e
		}
		if err != nil {
			return err
		}
	}
	err = copySnapshot(dir, dst, s)
	if wasRunning {
		err = errors.Join(err, start(dir, s))
	}
	return err
}

// copySnapshot copies the stopped cluster in dir to dst, whole or not at
// all: a copy cut short is removed.
func copySnapshot(dir, dst string, s *State) (err error) {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	tmp := dst + ".part-" + time.Now().UTC().Format("20060102T150405")
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	for _, f := range []string{"nodes", "token"} {
		if err := copyTree(filepath.Join(dir, f), filepath.Join(tmp, f)); err != nil {
			return err
		}
	}
	saved := *s
	saved.MergedInto, saved.Ports = nil, nil
	if err := save(tmp, &saved); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// copyTree copies src to dst with everything in it as it is (modes,
// owners, links, the device files of overlay whiteouts), sharing the
// data blocks where the file system can (reflinks).
func copyTree(src, dst string) error {
	out, err := exec.Command("cp", "-a", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %v: %s", src, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// loadSnapshot reads the state of a saved cluster.
func loadSnapshot(root, snapshot string) (*State, error) {
	saved, err := load(snapshotDir(root, snapshot))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("there is no snapshot %s: `kelp cluster snapshots` lists them", snapshot)
	}
	return saved, err
}

// copyFromSnapshot copies the nodes and token of the saved cluster in src
// into the new cluster s in dir.
func copyFromSnapshot(src, dir string, s *State) error {
	for _, f := range []string{"nodes", "token"} {
		if err := copyTree(filepath.Join(src, f), filepath.Join(dir, f)); err != nil {
			return err
		}
	}
	// A node's log is its own cluster's.
	for _, n := range s.Nodes {
		if err := os.Remove(nodeDir(dir, n).log()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Snapshot is a saved cluster, as listed.
type Snapshot struct {
	Name    string
	From    string // the cluster it was saved from
	Nodes   int
	Created time.Time
}

// Snapshots lists the saved clusters under root.
func Snapshots(root string) ([]Snapshot, error) {
	entries, err := os.ReadDir(filepath.Join(root, snapshotsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Snapshot
	for _, e := range entries {
		if !e.IsDir() || strings.Contains(e.Name(), ".part-") {
			continue
		}
		s, err := load(filepath.Join(root, snapshotsDir, e.Name()))
		if err != nil {
			continue
		}
		info, _ := e.Info()
		out = append(out, Snapshot{Name: e.Name(), From: s.Name, Nodes: len(s.Nodes), Created: info.ModTime()})
	}
	return out, nil
}

// DeleteSnapshot removes a saved cluster; one that does not exist is no
// error, Delete says so on w.
func DeleteSnapshot(root, snapshot string, w io.Writer) error {
	if err := checkName(snapshot); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	dir := snapshotDir(root, snapshot)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(w, "there is no snapshot %s\n", snapshot)
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	_ = os.Remove(filepath.Dir(dir)) // once it holds no snapshot
	fmt.Fprintf(w, "deleted snapshot %s\n", snapshot)
	return nil
}
