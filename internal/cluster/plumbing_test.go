package cluster

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/machine"
)

// TestMachineSpec: what `kelp cluster machine make` takes, and what it
// refuses before it makes anything: names and paths that would break (or
// inject into) the shell script that sets a machine up.
func TestMachineSpec(t *testing.T) {
	for _, tc := range []struct {
		name, prefix     string
		network, private []string
		want             map[string]string // Private; nil: an error
		wantPrefix       string
	}{
		{name: "server", want: map[string]string{}, wantPrefix: "kelp-machine-server-"},
		{name: "agent-1", prefix: "kelp-bench-agent-1-", private: []string{"/run/kelp", "/var/lib/kelp=/tmp/x/data"},
			want: map[string]string{"/run/kelp": "", "/var/lib/kelp": "/tmp/x/data"}, wantPrefix: "kelp-bench-agent-1-"},
		{name: "a", network: []string{"ip link add br0 type bridge", "ip addr add 10.0.0.1/24,x dev br0"}, want: map[string]string{}, wantPrefix: "kelp-machine-a-"},
		{name: "Server"},
		{name: "a;reboot"},
		{name: "-a"},
		{name: ""},
		{name: strings.Repeat("a", 64)},
		{name: "a", prefix: "a/b"},
		{name: "a", network: []string{" "}},
		{name: "a", private: []string{"run/kelp"}},
		{name: "a", private: []string{"/"}},
		{name: "a", private: []string{"/run/kelp/"}},
		{name: "a", private: []string{"/run/a b"}},
		{name: "a", private: []string{"/run/$(reboot)"}},
		{name: "a", private: []string{"/run/kelp=relative"}},
		{name: "a", private: []string{"/run/kelp", "/run/kelp=/tmp"}},
	} {
		spec, err := machineSpec(tc.name, tc.prefix, tc.network, tc.private)
		if tc.want == nil {
			if err == nil {
				t.Errorf("%q %q %q %q: no error", tc.name, tc.prefix, tc.network, tc.private)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q %q %q %q: %v", tc.name, tc.prefix, tc.network, tc.private, err)
			continue
		}
		if spec.Name != tc.name || spec.CgroupName != tc.wantPrefix || !spec.RandomCgroup || !slices.Equal(spec.Network, tc.network) || !maps.Equal(spec.Private, tc.want) {
			t.Errorf("%q %q %q %q: got %+v", tc.name, tc.prefix, tc.network, tc.private, spec)
		}
	}
}

// TestParseWire: the address must be a host's of its network, the gateway
// another address of the same, and the link an interface name.
func TestParseWire(t *testing.T) {
	for _, tc := range []struct {
		link, address, gateway string
		ok                     bool
	}{
		{"veth1", "10.99.0.3/24", "10.99.0.1", true},
		{"veth1", "10.99.0.2/31", "10.99.0.3", true},
		{"v", "fd00::2/64", "fd00::1", true},
		{"veth1", "10.99.0.0/24", "10.99.0.1", false}, // the network's own address
		{"veth1", "10.99.0.3", "10.99.0.1", false},    // no prefix length
		{"veth1", "10.99.0.3/24", "10.98.0.1", false}, // gateway outside
		{"veth1", "10.99.0.3/24", "10.99.0.3", false}, // gateway is the machine
		{"veth1", "10.99.0.3/24", "", false},          // no gateway
		{"", "10.99.0.3/24", "10.99.0.1", false},      // no link
		{"veth-too-long-16", "10.99.0.3/24", "10.99.0.1", false},
		{"veth 1", "10.99.0.3/24", "10.99.0.1", false},
		{"..", "10.99.0.3/24", "10.99.0.1", false},
	} {
		w, err := parseWire(tc.link, tc.address, tc.gateway)
		if (err == nil) != tc.ok {
			t.Errorf("%q %q %q: %v", tc.link, tc.address, tc.gateway, err)
			continue
		}
		if tc.ok && (w.link != tc.link || w.address.String() != tc.address || w.gateway.String() != tc.gateway) {
			t.Errorf("%q %q %q: got %+v", tc.link, tc.address, tc.gateway, w)
		}
	}
}

// TestCheckMachine: remove kills every process in a machine's cgroups, so
// a state file naming a hierarchy's root, or a cgroup outside it, is
// refused.
func TestCheckMachine(t *testing.T) {
	cgroups := func(mount, dir string) *machine.Cgroups {
		return &machine.Cgroups{Hierarchies: []machine.Hierarchy{{Mountpoint: mount, Dir: dir}}}
	}
	holder := machine.Process{Pid: 42, Start: 1}
	for _, tc := range []struct {
		m  machine.Machine
		ok bool
	}{
		{machine.Machine{Name: "a", Holder: holder, Cgroups: cgroups("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu/user/kelp-bench-a-1")}, true},
		{machine.Machine{Name: "a", Holder: holder, Cgroups: cgroups("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu")}, false},
		{machine.Machine{Name: "a", Holder: holder, Cgroups: cgroups("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu/..")}, false},
		{machine.Machine{Name: "a", Holder: holder, Cgroups: cgroups("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct/a")}, false},
		{machine.Machine{Name: "a", Holder: holder, Cgroups: cgroups("/sys/fs/cgroup/cpu", "/")}, false},
		{machine.Machine{Name: "a", Holder: holder, Cgroups: cgroups("", "a")}, false},
		{machine.Machine{Name: "a", Holder: holder, Cgroups: &machine.Cgroups{}}, false},
		{machine.Machine{Name: "a", Holder: holder}, false},
		{machine.Machine{Name: "a", Cgroups: cgroups("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu/a")}, false},
	} {
		if err := checkMachine(&tc.m); (err == nil) != tc.ok {
			t.Errorf("%+v %+v: %v", tc.m, tc.m.Cgroups, err)
		}
	}
}

// TestMachineLines: what `machine make` prints is read by a shell as
// NAME=VALUE lines, and its enter= words, evaluated, are the command that
// enters the machine, without the command to run there.
func TestMachineLines(t *testing.T) {
	m := &machine.Machine{Name: "a", Holder: machine.Process{Pid: 42, Start: 1}, Cgroups: &machine.Cgroups{Hierarchies: []machine.Hierarchy{
		{Mountpoint: "/sys/fs/cgroup/cpu,cpuacct", Options: "cpu,cpuacct", Dir: "/sys/fs/cgroup/cpu,cpuacct/kelp-a-1"},
		{Mountpoint: "/sys/fs/cgroup/unified", V2: true, Dir: "/sys/fs/cgroup/unified/kelp-a-1"},
	}}}
	lines := strings.Split(strings.TrimSuffix(machineLines(m), "\n"), "\n")
	if len(lines) != 3 || lines[0] != "holder=42" || lines[1] != "cgroups=/sys/fs/cgroup/cpu,cpuacct/kelp-a-1 /sys/fs/cgroup/unified/kelp-a-1" || !strings.HasPrefix(lines[2], "enter=") {
		t.Fatalf("got %q", lines)
	}
	want := m.Command("").Args
	want = want[:len(want)-1]
	if want[len(want)-1] != "--" || !strings.Contains(strings.Join(want, " "), "--target 42") {
		t.Fatalf("the machine's command is no longer nsenter ... --: %q", want)
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to read the words with")
	}
	out, err := exec.Command("sh", "-c", `eval "set -- $1"; for w; do printf '%s\n' "$w"; done`, "sh", strings.TrimPrefix(lines[2], "enter=")).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n"); !slices.Equal(got, want) {
		t.Errorf("sh reads %q\nwant %q", got, want)
	}
}

