package snapshot

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// store is a place snapshots are kept: the snapshot directory (Dir) or an
// S3 folder (*remote). What is done to the snapshots of both, listing,
// deleting and pruning, is written once against it.
type store interface {
	// list returns the snapshots kept there, newest first.
	list(ctx context.Context) ([]Snapshot, error)
	// remove deletes the named snapshots with their sidecars.
	remove(ctx context.Context, names ...string) error
	// location is where the snapshot name is kept, for messages.
	location(name string) string
	// where names the place, for messages.
	where() string
}

var (
	_ store = Dir{}
	_ store = (*remote)(nil)
)

func (d Dir) list(context.Context) ([]Snapshot, error) { return d.List() }

func (d Dir) remove(_ context.Context, names ...string) error { return d.Delete(names...) }

func (d Dir) location(name string) string { return fileURL(filepath.Join(d.path(), name)) }

func (d Dir) where() string { return d.path() }

func (r *remote) where() string { return r.cfg.Location() }

// stores are the snapshot directory and, if r is not nil, r: S3 first, so
// that a failing S3 stops a change before anything local is changed.
func stores(d Dir, r *remote) []store {
	if r == nil {
		return []store{d}
	}
	return []store{r, d}
}

// prune keeps the retention newest snapshots of s that sel selects and
// deletes the others it selects, returning their names.
func prune(ctx context.Context, s store, retention int, sel selection) ([]string, error) {
	if retention < 1 {
		return nil, errRetention
	}
	list, err := s.list(ctx)
	if err != nil {
		return nil, err
	}
	gone := toPrune(list, retention, sel, time.Now())
	if err := s.remove(ctx, gone...); err != nil {
		return nil, err
	}
	return gone, nil
}

// listAll returns the snapshots of every store, newest first.
func listAll(ctx context.Context, all []store) ([]Snapshot, error) {
	var list []Snapshot
	for _, s := range all {
		some, err := s.list(ctx)
		if err != nil {
			return nil, err
		}
		list = append(list, some...)
	}
	sortNewestFirst(list)
	return list, nil
}

// removeEverywhere deletes the named snapshots from every store that has
// them. Every store is listed first, so that a name found nowhere, or a
// store that fails, stops it before anything is deleted.
func removeEverywhere(ctx context.Context, all []store, names []string) error {
	lists := make([][]Snapshot, len(all))
	for i, s := range all {
		var err error
		if lists[i], err = s.list(ctx); err != nil {
			return err
		}
	}
	found := make([][]string, len(all))
	for _, name := range names {
		if err := checkName(name); err != nil {
			return err
		}
		anywhere := false
		for i, list := range lists {
			if slices.ContainsFunc(list, func(s Snapshot) bool { return s.Name == name }) {
				found[i] = append(found[i], name)
				anywhere = true
			}
		}
		if !anywhere {
			var places []string
			for _, s := range all {
				places = append(places, s.where())
			}
			return fmt.Errorf("no snapshot named %s in %s: kelp snapshot ls shows them", name, strings.Join(places, " or "))
		}
	}
	for i, s := range all {
		if err := s.remove(ctx, found[i]...); err != nil {
			return err
		}
	}
	return nil
}

// PathOf is where the snapshot name is kept in d; PathOf("") is d's
// directory.
func (d Dir) PathOf(name string) string { return filepath.Join(d.path(), name) }
