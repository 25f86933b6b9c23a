package cluster_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/machine"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestMachinePlumbing drives the hidden commands that scripts/lib/bench.sh
// makes its nodes with, as the script does, on a host that is a test node
// of its own: a network and two machines wired to it that reach each
// other, a command run by the words `machine make` printed that keeps its
// pid and runs in the machine (its hostname, address, cgroups and private
// /run/kelp), bad input refused, and after remove nothing left: no holder,
// no cgroup, no state file.
func TestMachinePlumbing(t *testing.T) {
	host := testcluster.NewNode(t)
	kelp := func(args ...string) (string, error) {
		t.Helper()
		return host.RunKelp(time.Minute, append([]string{"cluster"}, args...)...)
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := kelp(args...)
		if err != nil {
			t.Fatalf("kelp cluster %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	lab := filepath.Join(host.Dir, "lab.json")
	must("network", "make", "--bridge", "lab0", "--state", lab)
	printed := map[string]map[string]string{}
	machines := map[string]machine.Machine{}
	for i, name := range []string{"a", "b"} {
		state := filepath.Join(host.Dir, name+".json")
		printed[name] = keyValues(must("machine", "make", "--name", name, "--state", state, "--private", "/run/kelp", "--cgroup-prefix", "kelp-plumbing-"+name+"-"))
		must("network", "wire", "--network", lab, "--machine", state, "--link", fmt.Sprintf("veth%d", i+1), "--address", fmt.Sprintf("10.99.0.%d/24", i+2), "--gateway", "10.99.0.1")
		var m machine.Machine
		if data, err := os.ReadFile(state); err != nil || json.Unmarshal(data, &m) != nil || !m.Alive() || printed[name]["holder"] != fmt.Sprint(m.Holder.Pid) {
			t.Fatalf("state of %s: %v %+v, printed %q", name, err, m, printed[name])
		}
		machines[name] = m
	}
	if out, err := kelp("machine", "make", "--name", "c", "--state", filepath.Join(host.Dir, "a.json")); err == nil || !strings.Contains(out, "exists") {
		t.Errorf("make with the state file of a running machine: %v\n%s", err, out)
	}
	if out, err := kelp("network", "wire", "--network", lab, "--machine", filepath.Join(host.Dir, "b.json"), "--link", "veth3", "--address", "10.99.0.0/24", "--gateway", "10.99.0.1"); err == nil || !strings.Contains(out, "network's own address") {
		t.Errorf("wire to the network's address: %v\n%s", err, out)
	}

	// a listens, b dials it through the network.
	var ln net.Listener
	if err := machine.InNetnsOf(machines["a"].Holder.Pid, func() (err error) {
		ln, err = net.Listen("tcp", "10.99.0.2:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		got <- line
	}()

	// Entered as bench.sh enters a node (enter_node, launch): the pid bash
	// sees is the command's own.
	out := filepath.Join(host.Dir, "b.out")
	script := `eval "enter=($1)"
"${enter[@]}" bash -c 'echo $$; hostname; ip -4 -o addr show eth0; cat /proc/self/cgroup; mkdir /run/kelp/b; echo hello >/dev/tcp/10.99.0.2/'"$3" >"$2" & pid=$!
wait $pid && echo "$pid" && cat "$2"`
	result, err := host.Run(time.Minute, host.Command("bash", "-c", script, "bash", printed["b"]["enter"], out, fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)))
	if err != nil {
		t.Fatalf("in machine b: %v\n%s", err, result)
	}
	lines := strings.Split(strings.TrimSpace(result), "\n")
	if len(lines) < 5 || lines[0] != lines[1] || lines[2] != "b" || !strings.Contains(lines[3], "10.99.0.3/24") {
		t.Errorf("in machine b (pid as bash saw it, as the command saw it, hostname, eth0, cgroups):\n%s", result)
	}
	for _, cg := range lines[4:] {
		// Its cgroup namespace's root, or the v2 leaf below it.
		if !strings.HasSuffix(cg, ":/") && !strings.HasSuffix(cg, ":/"+machine.V2Leaf) {
			t.Errorf("machine b's command is in cgroup %s, not the machine's", cg)
		}
	}
	select {
	case line := <-got:
		if line != "hello\n" {
			t.Errorf("a got %q from b", line)
		}
	case <-time.After(30 * time.Second):
		t.Error("a got nothing from b")
	}
	if _, err := host.Run(time.Minute, host.Command("test", "!", "-e", "/run/kelp/b")); err != nil {
		t.Error("machine b's /run/kelp is the host's")
	}

	for _, name := range []string{"a", "b"} {
		state := filepath.Join(host.Dir, name+".json")
		must("machine", "remove", "--state", state)
		if m := machines[name]; m.Alive() {
			t.Errorf("machine %s's holder %d runs after remove", name, m.Holder.Pid)
		}
		dirs := strings.Fields(printed[name]["cgroups"])
		if len(dirs) == 0 {
			t.Fatalf("machine %s printed no cgroups", name)
		}
		if out, err := host.Run(time.Minute, host.Command("sh", append([]string{"-c", `for d; do [ ! -e "$d" ] || echo "$d"; done; [ ! -e "$0" ] || echo "$0"`, state}, dirs...)...)); err != nil || out != "" {
			t.Errorf("left after machine remove: %v\n%s", err, out)
		}
		if out := must("machine", "remove", "--state", state); !strings.Contains(out, "no machine to remove") {
			t.Errorf("remove again: %q", out)
		}
	}
	var network machine.Network
	if data, err := os.ReadFile(lab); err != nil || json.Unmarshal(data, &network) != nil {
		t.Fatalf("network state: %v", err)
	}
	must("network", "remove", "--state", lab)
	if network.Alive() {
		t.Errorf("the network's holder %d runs after remove", network.Holder.Pid)
	}
	if _, err := os.Stat(lab); !os.IsNotExist(err) {
		t.Errorf("network state after remove: %v", err)
	}
}

// keyValues reads the NAME=VALUE lines kelp cluster machine make prints.
func keyValues(out string) map[string]string {
	kv := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			kv[k] = v
		}
	}
	return kv
}