// TestShellWords: words with anything a shell would read are quoted, the
// rest left as they are.
func TestShellWords(t *testing.T) {
	words := []string{"plain", "", "a b", "it's", `$(x)`, "*", "a\"b", "/p/cpu,cpuacct", "--x=1"}
	got := shellWords(words)
	if want := `plain '' 'a b' 'it'\''s' '$(x)' '*' 'a"b' /p/cpu,cpuacct --x=1`; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// TestStateFiles: a state file is written once (a second make given the
// same file is refused before it makes anything), read back, and removed.
func TestStateFiles(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "m.json")
	if err := checkNewState(filepath.Join(dir, "missing", "m.json")); err == nil {
		t.Error("a state file in a missing directory is accepted")
	}
	if err := checkNewState(state); err != nil {
		t.Fatal(err)
	}
	n := machine.Network{Holder: machine.Process{Pid: 7, Start: 9}, Bridge: "lab0"}
	if err := writeNewState(state, n); err != nil {
		t.Fatal(err)
	}
	if err := checkNewState(state); err == nil {
		t.Error("an existing state file is accepted for a new machine")
	}
	if err := writeNewState(state, n); err == nil {
		t.Error("an existing state file is overwritten")
	}
	var got machine.Network
	if err := readState(state, &got); err != nil || got != n {
		t.Errorf("read back %+v, %v", got, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("left beside the state file: %v", entries)
	}
	if err := removeState(state); err != nil {
		t.Fatal(err)
	}
	if err := readState(state, &got); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after remove: %v", err)
	}
	if err := os.WriteFile(state, []byte("holder=7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := readState(state, &got); err == nil || !strings.Contains(err.Error(), "state file of kelp cluster machine or network make") {
		t.Errorf("a file that is no state file: %v", err)
	}
}
