package killall

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/nodepaths"
)

const (
	hostNS  = "mnt:[4026531841]"
	otherNS = "mnt:[4026532000]" // a container's, or a test node's
	self    = 100
)

// kelp is a process of root's running the kelp binary at
// /usr/local/bin/kelp.
func kelp(pid, ppid int, args ...string) process {
	return process{pid: pid, ppid: ppid, mountNS: hostNS, exe: "/usr/local/bin/kelp", program: kelpProgram,
		cmdline: append([]string{"kelp"}, args...), cwd: "/root", root: true}
}

// containerd is the bundle's containerd at exe, started by root with
// config.
func containerd(pid, ppid int, exe, config string) process {
	return process{pid: pid, ppid: ppid, mountNS: hostNS, exe: exe, program: containerdProgram,
		cmdline: []string{exe, "--config", config}, cwd: "/", root: true}
}

// shim is a runc shim of root's from exe on the containerd socket address.
func shim(pid int, exe, address string) process {
	return process{pid: pid, ppid: 1, mountNS: hostNS, exe: exe,
		cmdline: []string{exe, "-namespace", "k8s.io", "-id", "abc", "-address", address}, root: true}
}

// user is p run by a user that is not root.
func user(p process) process {
	p.root = false
	return p
}

// container is a process of a container, in a mount namespace of its own.
func container(pid, ppid int) process {
	return process{pid: pid, ppid: ppid, mountNS: otherNS, exe: "/pause", cmdline: []string{"/pause"}}
}

func replaced(p process) process {
	p.exe += deleted
	return p
}

func withEnv(p process, env ...string) process {
	p.environ = env
	return p
}

func inNS(p process, ns string) process {
	p.mountNS, p.cgroupNS, p.netNS = ns, ns, ns
	return p
}

// withNetNS is p in network namespace ns.
func withNetNS(p process, ns string) process {
	p.netNS = ns
	return p
}

const otherNet = "net:[4026532111]"

// legacyDataDir is the data dir of a node that ran before nodes had
// cgroup roots and pod log dirs of their own: it uses the machine's.
const legacyDataDir = "/srv/kelp"

// testClassifier is the classifier of the node with dataDir, whose
// cgroup root and pod log dir are derived from it. Another node's are its
// own too, but the machine's for legacyDataDir or a data dir that cannot
// be told. A process in killall's mount namespace (hostNS) sees the
// directories killall does; one in another sees those of sameDirs.
func testClassifier(dataDir string, sameDirs map[int][]string) classifier {
	return classifier{
		dataDir: dataDir, root: fstest.MapFS{}, resolve: func(p string) string { return p },
		paths: nodepaths.Derive(dataDir),
		pathsOf: func(_ process, dir string) nodepaths.Paths {
			if dir == "" || dir == legacyDataDir {
				return nodepaths.Legacy()
			}
			return nodepaths.Derive(dir)
		},
		sameDir: func(p process, dir, own string) bool {
			if p.mountNS == hostNS {
				return dir == own
			}
			return dir == own && slices.Contains(sameDirs[p.pid], dir)
		},
	}
}

// inMountNS is p in mount namespace ns, in the machine's cgroup and
// network namespaces.
func inMountNS(p process, ns string) process {
	p.mountNS = ns
	return p
}

// machine is the process table every case starts from: init, kelp
// killall itself, and a user's `kelp kubectl get pods -w` in another
// terminal.
func machine(procs ...process) []process {
	return append([]process{
		{pid: 1, mountNS: hostNS, exe: "/usr/lib/systemd/systemd", cmdline: []string{"/sbin/init"}},
		kelp(self, 50, "killall", "--data-dir", "/var/lib/kelp"),
		kelp(60, 50, "kubectl", "get", "pods", "-w"),
		{pid: 50, ppid: 1, mountNS: hostNS, exe: "/usr/bin/bash", cmdline: []string{"-bash"}},
	}, procs...)
}

