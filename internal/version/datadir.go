package version

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// Ran is which kelp and Kubernetes last ran a server's data dir.
type Ran struct {
	Kelp       string `json:"kelp"`
	Kubernetes string `json:"kubernetes"`
}

// Kubernetes is the version of the Kubernetes components built in, e.g.
// v1.36.3; "" when the build has no module information.
func Kubernetes() string { return modules()["k8s.io/kubernetes"] }

// CheckDataDir refuses a data dir that a kelp with a newer Kubernetes
// minor ran last: its apiserver may have stored objects in versions this
// one cannot read, and Kubernetes does not support going back. Otherwise it
// records this kelp as the last to run it. path is the data dir's record
// (layout.Server(d).Versions); an empty or cut-short record counts as none.
func CheckDataDir(path string, now Ran) error {
	var last Ran
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read %s: %w", path, err)
	case json.Unmarshal(data, &last) != nil:
		last = Ran{}
	}
	if NewerMinor(last.Kubernetes, now.Kubernetes) {
		return fmt.Errorf("this data dir was last run by kelp %s with Kubernetes %s; this kelp (%s) runs Kubernetes %s, which cannot read what a newer apiserver may have stored: "+
			"run kelp %s or newer (an install keeps the previous binary as kelp.previous), or restore a snapshot taken before the upgrade",
			last.Kelp, last.Kubernetes, now.Kelp, now.Kubernetes, last.Kelp)
	}
	if last == now {
		return nil
	}
	return RecordDataDir(path, now)
}

// NewerMinor says that Kubernetes version a (like v1.37.2) is of a newer
// minor than b; false when either is unknown.
func NewerMinor(a, b string) bool {
	return minor(a) > minor(b) && minor(b) > 0
}

// minor is the minor of a version like v1.36.3; 0 when unknown.
func minor(v string) int {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 || parts[0] != "1" {
		return 0
	}
	n, err := strconv.Atoi(parts[1])
	if err != nil {
		return 0
	}
	return n
}

// Current is this kelp and the Kubernetes it runs.
func Current() Ran { return Ran{Kelp: Version, Kubernetes: Kubernetes()} }

// Upgrade says that going from a to b is an upgrade (or a downgrade): the
// kelp version or the Kubernetes minor differs. A kelp that is not known
// differs from every other.
func Upgrade(a, b Ran) bool {
	return a.Kelp != b.Kelp || minor(a.Kubernetes) != minor(b.Kubernetes)
}

// ReadDataDir returns the record CheckDataDir keeps at path; ok is false
// when there is none, or it is cut short.
func ReadDataDir(path string) (r Ran, ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Ran{}, false, nil
	}
	if err != nil {
		return Ran{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	if json.Unmarshal(data, &r) != nil || r.Kelp == "" {
		return Ran{}, false, nil
	}
	return r, true, nil
}

// RecordDataDir records r as the last kelp to run the data dir whose
// record is at path: a rollback puts back the kelp it returns to, which
// CheckDataDir would otherwise refuse after a newer Kubernetes minor.
func RecordDataDir(path string, r Ran) error {
	record, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(record, '\n'), 0o600)
}
