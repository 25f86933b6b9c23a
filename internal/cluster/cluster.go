package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/machine"
	"github.com/kelp-dev/kelp/internal/token"
)

// Options are what `kelp cluster create` is asked for.
type Options struct {
	Name      string
	Servers   int
	Agents    int
	Datastore string // "sqlite" or "etcd"; empty: sqlite for one server, etcd for more
	Images    []string
	Ports     []Port
	Args      []string // flags for every kelp server and agent
	Binary    string   // the kelp the nodes run
}

// check says what is wrong with o, and fills in the datastore. A cluster
// made from a snapshot takes its nodes and datastore from there.
func (o *Options) check(fromSnapshot bool) error {
	if err := checkName(o.Name); err != nil {
		return err
	}
	if fromSnapshot {
		if o.Servers != 1 || o.Agents != 0 || o.Datastore != "" || len(o.Images) > 0 || len(o.Args) > 0 {
			return errors.New("--from makes the saved cluster's nodes, with their images and flags: --servers, --agents, --datastore, --image and flags after -- do not go with it")
		}
		return nil
	}
	if o.Servers < 1 {
		return fmt.Errorf("--servers %d: a cluster needs at least one server", o.Servers)
	}
	if o.Agents < 0 {
		return fmt.Errorf("--agents %d: give 0 or more agents", o.Agents)
	}
	if o.Servers+o.Agents > 100 {
		return fmt.Errorf("%d nodes: kelp cluster makes at most 100 nodes on one machine", o.Servers+o.Agents)
	}
	switch o.Datastore {
	case "":
		o.Datastore = "sqlite"
		if o.Servers > 1 {
			o.Datastore = "etcd"
		}
	case "sqlite":
		if o.Servers > 1 {
			return fmt.Errorf("--datastore sqlite takes one server, not %d: use --datastore etcd for a control plane of several servers", o.Servers)
		}
	case "etcd":
	default:
		return fmt.Errorf("--datastore %q: use sqlite or etcd", o.Datastore)
	}
	for _, img := range o.Images {
		if _, err := imageFiles(img); err != nil {
			return err
		}
	}
	return nil
}

// nodes names the nodes of a cluster of o, servers first, and gives them
// their addresses. The names are the same in every cluster, which are
// told apart by their context, so a cluster made from a saved one keeps
// its nodes.
func (o *Options) nodes() []*Node {
	var nodes []*Node
	ip := nodeNet.Addr().Next() // .1 is the gateway
	for i := 1; i <= o.Servers; i++ {
		ip = ip.Next()
		nodes = append(nodes, &Node{Name: fmt.Sprintf("server-%d", i), Role: "server", IP: ip})
	}
	for i := 1; i <= o.Agents; i++ {
		ip = ip.Next()
		nodes = append(nodes, &Node{Name: fmt.Sprintf("agent-%d", i), Role: "agent", IP: ip})
	}
	return nodes
}

// CheckHost says why this host cannot run a cluster's nodes: kelp cluster
// runs as root, with the kernel's namespaces and the tools it makes them
// with. proc is where procfs is mounted.
func CheckHost(proc string) error {
	if os.Geteuid() != 0 {
		return errors.New("kelp cluster must run as root: it makes network, mount and cgroup namespaces and cgroups for its nodes (run it with sudo)")
	}
	for _, ns := range []string{"net", "mnt", "cgroup", "uts"} {
		if _, err := os.Stat(filepath.Join(proc, "self", "ns", ns)); err != nil {
			return fmt.Errorf("this kernel has no %s namespaces (%v): kelp cluster needs network, mount, cgroup (Linux 4.6 or newer) and UTS namespaces", ns, err)
		}
	}
	return machine.CheckTools()
}

// Create makes cluster o under root, or from the saved cluster from if
// set, and starts it. It returns once every node's kelp runs; Wait waits
// for them to be Ready. A cluster it could not make or start is removed
// again, with everything made for it.
func Create(root string, o Options, from string) (err error) {
	if err := o.check(from != ""); err != nil {
		return err
	}
	var saved *State
	if from != "" {
		if saved, err = loadSnapshot(root, from); err != nil {
			return err
		}
	}
	dir, l, err := makeDir(root, o.Name)
	if err != nil {
		return err
	}
	s := &State{Name: o.Name, Binary: o.Binary, Datastore: o.Datastore, Args: o.Args, Ports: o.Ports, Nodes: o.nodes()}
	if saved != nil {
		s.Datastore, s.Args, s.Nodes = saved.Datastore, saved.Args, nil
		for _, n := range saved.Nodes {
			s.Nodes = append(s.Nodes, &Node{Name: n.Name, Role: n.Role, IP: n.IP})
		}
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, teardown(s), os.RemoveAll(dir))
		}
		l.Close()
	}()
	if err := s.reservePorts(dir); err != nil {
		return err
	}
	if saved != nil {
		err = copyFromSnapshot(snapshotDir(root, from), dir, s)
	} else {
		err = prepareNodes(dir, s, o.Images)
	}
	if err != nil {
		return err
	}
	return start(dir, s)
}