const (
	ownContainerd = "/var/lib/kelp/data/1f2e/bin/containerd"
	ownShim       = "/var/lib/kelp/data/1f2e/bin/containerd-shim-runc-v2"
)

func TestPlan(t *testing.T) {
	node := []process{
		kelp(200, 1, "server", "--data-dir", "/var/lib/kelp"),
		containerd(201, 200, ownContainerd, "/var/lib/kelp/agent/etc/containerd/config.toml"),
		shim(300, ownShim, "/run/kelp/containerd/containerd.sock"),
		container(301, 300),
		container(302, 301),
	}
	other := []process{
		kelp(500, 1, "agent", "--data-dir", "/srv/kelp", "--server", "https://10.0.0.1:6443"),
		containerd(501, 500, "/srv/kelp/data/9a9a/bin/containerd", "/srv/kelp/agent/etc/containerd/config.toml"),
		shim(502, "/srv/kelp/data/9a9a/bin/containerd-shim-runc-v2", "/run/kelp/containerd/containerd.sock"),
		container(503, 502),
	}
	for _, tc := range []struct {
		name       string
		dataDir    string
		procs      []process
		pods       []int
		files      fstest.MapFS
		resolve    map[string]string
		kill, rest []int // rest: others in the plan
		// keep is what the plan leaves to other nodes; nil: not checked.
		keep *shared
		// sameDirs are the machine's directories (of the kubelet root,
		// /run/kelp, /run/netns and pod logs) that a process in another
		// mount namespace sees as killall does.
		sameDirs map[int][]string
		err      string
	}{
		{
			name:    "the node, its containers and what is left in the pod cgroups",
			dataDir: "/var/lib/kelp",
			procs:   machine(append(node, container(700, 1), container(701, 700))...),
			pods:    []int{302, 700},
			kill:    []int{200, 201, 300, 301, 302, 700, 701},
		},
		{
			name:    "binaries replaced by an upgrade, old bundle removed",
			dataDir: "/var/lib/kelp",
			procs: machine(replaced(node[0]), replaced(node[1]), replaced(node[2]), node[3],
				// The same kelp, installed elsewhere.
				process{pid: 210, ppid: 1, mountNS: hostNS, exe: "/opt/kelp-1.2/kelp" + deleted, program: kelpProgram,
					cmdline: []string{"/opt/kelp-1.2/kelp", "agent", "-d=/var/lib/kelp"}, root: true}),
			kill: []int{200, 201, 210, 300, 301},
		},
		{
			name:    "the containerd kelp ran itself before an upgrade",
			dataDir: "/var/lib/kelp",
			procs: machine(node[0], kelp(201, 1, "containerd", "--config", "/var/lib/kelp/agent/etc/containerd/config.toml"),
				kelp(501, 1, "containerd", "--config", "/srv/kelp/agent/etc/containerd/config.toml")),
			kill: []int{200, 201},
			rest: []int{501},
		},
		{
			name:    "the machine's own containerd",
			dataDir: "/var/lib/kelp",
			procs: machine(process{pid: 400, ppid: 1, mountNS: hostNS, exe: "/usr/bin/containerd",
				program: "github.com/containerd/containerd/v2/cmd/containerd", cmdline: []string{"/usr/bin/containerd"}}),
		},
		{
			name:    "another data dir's node and its pods are left alone",
			dataDir: "/var/lib/kelp",
			procs:   machine(other...),
			pods:    []int{503},
			rest:    []int{501, 502},
		},
		{
			name:    "both: this node's processes only",
			dataDir: "/var/lib/kelp",
			procs:   machine(append(slices.Clone(node), other...)...),
			pods:    []int{302, 503},
			kill:    []int{200, 201, 300, 301, 302},
			rest:    []int{501, 502},
		},
		{
			name:    "a control plane of another data dir does not hold the machine",
			dataDir: "/var/lib/kelp",
			procs:   machine(kelp(510, 1, "server", "--disable-agent", "--data-dir=/tmp/cp")),
			pods:    []int{700},
			kill:    []int{700},
		},
		{
			name:    "a server of the data dir in another mount namespace (a test node)",
			dataDir: "/var/lib/kelp",
			procs:   machine(inNS(node[0], otherNS)),
		},
		{
			name:    "a node in another mount namespace with the machine's cgroups and network holds them",
			dataDir: "/var/lib/kelp",
			procs: machine(append(slices.Clone(node), inMountNS(other[0], otherNS), inMountNS(other[1], otherNS),
				inMountNS(other[2], otherNS))...),
			pods: []int{302, 503},
			kill: []int{200, 201, 300, 301, 302},
			rest: []int{501, 502},
		},
		{
			// The case seen on a machine: a node in a mount namespace of
			// its own, in the machine's cgroup namespace, from before
			// nodes had cgroup roots of their own: kubepods is its too.
			name:    "a node of an earlier kelp in another mount namespace and the machine's cgroups",
			dataDir: "/var/lib/kelp",
			procs: machine(withNetNS(inMountNS(other[1], otherNS), otherNet), withNetNS(inMountNS(other[2], otherNS), otherNet),
				withNetNS(inMountNS(container(503, 502), otherNS), otherNet)),
			pods: []int{503},
			rest: []int{501, 502},
			keep: &shared{cgroups: true},
		},
		{
			name:    "a node with its own cgroup root in another mount namespace and the machine's cgroups",
			dataDir: "/var/lib/kelp",
			procs: machine(append(slices.Clone(node),
				withNetNS(inMountNS(containerd(801, 800, "/srv/new/data/9a9a/bin/containerd", "/srv/new/agent/etc/containerd/config.toml"), otherNS), otherNet))...),
			pods: []int{302, 700},
			kill: []int{200, 201, 300, 301, 302, 700},
			rest: []int{801},
			keep: &shared{},
		},
		{
			name:    "a node in another mount namespace and this network namespace",
			dataDir: "/var/lib/kelp",
			procs: machine(append(slices.Clone(node),
				inMountNS(containerd(801, 800, "/srv/new/data/9a9a/bin/containerd", "/srv/new/agent/etc/containerd/config.toml"), otherNS))...),
			pods: []int{302},
			kill: []int{200, 201, 300, 301, 302},
			rest: []int{801},
			keep: &shared{network: true},
		},
		{
			// Its /run/kelp and pod logs are the machine's, not a tmpfs of
			// its own; its kubelet root is.
			name:    "a node in another mount namespace with some of the machine's directories",
			dataDir: "/var/lib/kelp",
			procs: machine(append(slices.Clone(node),
				inNS(containerd(801, 800, "/srv/new/data/9a9a/bin/containerd", "/srv/new/agent/etc/containerd/config.toml"), otherNS))...),
			sameDirs: map[int][]string{801: {"/run/kelp", "/var/log/pods"}},
			kill:     []int{200, 201, 300, 301, 302},
			rest:     []int{801},
			keep:     &shared{dirs: []string{"/run/kelp"}},
		},
		{
			name:    "a node that logs to this node's pod log dir",
			dataDir: "/var/lib/kelp",
			procs: machine(append(slices.Clone(node),
				inNS(containerd(501, 500, "/srv/kelp/data/9a9a/bin/containerd", "/srv/kelp/agent/etc/containerd/config.toml"), otherNS))...),
			sameDirs: map[int][]string{501: {"/var/log/pods"}},
			kill:     []int{200, 201, 300, 301, 302},
			rest:     []int{501},
			keep:     &shared{podLogs: true},
		},
		{
			name:    "a node in namespaces of its own (a test node) shares nothing",
			dataDir: "/var/lib/kelp",
			procs:   machine(append(slices.Clone(node), inNS(other[1], otherNS), inNS(other[2], otherNS), inNS(container(503, 502), otherNS))...),
			pods:    []int{302},
			kill:    []int{200, 201, 300, 301, 302},
			rest:    []int{501, 502},
			keep:    &shared{},
		},
		{
			// /run/kelp, the kubelet root and the network are the
			// machine's, the cgroups and pod logs its own.
			name:    "a node of another data dir in this mount namespace",
			dataDir: "/var/lib/kelp",
			procs: machine(append(slices.Clone(node),
				containerd(801, 800, "/srv/new/data/9a9a/bin/containerd", "/srv/new/agent/etc/containerd/config.toml"),
				shim(802, "/srv/new/data/9a9a/bin/containerd-shim-runc-v2", "/run/kelp/containerd/containerd.sock"))...),
			pods: []int{302, 700},
			kill: []int{200, 201, 300, 301, 302, 700},
			rest: []int{801, 802},
			keep: &shared{dirs: []string{"/run/kelp", "/run/netns", "/var/lib/kubelet"}, network: true},
		},
		{
			name:    "a node of this mount namespace whose data dir cannot be told uses the machine's",
			dataDir: "/var/lib/kelp",
			procs:   machine(append(slices.Clone(node), shim(802, "/opt/shims/containerd-shim-runc-v2", "/run/kelp/containerd/containerd.sock"))...),
			pods:    []int{302, 700},
			kill:    []int{200, 201, 300, 301, 302},
			rest:    []int{802},
			keep:    &shared{dirs: []string{"/run/kelp", "/run/netns", "/var/lib/kubelet"}, network: true, cgroups: true, podLogs: true},
		},
		{
			name:    "shims of the machine's own containerd",
			dataDir: "/var/lib/kelp",
			procs: machine(shim(600, "/usr/bin/containerd-shim-runc-v2", "/run/containerd/containerd.sock"),
				container(601, 600)),
		},
		{
			name:    "spellings of the data dir and of the flag",
			dataDir: "/var/lib/kelp",
			procs: machine(
				kelp(200, 1, "server", "--data-dir=/var/lib//kelp/"),
				kelp(201, 1, "agent", "-d", "/var/lib/kelp"),
				kelp(202, 1, "agent", "--d=/var/lib/kelp"),
				// Later flags win, as in urfave/cli.
				kelp(203, 1, "server", "--data-dir", "/srv/kelp", "--data-dir", "/var/lib/kelp"),
				kelp(204, 1, "server", "--data-dir", "/var/lib/kelp", "--data-dir", "/srv/kelp"),
				// kelp refuses a relative data dir, whatever its cwd.
				kelp(205, 1, "server", "--data-dir", "kelp"),
				// Not a node: flags of a tool that look alike.
				kelp(206, 1, "crictl", "--data-dir", "/var/lib/kelp"),
				kelp(207, 1, "token", "list", "-d", "/var/lib/kelp"),
			),
			kill: []int{200, 201, 202, 203},
		},
		{
			name:    "data dir from the environment, the config file and the default",
			dataDir: "/var/lib/kelp",
			procs: machine(
				withEnv(kelp(200, 1, "server"), "KELP_DATA_DIR=/var/lib/kelp", "KELP_DATA_DIR=/srv/kelp"),
				withEnv(kelp(201, 1, "server", "--data-dir", "/srv/kelp"), "KELP_DATA_DIR=/var/lib/kelp"),
				kelp(202, 1, "agent", "--config", "/etc/kelp/agent.yaml"),
				withEnv(kelp(203, 1, "agent"), "KELP_CONFIG_FILE=/etc/kelp/agent.yaml"),
				// The environment beats the file.
				withEnv(kelp(204, 1, "agent", "-c", "/etc/kelp/agent.yaml"), "KELP_DATA_DIR=/srv/kelp"),
				// Relative to the process's working directory.
				kelp(205, 1, "agent", "-c=etc/kelp.yaml"),
				// A drop-in overrides the file.
				kelp(206, 1, "server", "--config", "/etc/kelp/other.yaml"),
				// No data dir anywhere: the default.
				kelp(207, 1, "server", "--token", "x"),
			),
			files: fstest.MapFS{
				"etc/kelp/agent.yaml":                  {Data: []byte("server: https://10.0.0.1:6443\ndata-dir: /var/lib/kelp\n")},
				"root/etc/kelp.yaml":                   {Data: []byte("data-dir: /var/lib/kelp\n")},
				"etc/kelp/other.yaml":                  {Data: []byte("data-dir: /srv/kelp\n")},
				"etc/kelp/other.yaml.d/10-move.yaml":   {Data: []byte("data-dir: /var/lib/kelp\n")},
				"etc/kelp/other.yaml.d/20-labels.yaml": {Data: []byte("node-label: [a=b]\n")},
			},
			kill: []int{200, 202, 203, 205, 206, 207},
		},
		{
			name:    "the default config file moves the default data dir",
			dataDir: "/var/lib/kelp",
			procs:   machine(kelp(200, 1, "server")),
			files:   fstest.MapFS{"etc/kelp/config.yaml": {Data: []byte("data-dir: /srv/kelp\n")}},
		},
		{
			name:    "a server whose config file is gone is reported, not killed",
			dataDir: "/var/lib/kelp",
			procs:   machine(kelp(200, 1, "server", "--config", "/etc/kelp/gone.yaml"), node[1]),
			kill:    []int{201},
			err:     "kelp server (pid 200): config file /etc/kelp/gone.yaml",
		},
		{
			// A user's process is not a node's, whatever it says: killall
			// does not read the user's config file (it would be an error
			// here), kill it, or leave the machine to a user's fake shim.
			name:    "processes of users are nobody's",
			dataDir: "/var/lib/kelp",
			procs: machine(node[0], node[1],
				user(kelp(400, 1, "server", "--data-dir", "/var/lib/kelp")),
				user(kelp(401, 1, "server", "--config", "/tmp/fifo")),
				user(containerd(402, 1, ownContainerd, "/var/lib/kelp/agent/etc/containerd/config.toml")),
				user(containerd(403, 1, "/home/u/containerd", "/srv/kelp/agent/etc/containerd/config.toml")),
				user(shim(404, "/home/u/containerd-shim-runc-v2", "/run/kelp/containerd/containerd.sock")),
				user(kelp(405, 1, "containerd", "--config", "/srv/kelp/agent/etc/containerd/config.toml")),
			),
			pods: []int{700},
			kill: []int{200, 201, 700},
		},
		{
			name:    "a data dir reached through a symlink",
			dataDir: "/data/kelp", // killall's, resolved
			procs: machine(
				kelp(200, 1, "server", "--data-dir", "/var/lib/kelp"),
				containerd(201, 200, "/data/kelp/data/1f2e/bin/containerd", "/var/lib/kelp/agent/etc/containerd/config.toml"),
				// The kernel shows the file by its real path.
				shim(300, "/data/kelp/data/1f2e/bin/containerd-shim-runc-v2", "/run/kelp/containerd/containerd.sock"),
			),
			resolve: map[string]string{
				"/var/lib/kelp": "/data/kelp",
				"/var/lib/kelp/agent/etc/containerd/config.toml": "/data/kelp/agent/etc/containerd/config.toml",
			},
			kill: []int{200, 201, 300},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testClassifier(tc.dataDir, tc.sameDirs)
			c.root, c.resolve = tc.files, func(p string) string {
				if r, ok := tc.resolve[p]; ok {
					return r
				}
				return p
			}
			if c.root == nil {
				c.root = fstest.MapFS{}
			}
			got, err := c.plan(tc.procs, self, tc.pods)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("error %v, want %q", err, tc.err)
			}
			if !slices.Equal(got.kill, tc.kill) {
				t.Errorf("kill %v, want %v", got.kill, tc.kill)
			}
			if !slices.Equal(got.others, tc.rest) {
				t.Errorf("others %v, want %v", got.others, tc.rest)
			}
			if tc.keep != nil && !reflect.DeepEqual(got.keep, *tc.keep) {
				t.Errorf("keep %+v, want %+v", got.keep, *tc.keep)
			}
		})
	}
}

