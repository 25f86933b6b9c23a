package bootguard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/snapshot"
	"github.com/kelp-dev/kelp/internal/version"
)

// PreviousName is the file install.sh keeps the replaced kelp in, beside
// the new one.
const PreviousName = "kelp.previous"

// versionTimeout bounds `kelp.previous --version`.
const versionTimeout = 30 * time.Second

// Done is what Rollback did.
type Done struct {
	Upgrade Upgrade
	// Record is the guard's record after it.
	Record Record
	// Steps say what was done, in words for an operator.
	Steps []string
}

// Rollback rolls the node of dataDir back from the upgrade up, which is
// run by the kelp at binary, or was: the pre-upgrade snapshot is restored
// when a single server's datastore was opened by the new kelp,
// versions.json names the earlier kelp again, and kelp.previous beside
// binary takes binary's place in one rename. The datastore must be
// stopped. It checks first that kelp.previous runs; a failing check
// changes nothing.
func Rollback(dataDir, binary string, up Upgrade) (Done, error) {
	done := Done{Upgrade: up}
	previous, target := Paths(binary)
	said, err := runs(previous)
	if err != nil {
		return done, err
	}
	// The rename comes last; a directory it cannot be made in would
	// leave a restored datastore to the new kelp.
	probe, err := os.CreateTemp(filepath.Dir(target), ".kelp-rollback-*")
	if err != nil {
		return done, fmt.Errorf("%s cannot be put in place of %s (%w), so nothing was rolled back: install the earlier kelp yourself", previous, target, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	steps, err := restoreDatastore(dataDir, up)
	done.Steps = steps
	if err != nil {
		return done, err
	}
	versions := layout.Server(dataDir).Versions
	if _, ok, err := version.ReadDataDir(versions); err == nil && ok && up.From.Kelp != "" {
		if err := version.RecordDataDir(versions, up.From); err != nil {
			return done, err
		}
	}
	path := layout.BootGuard(dataDir)
	rec, err := load(path)
	if err != nil {
		return done, err
	}
	rec.Upgrade = nil
	if up.From.Kelp != "" {
		from := up.From
		rec.Ready = &from
	}
	rec.RolledBack = &RolledBack{From: up.From, To: up.To, At: time.Now().UTC(), Steps: append(slices.Clone(done.Steps), fmt.Sprintf("%s is the kelp that was %s again (%s)", target, PreviousName, said))}
	if err := rec.save(path); err != nil {
		return done, err
	}
	done.Record = rec
	if err := os.Rename(previous, target); err != nil {
		return done, fmt.Errorf("put %s in place of %s: %w", previous, target, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(target)); err != nil {
		return done, err
	}
	done.Steps = append(done.Steps, fmt.Sprintf("%s is the kelp that was %s again (%s)", target, PreviousName, said))
	return done, nil
}

// Paths are the previous kelp beside binary and the file it is put in
// place of: binary itself, or, when binary is kelp.previous (run by hand
// for the rollback command), kelp beside it.
func Paths(binary string) (previous, target string) {
	dir := filepath.Dir(binary)
	if filepath.Base(binary) == PreviousName {
		return binary, filepath.Join(dir, "kelp")
	}
	return filepath.Join(dir, PreviousName), binary
}

// runs checks that the kelp at path runs here, and returns the first line
// of its --version.
func runs(path string) (string, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("there is no previous kelp to go back to at %s (install.sh keeps the binary it replaces there): install the earlier kelp yourself", path)
	}
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("the previous kelp %s is not an executable file: install the earlier kelp yourself", path)
	}
	ctx, cancel := context.WithTimeout(context.Background(), versionTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").CombinedOutput()
	first, _, _ := strings.Cut(string(bytes.TrimSpace(out)), "\n")
	if err != nil || !strings.HasPrefix(first, "kelp ") {
		return "", fmt.Errorf("the previous kelp %s does not run here (%s --version: %v %q), so nothing was rolled back: install the earlier kelp yourself", path, path, err, first)
	}
	return first, nil
}

// keptWritten says that the datastore is kept because the new kelp's
// apiserver took w, and how to restore the snapshot s by hand.
func keptWritten(w Write, s Snapshot) string {
	how := "kelp snapshot restore " + s.Name
	if s.Datastore == datastore.KindEtcd {
		how = "kelp server --cluster-reset --cluster-reset-restore-path " + s.Path
	}
	return fmt.Sprintf("the new kelp's apiserver took writes from clients other than kelp during its trial (the first: %s by %s at %s), which restoring the snapshot taken before the upgrade would undo: "+
		"the datastore is kept as the new kelp left it, for the earlier kelp to run on; to go back to the data of before the upgrade instead, stop kelp and run %s",
		w.What, w.Who, w.At.Format(time.RFC3339), how)
}

// restoreDatastore restores the snapshot taken before up, when up opened
// the datastore of a single server, and says what it did.
func restoreDatastore(dataDir string, up Upgrade) ([]string, error) {
	s := up.Snapshot
	switch {
	case !up.Touched && datastore.LocalKind(dataDir) == "":
		// An agent: no datastore.
		return nil, nil
	case !up.Touched:
		return []string{"the new kelp had not opened the datastore, which is left as it was"}, nil
	case up.Shared:
		return []string{"the datastore is shared with other servers, which run the earlier kelp: it is left to them"}, nil
	case s == nil:
		return []string{"the new kelp opened the datastore before a snapshot could be taken (see the log of its first start); the datastore is left as it is"}, nil
	case up.Written != nil:
		return []string{keptWritten(*up.Written, *s)}, nil
	}
	d := snapshot.Dir{DataDir: dataDir, Path: filepath.Dir(s.Path)}
	res, err := d.Restore(s.Path, snapshot.Target{Kind: s.Datastore, Member: datastore.EtcdMember{Name: s.Member, AdvertiseIP: s.AdvertiseIP}})
	if err != nil {
		return nil, fmt.Errorf("restore the snapshot taken before the upgrade, %s: %w; nothing was rolled back", s.Path, err)
	}
	what, used := "SQLite datastore", "database"
	if s.Datastore == datastore.KindEtcd {
		what, used = "embedded etcd", "member data"
	}
	step := fmt.Sprintf("restored the %s from the snapshot taken before the upgrade, %s", what, s.Name)
	if res.Backup != "" {
		step += fmt.Sprintf(" (the %s the new kelp used is kept as %s)", used, res.Backup)
	}
	return []string{step}, nil
}