// prepareNodes writes the token and each node's configuration of a new
// cluster, and puts the images into every node's airgap directory.
func prepareNodes(dir string, s *State, images []string) error {
	secret, err := token.Random()
	if err != nil {
		return err
	}
	if err := atomicfile.Write(paths{dir}.token(), []byte(secret+"\n"), 0o600); err != nil {
		return err
	}
	for _, n := range s.Nodes {
		if err := writeNodeConfig(dir, s, n, secret); err != nil {
			return err
		}
		for _, img := range images {
			if err := copyImages(img, nodeDir(dir, n).images()); err != nil {
				return err
			}
		}
	}
	return nil
}

// makeDir makes the directory of a new cluster under root and takes its
// lock.
func makeDir(root, name string) (string, *os.File, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", nil, err
	}
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o700); errors.Is(err, fs.ErrExist) {
		return "", nil, fmt.Errorf("a cluster named %s exists already (%s): delete it with `kelp cluster delete %s`, or choose another name", name, dir, name)
	} else if err != nil {
		return "", nil, err
	}
	l, err := lock(dir)
	if err != nil {
		return "", nil, err
	}
	return dir, l, nil
}

// reservePorts checks that the ports to publish are free on the host,
// before anything starts for a cluster that cannot be, picks a free one
// for the API, and saves the state.
func (s *State) reservePorts(dir string) error {
	for _, p := range s.Ports {
		if err := checkPortFree(p.Host); err != nil {
			return fmt.Errorf("--port %d:%d: %w", p.Host, p.Node, err)
		}
	}
	var err error
	if s.APIPort, err = freePort(); err != nil {
		return err
	}
	return save(dir, s)
}