func TestPlanWithoutSelf(t *testing.T) {
	c := testClassifier("/var/lib/kelp", nil)
	procs := slices.DeleteFunc(machine(), func(p process) bool { return p.pid == self })
	if _, err := c.plan(procs, self, nil); err == nil {
		t.Error("a table without killall itself: no error")
	}
}

// TestNewClassifier: a relative --data-dir names the directory below the
// current one, and symlinks in it are resolved.
func TestNewClassifier(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "disk", "kelp")
	if err := os.MkdirAll(real, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("disk", "kelp"), filepath.Join(dir, "kelp")); err != nil {
		t.Fatal(err)
	}
	dir, err := filepath.EvalSymlinks(dir) // the temp dir may be below a link itself
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, given := range []string{"kelp", "./kelp/", filepath.Join(dir, "kelp"), filepath.Join(dir, "disk", "kelp")} {
		c, err := newClassifier(given)
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(dir, "disk", "kelp"); c.dataDir != want {
			t.Errorf("data dir %q: %q, want %q", given, c.dataDir, want)
		}
		p := kelp(200, 1, "server", "--data-dir", filepath.Join(dir, "kelp"))
		if o, err := c.ownerOf(p); o != thisNode || err != nil {
			t.Errorf("data dir %q: a server with --data-dir %s is %v, %v; want this node's", given, filepath.Join(dir, "kelp"), o, err)
		}
	}
}

