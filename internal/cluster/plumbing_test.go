package cluster

import (
	"errors"
	"fmt"
	"io"
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
		{name: "a", prefix: "kelp-bench-b-"},
		{name: "a", prefix: "system.slice"},
		{name: "a", prefix: "kelp-machine-a"},
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

// TestForgedStates: remove kills a machine's holder and every process in
// its cgroups, and a network's holder, as root: a state file that names
// anything kelp did not make for it is refused, and nothing is killed or
// removed. The victims are this test's own: two sleeping processes, one
// of them listed in a directory tree made up as a cgroup.
func TestForgedStates(t *testing.T) {
	victim := func() machine.Process {
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		p, err := machine.ProcessOf(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	holder, inCgroup := victim(), victim()
	fake := t.TempDir()
	fakeDir := filepath.Join(fake, "kelp-machine-a-1")
	if err := os.MkdirAll(fakeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fakeDir, "cgroup.procs"), fmt.Appendf(nil, "%d\n", inCgroup.Pid), 0o644); err != nil {
		t.Fatal(err)
	}
	// Where machine make run from here would place machine a's cgroup.
	p, err := machine.BelowCaller()
	if err != nil {
		t.Fatal(err)
	}
	placed, err := machine.FindCgroups(p, ".")
	if err != nil || placed == nil {
		t.Fatalf("no cgroup hierarchy: %v", err)
	}
	real := *placed
	real.Hierarchies = slices.Clone(real.Hierarchies)
	for i, h := range real.Hierarchies {
		real.Hierarchies[i].Dir = filepath.Join(h.Dir, "kelp-machine-a-1")
	}
	other := func(dir string) *machine.Cgroups {
		c := real
		c.Hierarchies = slices.Clone(real.Hierarchies)
		c.Hierarchies[0].Dir = dir
		return &c
	}
	for _, tc := range []struct {
		name string
		m    machine.Machine
	}{
		{"a made-up hierarchy", machine.Machine{Name: "a", Holder: holder, Cgroups: &machine.Cgroups{Hierarchies: []machine.Hierarchy{{Mountpoint: fake, V2: true, Dir: fakeDir}}}}},
		{"a hierarchy's root", machine.Machine{Name: "a", Holder: holder, Cgroups: other(real.Hierarchies[0].Mountpoint)}},
		{"a cgroup of another name", machine.Machine{Name: "a", Holder: holder, Cgroups: other(filepath.Join(filepath.Dir(real.Hierarchies[0].Dir), "system.slice"))}},
		{"another machine's cgroup", machine.Machine{Name: "a", Holder: holder, Cgroups: other(filepath.Join(filepath.Dir(real.Hierarchies[0].Dir), "kelp-machine-b-1"))}},
		{"a cgroup deeper down", machine.Machine{Name: "a", Holder: holder, Cgroups: other(filepath.Join(filepath.Dir(real.Hierarchies[0].Dir), "x", "kelp-machine-a-1"))}},
		{"a holder that is not the machine's", machine.Machine{Name: "a", Holder: holder, Cgroups: &real}},
		{"no holder", machine.Machine{Name: "a", Cgroups: &real}},
		{"no cgroups", machine.Machine{Name: "a", Holder: holder}},
		{"a name kelp does not give", machine.Machine{Name: "a/..", Holder: holder, Cgroups: &real}},
	} {
		state := filepath.Join(t.TempDir(), "m.json")
		if err := writeNewState(state, tc.m); err != nil {
			t.Fatal(err)
		}
		if err := removeMachine(state, io.Discard); err == nil {
			t.Errorf("%s: removed", tc.name)
		}
		if _, err := os.Stat(state); err != nil {
			t.Errorf("%s: the state file is gone: %v", tc.name, err)
		}
	}
	for _, tc := range []struct {
		name string
		n    machine.Network
	}{
		{"a holder in this network namespace", machine.Network{Holder: holder, Bridge: "lab0"}},
		{"no holder", machine.Network{Bridge: "lab0"}},
		{"a bridge name kelp does not give", machine.Network{Holder: holder, Bridge: "lab0; reboot"}},
	} {
		state := filepath.Join(t.TempDir(), "n.json")
		if err := writeNewState(state, tc.n); err != nil {
			t.Fatal(err)
		}
		if err := removeNetwork(state, io.Discard); err == nil {
			t.Errorf("%s: removed", tc.name)
		}
	}
	// A state file others could have written is refused before it is read.
	state := filepath.Join(t.TempDir(), "m.json")
	if err := writeNewState(state, machine.Network{Holder: holder, Bridge: "lab0"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(state, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := removeNetwork(state, io.Discard); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("a state file writable by all: %v", err)
	}
	if err := os.Chmod(state, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(state), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := removeNetwork(state, io.Discard); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("a state file in a directory writable by all: %v", err)
	}

	for _, v := range []machine.Process{holder, inCgroup} {
		if !v.Alive() {
			t.Errorf("process %d was killed", v.Pid)
		}
	}
	if _, err := os.Stat(fakeDir); err != nil {
		t.Errorf("the made-up cgroup was removed: %v", err)
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
