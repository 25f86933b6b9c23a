package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/machine"
)

// DefaultRoot is where clusters keep their state unless --root says.
var DefaultRoot = filepath.Join(layout.DefaultDataDir, "clusters")

// stateFile is a cluster's record, in its directory under the root.
const stateFile = "cluster.json"

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// checkName says why name cannot name a cluster: it is part of its nodes'
// hostnames, a cgroup and a kubeconfig context.
func checkName(name string) error {
	if len(name) > 32 || !nameRE.MatchString(name) {
		return fmt.Errorf("cluster name %q: use at most 32 lower-case letters, digits and '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// State is what kelp knows of a cluster, kept in <root>/<name>/cluster.json:
// enough to start, stop and delete it from any later process, also after
// its processes were killed.
type State struct {
	Name      string   `json:"name"`
	Binary    string   `json:"binary"`  // the kelp its nodes run
	APIPort   uint16   `json:"apiPort"` // of the host's loopback, forwarded to the servers
	Datastore string   `json:"datastore"`
	Args      []string `json:"args,omitempty"` // for every kelp server and agent
	Ports     []Port   `json:"ports,omitempty"`
	// Cgroups are the cluster's own: its nodes' are below them, so
	// removing them kills and removes everything its nodes ran.
	Cgroups *machine.Cgroups `json:"cgroups,omitempty"`
	// Running: the cluster was started and not stopped since.
	Running   bool             `json:"running"`
	Network   *machine.Network `json:"network,omitempty"`
	Forwarder machine.Process  `json:"forwarder"`
	Nodes     []*Node          `json:"nodes"`
	// Kubeconfigs the cluster's context was merged into, to remove it
	// from on delete.
	MergedInto []string `json:"mergedInto,omitempty"`
}

// Node is one node of a cluster.
type Node struct {
	Name    string           `json:"name"`
	Role    string           `json:"role"` // "server" or "agent"
	IP      netip.Addr       `json:"ip"`
	Machine *machine.Machine `json:"machine,omitempty"`
	Kelp    machine.Process  `json:"kelp"`
}

// roles counts the cluster's servers and agents.
func (s *State) roles() (servers, agents int) {
	for _, n := range s.Nodes {
		if n.Role == "server" {
			servers++
		} else {
			agents++
		}
	}
	return servers, agents
}

// Port is a port published on the host's loopback: Host forwards to Node
// (a NodePort) on the cluster's first node.
type Port struct {
	Host uint16 `json:"host"`
	Node uint16 `json:"node"`
}

// paths are the files of a cluster under the root.
type paths struct{ dir string }

func (p paths) state() string      { return filepath.Join(p.dir, stateFile) }
func (p paths) token() string      { return filepath.Join(p.dir, "token") }
func (p paths) kubeconfig() string { return filepath.Join(p.dir, "kubeconfig") }
func (p paths) lock() string       { return filepath.Join(p.dir, "lock") }

// node is the directory of a node: what the node sees as its /var/lib/kelp
// (data), kubelet root and pod logs, and its kelp's log.
func (p paths) node(name string) nodePaths {
	return nodePaths{filepath.Join(p.dir, "nodes", name)}
}

// Inside a node, its data dir is the default one, and its config file,
// join token and admin kubeconfig are kept there too (KELP_CONFIG_FILE
// names the config file): /etc/kelp stays the machine's, and a node of a
// cluster made from a saved one finds everything where it was.
var (
	nodeConfigFile = filepath.Join(layout.DefaultDataDir, "cluster-node.yaml")
	nodeTokenFile  = filepath.Join(layout.DefaultDataDir, "cluster-token")
	nodeKubeconfig = filepath.Join(layout.DefaultDataDir, "admin.yaml")
)

type nodePaths struct{ dir string }

func (n nodePaths) data() string       { return filepath.Join(n.dir, "data") }
func (n nodePaths) kubeconfig() string { return n.inData(nodeKubeconfig) }
func (n nodePaths) config() string     { return n.inData(nodeConfigFile) }
func (n nodePaths) token() string      { return n.inData(nodeTokenFile) }
func (n nodePaths) log() string        { return filepath.Join(n.dir, "kelp.log") }
func (n nodePaths) images() string     { return layout.Agent(n.data()).ImagesDir }

// inData is where the host finds path, a path in the node's data dir as
// the node sees it.
func (n nodePaths) inData(path string) string {
	return filepath.Join(n.data(), strings.TrimPrefix(path, layout.DefaultDataDir))
}

// private maps the paths a node keeps state in to its own directories
// (see machine.Spec.Private): inside it, a node has the default paths of a
// kelp node, so `kelp crictl` or `kelp token` run there need no flags.
// Each exists on a machine that ran kelp; one that does not is made (the
// cluster's root is below the first).
func (n nodePaths) private() map[string]string {
	return map[string]string{
		layout.DefaultDataDir:   n.data(),
		layout.KubeletRoot:      filepath.Join(n.dir, "kubelet"),
		layout.PodLogsDir:       filepath.Join(n.dir, "log", "pods"),
		layout.ContainerLogsDir: filepath.Join(n.dir, "log", "containers"),
		layout.RunDir:           "",
		layout.NetnsDir:         "",
	}
}

// nodeEnv is the environment of what runs in a node: the host's without
// KELP_ settings and KUBECONFIG, which are the host's node's, and with
// the node's config file.
func nodeEnv() []string {
	env := []string{"KELP_CONFIG_FILE=" + nodeConfigFile}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KELP_") && !strings.HasPrefix(kv, "KUBECONFIG=") {
			env = append(env, kv)
		}
	}
	return env
}

// load reads the state of the cluster in dir. Delete and Start kill the
// processes and cgroups a state names, as root: a state another user
// could have written (its file's or directory's owner or mode, as
// checkStateOwner says) is refused.
func load(dir string) (*State, error) {
	path := filepath.Join(dir, stateFile)
	data, err := atomicfile.ReadRegular(path, 1<<20)
	if err != nil {
		return nil, err
	}
	if err := checkStateOwner(path); err != nil {
		return nil, err
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("read %s: %w (delete the cluster's directory by hand after `kelp cluster delete` if it stays unreadable)", path, err)
	}
	return &s, nil
}

// save writes the state of s in dir, durably.
func save(dir string, s *State) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, stateFile), append(data, '\n'), 0o600)
}

// list reads the state of every cluster under root, by name.
func list(root string) ([]*State, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*State
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		s, err := load(filepath.Join(root, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *State) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return out, nil
}

// lock takes the cluster's lock, so two commands never change one cluster
// at once; it is released when the process ends.
func lock(dir string) (*os.File, error) {
	f, err := os.OpenFile(paths{dir}.lock(), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another kelp cluster command works on cluster %s now: wait for it to finish", filepath.Base(dir))
	}
	return f, nil
}