func TestPodCgroups(t *testing.T) {
	mkdirs := func(t *testing.T, root string, dirs ...string) {
		for _, d := range dirs {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("v1", func(t *testing.T) {
		root := t.TempDir()
		mkdirs(t, root, "memory/kubepods/pod1", "cpu,cpuacct/kubepods", "systemd/kubepods.slice", "pids/user.slice/kelp-test-a-1/kubepods")
		want := []string{filepath.Join(root, "cpu,cpuacct/kubepods"), filepath.Join(root, "memory/kubepods"), filepath.Join(root, "systemd/kubepods.slice")}
		if got := podCgroups(root, "/"); !slices.Equal(got, want) {
			t.Errorf("podCgroups = %q, want %q", got, want)
		}
	})
	t.Run("unified", func(t *testing.T) {
		root := t.TempDir()
		mkdirs(t, root, "kubepods/pod1", "kelp-test-a-1/kubepods", "system.slice")
		if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		// A test node's kubepods is not this machine's.
		if got, want := podCgroups(root, "/"), []string{filepath.Join(root, "kubepods")}; !slices.Equal(got, want) {
			t.Errorf("podCgroups = %q, want %q", got, want)
		}
	})
	t.Run("a cgroup root of the node's own", func(t *testing.T) {
		root := t.TempDir()
		mkdirs(t, root, "memory/kubepods/pod1", "memory/kelp_0123456789ab/kubepods/pod2", "memory/kelp_ba9876543210/kubepods",
			"systemd/kelp_0123456789ab.slice/kelp_0123456789ab-kubepods.slice", "systemd/kubepods.slice")
		want := []string{filepath.Join(root, "memory/kelp_0123456789ab"), filepath.Join(root, "systemd/kelp_0123456789ab.slice")}
		if got := podCgroups(root, "/kelp_0123456789ab"); !slices.Equal(got, want) {
			t.Errorf("podCgroups = %q, want %q", got, want)
		}
	})
}

func TestDataDirOfOther(t *testing.T) {
	for _, tc := range []struct {
		p    process
		want string
	}{
		{containerd(1, 1, "/srv/kelp/data/9a9a/bin/containerd", "/srv/kelp/agent/etc/containerd/config.toml"), "/srv/kelp"},
		{containerd(1, 1, "/srv/kelp/data/9a9a/bin/containerd", "/srv/kelp//agent/etc/containerd/config.toml"), "/srv/kelp"},
		{containerd(1, 1, "/srv/kelp/data/9a9a/bin/containerd", "/etc/containerd/config.toml"), ""},
		{containerd(1, 1, "/srv/kelp/data/9a9a/bin/containerd", "agent/etc/containerd/config.toml"), ""},
		{kelp(1, 1, "containerd", "--config", "/srv/kelp/agent/etc/containerd/config.toml"), "/srv/kelp"},
		{shim(1, "/srv/kelp/data/9a9a/bin/containerd-shim-runc-v2", "/run/kelp/containerd/containerd.sock"), "/srv/kelp"},
		{replaced(shim(1, "/srv/kelp/data/9a9a/bin/containerd-shim-runc-v2", "/run/kelp/containerd/containerd.sock")), "/srv/kelp"},
		{shim(1, "/usr/bin/containerd-shim-runc-v2", "/run/kelp/containerd/containerd.sock"), ""},
	} {
		if got := (classifier{}).dataDirOfOther(tc.p); got != tc.want {
			t.Errorf("%q (%s): data dir %q, want %q", tc.p.cmdline, tc.p.exe, got, tc.want)
		}
	}
}

// TestEmptyRunDir: the RAM stores and kine sockets of servers of other
// data dirs stay in /run/kelp; this data dir's RAM store goes.
func TestEmptyRunDir(t *testing.T) {
	dir := t.TempDir()
	own, other := "ram/"+filepath.Base(layout.RAMStore("/var/lib/kelp")), "ram/"+filepath.Base(layout.RAMStore("/srv/cp"))
	for _, d := range []string{"containerd/io.containerd.runtime.v2.task", "cni/networks", own, other} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kine-0123.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := emptyDir(dir, keepOthersRun, filepath.Join(dir, own)); err != nil {
		t.Fatal(err)
	}
	var left []string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if rel, _ := filepath.Rel(dir, path); rel != "." {
			left = append(left, rel)
		}
		return nil
	})
	if want := []string{"kine-0123.sock", "ram", other}; !slices.Equal(left, want) {
		t.Errorf("left %q, want %q", left, want)
	}
}