// writeNodeConfig writes the node's config file and the token it joins
// with: inside its machine, `kelp server` or `kelp agent` needs no flag.
func writeNodeConfig(dir string, s *State, n *Node, secret string) error {
	np := nodeDir(dir, n)
	if err := os.MkdirAll(np.data(), 0o700); err != nil {
		return err
	}
	if err := atomicfile.Write(np.token(), []byte(secret+"\n"), 0o600); err != nil {
		return err
	}
	lines := []string{
		"# made by kelp cluster create; the node reads it as " + nodeConfigFile,
		"node-name: " + n.Name,
		"node-ip: " + n.IP.String(),
		"token-file: " + nodeTokenFile,
		// The nodes run the machine's kelp, which is not theirs to swap
		// for kelp.previous when an upgraded node fails to start.
		"upgrade-attempts: 0",
	}
	if n.Role == "server" {
		lines = append(lines, "write-kubeconfig: "+nodeKubeconfig)
	}
	first := s.Nodes[0]
	switch {
	case n == first && s.Datastore == "etcd":
		lines = append(lines, "cluster-init: true")
	case n != first:
		lines = append(lines, "server: https://"+net.JoinHostPort(first.IP.String(), "6443"))
	}
	return atomicfile.Write(np.config(), []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// start makes what a stopped cluster lacks (its network, its cgroup, a
// machine per node) and starts kelp in every node, saving the state after
// each step, so delete finds whatever was made if start stops half way.
func start(dir string, s *State) error {
	if s.Running {
		return fmt.Errorf("cluster %s is running already", s.Name)
	}
	if _, err := os.Stat(s.Binary); err != nil {
		return fmt.Errorf("the kelp the cluster runs: %w", err)
	}
	if err := ensureInotify("/proc", len(s.Nodes), os.Stderr); err != nil {
		return fmt.Errorf("cluster %s: %w", s.Name, err)
	}
	if err := removeStaleCgroups(s.Name); err != nil {
		return err
	}
	cgroups, err := machine.NewCgroups(machine.AtRoot(), cgroupName(s.Name))
	if err != nil {
		return fmt.Errorf("cluster %s: %w", s.Name, err)
	}
	s.Cgroups, s.Running = cgroups, true
	if err := save(dir, s); err != nil {
		return err
	}
	if s.Network, err = machine.NewNetwork("br0", cgroups, machine.Detached); err != nil {
		return err
	}
	if err := save(dir, s); err != nil {
		return err
	}
	gateway := nodeNet.Addr().Next()
	if err := s.Network.AddAddress(netip.PrefixFrom(gateway, nodeNet.Bits())); err != nil {
		return err
	}
	for i, n := range s.Nodes {
		np := nodeDir(dir, n)
		n.Machine, err = machine.Make(machine.Spec{Name: n.Name, Private: np.private(), Cgroups: cgroups.Below()}, machine.Detached)
		if err != nil {
			return err
		}
		if err := save(dir, s); err != nil {
			return err
		}
		if err := s.Network.Wire(n.Machine, "veth"+strconv.Itoa(i+1), netip.PrefixFrom(n.IP, nodeNet.Bits()), gateway); err != nil {
			return err
		}
		if n.Kelp, err = startKelp(s.Binary, n, np, s.Args); err != nil {
			return err
		}
		if err := save(dir, s); err != nil {
			return err
		}
	}
	if s.Forwarder, err = startForwarder(s, cgroups); err != nil {
		return err
	}
	return save(dir, s)
}

// cgroupName names the cgroup of cluster name in every hierarchy.
func cgroupName(name string) string { return "kelp-cluster-" + name }

// removeStaleCgroups removes the cgroups a cluster of this name left when
// its record was lost (its directory removed by hand) and nothing runs in
// them any more; it refuses while processes of it still run.
func removeStaleCgroups(name string) error {
	stale, err := machine.FindCgroups(machine.AtRoot(), cgroupName(name))
	if err != nil || stale == nil {
		return err
	}
	if pids := stale.Pids(); len(pids) > 0 {
		return fmt.Errorf("processes of an earlier cluster %s still run (%v): `kelp cluster delete %s` stops them", name, pids, name)
	}
	return stale.Remove()
}

// startKelp starts the node's kelp in its machine, in a session of its
// own, logging to the node's kelp.log, in the node's environment.
func startKelp(binary string, n *Node, np nodePaths, args []string) (machine.Process, error) {
	log, err := os.OpenFile(np.log(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return machine.Process{}, err
	}
	defer log.Close()
	cmd := n.Machine.Command(binary, append([]string{n.Role}, args...)...)
	cmd.Stdout, cmd.Stderr, cmd.Env = log, log, nodeEnv()
	if err := machine.Detached(cmd); err != nil {
		return machine.Process{}, fmt.Errorf("start kelp %s on node %s: %w", n.Role, n.Name, err)
	}
	go func() { _ = cmd.Wait() }()
	return machine.ProcessOf(cmd.Process.Pid)
}

// Stop stops the cluster's nodes and removes their machines and network;
// their data stays for Start.
func Stop(root, name string) error {
	dir := filepath.Join(root, name)
	s, err := load(dir)
	if err != nil {
		return notFound(name, err)
	}
	l, err := lock(dir)
	if err != nil {
		return err
	}
	defer l.Close()
	if !s.Running {
		return nil
	}
	stopKelps(s)
	err = teardown(s)
	if e := save(dir, s); err == nil {
		err = e
	}
	return err
}

// stopKelps asks every node's kelp to stop, agents first, and waits up to
// 30 s for them all: servers that lose their agents first leave no node
// NotReady behind for long.
func stopKelps(s *State) {
	for _, n := range s.Nodes {
		if n.Kelp.Alive() {
			_ = syscall.Kill(n.Kelp.Pid, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range s.Nodes {
		for n.Kelp.Alive() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// teardown kills whatever the cluster still runs and removes its
// machines, network, forwarder and cgroups, whether or not the processes
// were killed before: every process of a node is in the cluster's cgroups,
// and its namespaces, mounts, interfaces and nftables go with the last of
// them.
func teardown(s *State) error {
	errs := []error{s.Forwarder.Kill()}
	if s.Cgroups != nil {
		errs = append(errs, s.Cgroups.Remove())
	}
	if s.Network != nil {
		errs = append(errs, s.Network.Remove())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, n := range s.Nodes {
		n.Machine, n.Kelp = nil, machine.Process{}
	}
	s.Cgroups, s.Network, s.Forwarder, s.Running = nil, nil, machine.Process{}, false
	return nil
}

// Start starts a stopped cluster with the data it had.
func Start(root, name string) (*State, error) {
	dir := filepath.Join(root, name)
	s, err := load(dir)
	if err != nil {
		return nil, notFound(name, err)
	}
	l, err := lock(dir)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if s.Running {
		if running(s) {
			return s, nil
		}
		// Its processes died (a reboot, a kill): clean up, then start.
		if err := teardown(s); err != nil {
			return nil, err
		}
	}
	for _, port := range s.hostPorts() {
		if err := checkPortFree(port); err != nil {
			return nil, err
		}
	}
	if err := start(dir, s); err != nil {
		// What did start is stopped again: a cluster is running or not.
		return nil, errors.Join(err, teardown(s), save(dir, s))
	}
	return s, nil
}

// hostPorts are the ports the cluster takes on the host's loopback.
func (s *State) hostPorts() []uint16 {
	ports := []uint16{s.APIPort}
	for _, p := range s.Ports {
		ports = append(ports, p.Host)
	}
	return ports
}

// running says whether every process of a started cluster still runs.
func running(s *State) bool {
	if !s.Running || s.Network == nil || !s.Network.Alive() {
		return false
	}
	for _, n := range s.Nodes {
		if n.Machine == nil || !n.Machine.Alive() || !n.Kelp.Alive() {
			return false
		}
	}
	return s.Forwarder.Alive()
}

// Delete removes the cluster: every process, namespace, cgroup, interface
// and file it made, the context merged into kubeconfigs too. A cluster
// that does not exist is no error: Delete says so on w.
func Delete(root, name string, w io.Writer) error {
	dir := filepath.Join(root, name)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		// Its record is gone; what ran in its cgroups goes too.
		stale, err := machine.FindCgroups(machine.AtRoot(), cgroupName(name))
		if err != nil {
			return err
		}
		if stale == nil {
			fmt.Fprintf(w, "there is no cluster %s under %s\n", name, root)
			return nil
		}
		if err := stale.Remove(); err != nil {
			return fmt.Errorf("delete what is left of cluster %s: %w", name, err)
		}
		fmt.Fprintf(w, "deleted what was left of cluster %s (its processes and cgroups; its record was gone)\n", name)
		return nil
	}
	// Wait for a command that is making or starting it: what it made is
	// in the state once it lets go.
	l, err := lockWait(dir, time.Minute)
	if err != nil {
		return err
	}
	defer l.Close()
	s, err := load(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if s != nil {
		if err := teardown(s); err != nil {
			return fmt.Errorf("delete cluster %s: %w", name, err)
		}
		for _, path := range s.MergedInto {
			if err := unmergeKubeconfig(path, s.Name); err != nil {
				fmt.Fprintf(w, "warning: %v\n", err)
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("delete cluster %s: %w", name, err)
	}
	fmt.Fprintf(w, "deleted cluster %s\n", name)
	return nil
}

func notFound(name string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("there is no cluster %s: `kelp cluster list` shows the clusters there are", name)
	}
	return err
}

// lockWait takes the cluster's lock, waiting up to timeout for another
// command to let go of it.
func lockWait(dir string, timeout time.Duration) (*os.File, error) {
	deadline := time.Now().Add(timeout)
	for {
		l, err := lock(dir)
		if err == nil || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Exec returns a command that runs args inside node of cluster name.
func Exec(root, name, node string, args []string) (*exec.Cmd, error) {
	s, err := load(filepath.Join(root, name))
	if err != nil {
		return nil, notFound(name, err)
	}
	for _, n := range s.Nodes {
		if n.Name == node {
			if n.Machine == nil || !n.Machine.Alive() {
				return nil, fmt.Errorf("node %s of cluster %s is not running: `kelp cluster start %s`", n.Name, name, name)
			}
			cmd := n.Machine.Command(args[0], args[1:]...)
			cmd.Env = nodeEnv()
			return cmd, nil
		}
	}
	return nil, fmt.Errorf("cluster %s has no node %s: its nodes are %s", name, node, nodeNames(s))
}

func nodeNames(s *State) string {
	var names []string
	for _, n := range s.Nodes {
		names = append(names, n.Name)
	}
	return strings.Join(names, ", ")
}

// waitCtx is ctx ending after timeout, or ctx when timeout is 0.
func waitCtx(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, timeout)
}
