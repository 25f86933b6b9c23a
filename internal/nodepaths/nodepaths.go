// Package nodepaths decides, and records in the data dir, what a node has
// of its machine outside its data dir that two nodes on one machine must
// not share: the cgroup parent of its pods and its pod log directory.
//
// The node of the default data dir keeps the places users and log
// shippers expect: pods under /kubepods (kubepods.slice with systemd's
// cgroup driver) and logs in /var/log/pods. A node of another data dir
// puts its pods under /kelp_<hash of its data dir>/kubepods and its logs
// in <data-dir>/agent/pod-logs. A node records what it uses the first
// time it starts and keeps it: kelp killall, of this or a later version,
// reads the record instead of deriving the paths again.
package nodepaths

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/layout"
)

// Paths are a node's places on the machine outside its data dir.
type Paths struct {
	// CgroupRoot is the kubelet's cgroupRoot, in cgroupfs form: "/" or
	// "/kelp_<hash>". The kubelet puts its pods below it in kubepods
	// (<root>-kubepods.slice with systemd's driver).
	CgroupRoot string `json:"cgroupRoot"`
	// PodLogsDir is the kubelet's podLogsDir.
	PodLogsDir string `json:"podLogsDir"`
}

// maxRecord is the most a record is read of; kelp writes a hundred bytes.
const maxRecord = 64 << 10

// Derive returns the paths of a new node with dataDir (absolute).
func Derive(dataDir string) Paths {
	dataDir = filepath.Clean(dataDir)
	if dataDir == layout.DefaultDataDir {
		return Legacy()
	}
	sum := sha256.Sum256([]byte(dataDir))
	// Without a '-': systemd's cgroup driver reads one as a level of
	// slices (kelp_<hash>.slice/kelp_<hash>-kubepods.slice).
	return Paths{CgroupRoot: "/kelp_" + hex.EncodeToString(sum[:6]), PodLogsDir: layout.Agent(dataDir).PodLogs}
}

// Legacy returns the paths every node used before kelp recorded them:
// the machine's kubepods and /var/log/pods.
func Legacy() Paths {
	return Paths{CgroupRoot: "/", PodLogsDir: layout.PodLogsDir}
}

// Ensure returns the paths of the node with dataDir (absolute): those it
// recorded, else the paths of an earlier kelp if the node ran before
// (its pods live there), else Derive's; it records them when they were
// not. kept tells that the node keeps the machine's paths of an earlier
// kelp although its data dir is not the default.
func Ensure(dataDir string) (p Paths, kept bool, err error) {
	file := layout.Agent(dataDir).NodePaths
	p, recorded, err := read(file)
	if err != nil || recorded {
		return p, false, err
	}
	p = Derive(dataDir)
	if _, err := os.Stat(layout.Agent(dataDir).KubeletConfig); err == nil && p != Legacy() {
		p, kept = Legacy(), true
	}
	data, err := json.Marshal(p)
	if err != nil {
		return Paths{}, false, err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return Paths{}, false, fmt.Errorf("record the node's paths: %w", err)
	}
	if err := atomicfile.Write(file, append(data, '\n'), 0o600); err != nil {
		return Paths{}, false, fmt.Errorf("record the node's paths: %w", err)
	}
	return p, kept, nil
}

// Load returns the paths the node with dataDir recorded, or Derive's if
// it recorded none (it never ran, or ran before kelp recorded them, and
// then used Legacy's if its data dir is the default).
func Load(dataDir string) (Paths, error) {
	return LoadIn("/", dataDir)
}

// LoadIn is Load for a data dir seen from root: /proc/PID/root reads
// another mount namespace's.
func LoadIn(root, dataDir string) (Paths, error) {
	p, recorded, err := read(filepath.Join(root, layout.Agent(dataDir).NodePaths))
	if err != nil || recorded {
		return p, err
	}
	return Derive(dataDir), nil
}

func read(file string) (Paths, bool, error) {
	data, err := atomicfile.ReadRegular(file, maxRecord)
	if errors.Is(err, fs.ErrNotExist) {
		return Paths{}, false, nil
	}
	if err != nil {
		return Paths{}, false, fmt.Errorf("read the node's paths: %w", err)
	}
	var p Paths
	if err := json.Unmarshal(data, &p); err != nil {
		return Paths{}, false, fmt.Errorf("read the node's paths %s: %w (remove it after kelp killall to have them chosen again)", file, err)
	}
	if err := p.validate(); err != nil {
		return Paths{}, false, fmt.Errorf("read the node's paths %s: %w (remove it after kelp killall to have them chosen again)", file, err)
	}
	return p, true, nil
}

func (p Paths) validate() error {
	if !filepath.IsAbs(p.CgroupRoot) || filepath.Clean(p.CgroupRoot) != p.CgroupRoot || strings.Count(p.CgroupRoot, "/") != 1 || strings.Contains(p.CgroupRoot, "-") || strings.HasSuffix(p.CgroupRoot, ".slice") {
		return fmt.Errorf("cgroupRoot %q is neither / nor one cgroup below it named without '-' (which systemd's cgroup driver reads as a level of slices)", p.CgroupRoot)
	}
	if !filepath.IsAbs(p.PodLogsDir) || filepath.Clean(p.PodLogsDir) != p.PodLogsDir || p.PodLogsDir == "/" {
		return fmt.Errorf("podLogsDir %q is not a clean absolute directory below /", p.PodLogsDir)
	}
	return nil
}

// PodCgroups are the directories, relative to the root of a cgroup
// hierarchy, that hold every cgroup a kubelet with cgroup root root makes
// for its pods, in cgroupfs's and in systemd's spelling: kubepods and
// kubepods.slice for "/", else root itself (/kelp_<hash>, which holds
// kubepods) and its slice (kelp_<hash>.slice, which holds
// kelp_<hash>-kubepods.slice).
func PodCgroups(root string) []string {
	if root == "/" {
		return []string{"kubepods", "kubepods.slice"}
	}
	name := strings.TrimPrefix(root, "/")
	return []string{name, name + ".slice"}
}