// TestMain lets a test start a copy of the test binary that only sleeps:
// a process whose file can be replaced under it.
func TestMain(m *testing.M) {
	if os.Getenv("KILLALL_TEST_SLEEP") != "" {
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestReadReplacedBinary reads a process whose binary was replaced, as an
// upgrade does it: it is still known by its build info.
func TestReadReplacedBinary(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kelp")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "server", "--data-dir", "/var/lib/kelp")
	cmd.Env = append(os.Environ(), "KILLALL_TEST_SLEEP=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if err := os.WriteFile(bin+".new", data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}
	p, ok := readProcess(cmd.Process.Pid)
	if !ok {
		t.Fatal("the process is not in /proc")
	}
	info, _ := debug.ReadBuildInfo()
	if p.exe != bin+deleted || p.program != info.Path || p.ppid != os.Getpid() {
		t.Errorf("exe %q, program %q, parent %d; want %q, %q, %d", p.exe, p.program, p.ppid, bin+deleted, info.Path, os.Getpid())
	}
	if want := []string{bin, "server", "--data-dir", "/var/lib/kelp"}; !slices.Equal(p.cmdline, want) {
		t.Errorf("cmdline %q, want %q", p.cmdline, want)
	}
	if v, ok := getenv(p.environ, "KILLALL_TEST_SLEEP"); v != "1" || !ok {
		t.Errorf("environ %q has no KILLALL_TEST_SLEEP=1", p.environ)
	}
	if root := os.Getuid() == 0 && os.Geteuid() == 0; p.root != root {
		t.Errorf("root %v, want %v", p.root, root)
	}
	if own, _ := os.Readlink("/proc/self/ns/mnt"); p.mountNS != own {
		t.Errorf("mount namespace %q, want %q", p.mountNS, own)
	}
	if _, ok := readProcess(1 << 30); ok {
		t.Error("a process that does not exist was read")
	}
}

// TestPlanOnThisMachine reads the real process table: no process belongs
// to a data dir nothing uses.
func TestPlanOnThisMachine(t *testing.T) {
	c, err := newClassifier(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	procs, err := readProcesses()
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.plan(procs, os.Getpid(), nil)
	if err != nil || len(p.kill) > 0 {
		t.Errorf("plan kills %v (error %v), want nothing", p.kill, err)
	}
}

func TestRootOwned(t *testing.T) {
	status := func(uid string) []byte {
		return []byte("Name:\tkelp\nUmask:\t0022\nState:\tS (sleeping)\nPid:\t200\nPPid:\t1\n" +
			"Uid:\t" + uid + "\nGid:\t0\t0\t0\t0\nGroups:\t0\n")
	}
	for _, tc := range []struct {
		status []byte
		want   bool
	}{
		{status("0\t0\t0\t0"), true},
		{status("1000\t1000\t1000\t1000"), false},
		// A set-uid root program that a user started.
		{status("1000\t0\t0\t0"), false},
		{status("0\t1000\t1000\t1000"), false},
		{status("0\t0\t0\t1000"), false},
		{status("0"), false},
		{status(""), false},
		{[]byte("Name:\tkelp\nUidx:\t0\t0\t0\t0\n"), false},
		{nil, false},
	} {
		if got := rootOwned(tc.status); got != tc.want {
			t.Errorf("rootOwned(%q) = %v, want %v", tc.status, got, tc.want)
		}
	}
}

// TestConfigFileNotRegular: killall reads the config file a server of
// root's names on the machine's file system; one that is not a regular
// file, or too large, is refused at once, with an error that says so.
func TestConfigFileNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fifo, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	large := filepath.Join(dir, "large.yaml")
	if err := os.WriteFile(large, []byte("data-dir: "+strings.Repeat("x", maxConfigFile)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("data-dir: /srv/kelp\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dropIns := filepath.Join(dir, "dropins.yaml")
	if err := os.WriteFile(dropIns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dropIns+".d", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dropIns+".d", "10-fifo.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := newClassifier(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ config, err string }{
		{fifo, "not a regular file"},
		{filepath.Join(dir, "link"), "not a regular file"},
		{dropIns, "not a regular file"},
		{"/dev/null", "not a regular file"},
		{large, "larger than 1048576 bytes"},
		{good, ""},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := c.ownerOf(kelp(200, 1, "server", "--config", tc.config))
			done <- err
		}()
		select {
		case err := <-done:
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("config %s: error %v, want %q", tc.config, err, tc.err)
			}
		case <-time.After(time.Minute):
			// The goroutine stays stuck in open: the test binary ends.
			t.Fatalf("config %s: killall still reads it after a minute", tc.config)
		}
	}
}

// TestNewClassifierPaths: killall takes the node's cgroup root and pod
// log dir from its record; one it cannot read is reported, and the node
// is stopped all the same, with the paths derived from its data dir.
func TestNewClassifierPaths(t *testing.T) {
	dir := t.TempDir()
	record := layout.Agent(dir).NodePaths
	if err := os.MkdirAll(filepath.Dir(record), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, []byte(`{"cgroupRoot":"/","podLogsDir":"/var/log/pods"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := newClassifier(dir)
	if err != nil || c.pathsErr != nil || c.paths != nodepaths.Legacy() {
		t.Errorf("recorded: %+v, %v, %v; want %+v", c.paths, c.pathsErr, err, nodepaths.Legacy())
	}
	if err := os.WriteFile(record, []byte(`{"cgroupRoot":`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = newClassifier(dir)
	if err != nil || c.pathsErr == nil || !strings.Contains(c.pathsErr.Error(), record) || c.paths != nodepaths.Derive(c.dataDir) {
		t.Errorf("a broken record: %+v, %v, %v; want the derived paths and an error naming %s", c.paths, c.pathsErr, err, record)
	}
}
