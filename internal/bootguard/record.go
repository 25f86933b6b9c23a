package bootguard

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/version"
)

// Record is what the guard keeps in the data dir (layout.BootGuard).
type Record struct {
	// Ready is the kelp that last became ready on the data dir.
	Ready *version.Ran `json:"ready,omitempty"`
	// Upgrade is the kelp on trial: one other than Ready that has not
	// become ready yet.
	Upgrade *Upgrade `json:"upgrade,omitempty"`
	// RolledBack is the last rollback, kept for the node to report
	// (internal/fleet reads it with LastRollback).
	RolledBack *RolledBack `json:"rolledBack,omitempty"`
}

// RolledBack is what a rollback left behind.
type RolledBack struct {
	From version.Ran `json:"from"`
	To   version.Ran `json:"to"`
	At   time.Time   `json:"at"`
	// Reason is why the boot guard rolled back; empty when done by hand.
	Reason string   `json:"reason,omitempty"`
	Steps  []string `json:"steps,omitempty"`
}

// String says what the rollback did and why, plainly.
func (r RolledBack) String() string {
	s := fmt.Sprintf("rolled back from %s to %s", describe(r.To), describe(r.From))
	if r.Reason != "" {
		s += " because " + r.Reason
	} else {
		s += " by hand (kelp upgrade rollback)"
	}
	if len(r.Steps) > 0 {
		s += ": " + strings.Join(r.Steps, "; ")
	}
	return s
}

// LastRollback is the last rollback of the node of dataDir; nil when
// there was none.
func LastRollback(dataDir string) (*RolledBack, error) {
	rec, err := load(layout.BootGuard(dataDir))
	if err != nil {
		return nil, err
	}
	return rec.RolledBack, nil
}

// Upgrade is a kelp on trial.
type Upgrade struct {
	From version.Ran `json:"from"`
	To   version.Ran `json:"to"`
	// Starts counts the starts of To: each, but the one running, did not
	// become ready.
	Starts int       `json:"starts"`
	Began  time.Time `json:"began"`
	// Touched says that To opened the datastore, which it may then have
	// written in its own way.
	Touched bool `json:"touched,omitempty"`
	// Shared says that other servers share the datastore (embedded etcd
	// with other members, or an external one): a rollback leaves it to
	// them, as they still run the earlier kelp.
	Shared bool `json:"shared,omitempty"`
	// Snapshot is the one taken before To opened the datastore.
	Snapshot *Snapshot `json:"snapshot,omitempty"`
	// Written is the first write To's apiserver took from a client other
	// than kelp's own pieces: a rollback then keeps the datastore, which
	// a restore would take that write from.
	Written *Write `json:"written,omitempty"`
}

// Write is a write to the datastore by a client other than kelp's own.
type Write struct {
	Who  string    `json:"who"`
	What string    `json:"what"`
	At   time.Time `json:"at"`
}

// Snapshot is a snapshot of the datastore taken before an upgrade.
type Snapshot struct {
	Name string `json:"name"`
	// Path is its file.
	Path      string `json:"path"`
	Datastore string `json:"datastore"`
	// Member names the embedded etcd member that a restore makes.
	Member      string `json:"member,omitempty"`
	AdvertiseIP string `json:"advertiseIP,omitempty"`
}

// load reads the record at path; none is an empty one. A record that
// cannot be parsed (written by hand) counts as none.
func load(path string) (Record, error) {
	var r Record
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("read the boot guard's record %s: %w", path, err)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		log.WithError(err).Warnf("the boot guard's record %s cannot be read and is started anew", path)
		return Record{}, nil
	}
	return r, nil
}

func (r Record) save(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write the boot guard's record: %w", err)
	}
	return nil
}

// start is the record after a start of running, and whether the upgrade
// to running is due to be rolled back, its limit starts in a row having
// ended without becoming ready. before is the kelp that ran the data dir
// last when no kelp became ready under the guard (a server's
// versions.json, from a kelp without the guard); nil: none ran it. A limit
// of 0 counts, but never makes a rollback due.
func (r Record) start(running version.Ran, before *version.Ran, limit int, now time.Time) (Record, bool) {
	from := r.Ready
	if from == nil {
		from = before
	}
	up := r.Upgrade
	switch {
	case up != nil && up.To == running:
		c := *up
		up = &c
	case from != nil && version.Upgrade(*from, running):
		up = &Upgrade{From: *from, To: running, Began: now.UTC()}
	default:
		// Not an upgrade, or back to the kelp that was ready: whatever
		// was on trial is over.
		r.Upgrade = nil
		return r, false
	}
	r.Upgrade = up
	if limit > 0 && up.Starts >= limit {
		return r, true
	}
	up.Starts++
	return r, false
}

func jsonOf(r Record) (string, error) {
	b, err := json.Marshal(r)
	return string(b), err
}

// OnTrial says that an upgrade of the node of dataDir is on trial: the
// kelp that runs it has not become ready yet, and may still be rolled
// back.
func OnTrial(dataDir string) (bool, error) {
	rec, err := load(layout.BootGuard(dataDir))
	return rec.Upgrade != nil, err
}
