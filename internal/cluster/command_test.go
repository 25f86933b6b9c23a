package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// TestParse: flags before and after the positional arguments, and what
// follows "--" or a command's last positional argument, as users write
// `kelp cluster create ci --agents 2 -- --disable metrics-server`.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		line    string
		maxArgs int
		args    []string
		extra   []string
		agents  int
		wait    time.Duration
		images  []string
	}{
		{line: "", maxArgs: 1, wait: time.Minute},
		{line: "ci", maxArgs: 1, args: []string{"ci"}, wait: time.Minute},
		{line: "ci --agents 2 --wait 5s", maxArgs: 1, args: []string{"ci"}, agents: 2, wait: 5 * time.Second},
		{line: "--agents 2 ci --wait 5s", maxArgs: 1, args: []string{"ci"}, agents: 2, wait: 5 * time.Second},
		{line: "--agents 1 ci --agents 3", maxArgs: 1, args: []string{"ci"}, agents: 3, wait: time.Minute},
		{line: "--image a.tar ci --image b.tar", maxArgs: 1, args: []string{"ci"}, wait: time.Minute, images: []string{"a.tar", "b.tar"}},
		{line: "ci -- --disable metrics-server", maxArgs: 1, args: []string{"ci"}, extra: []string{"--disable", "metrics-server"}, wait: time.Minute},
		{line: "ci --agents 2 -- --node-label a=b", maxArgs: 1, args: []string{"ci"}, extra: []string{"--node-label", "a=b"}, agents: 2, wait: time.Minute},
		{line: "--agents 2 -- --node-label a=b", maxArgs: 1, extra: []string{"--node-label", "a=b"}, agents: 2, wait: time.Minute},
		{line: "ci server-1 ls -l /", maxArgs: 2, args: []string{"ci", "server-1"}, extra: []string{"ls", "-l", "/"}, wait: time.Minute},
		{line: "ci server-1 -- kelp crictl ps", maxArgs: 2, args: []string{"ci", "server-1"}, extra: []string{"kelp", "crictl", "ps"}, wait: time.Minute},
		{line: "a b c", maxArgs: -1, args: []string{"a", "b", "c"}, wait: time.Minute},
	} {
		var got *parsed
		app := &cli.App{Commands: []*cli.Command{{
			Name: "cmd",
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "agents"},
				&cli.DurationFlag{Name: "wait", Value: time.Minute},
				&cli.StringSliceFlag{Name: "image"},
			},
			Action: func(c *cli.Context) error {
				var err error
				got, err = parse(c, tc.maxArgs)
				return err
			},
		}}}
		if err := app.Run(append([]string{"kelp", "cmd"}, strings.Fields(tc.line)...)); err != nil {
			t.Errorf("%q: %v", tc.line, err)
			continue
		}
		if !slices.Equal(got.args, tc.args) || !slices.Equal(got.extra, tc.extra) || got.int("agents") != tc.agents || got.duration("wait") != tc.wait || !slices.Equal(got.slice("image"), tc.images) {
			t.Errorf("%q: args %q extra %q agents %d wait %s images %q", tc.line, got.args, got.extra, got.int("agents"), got.duration("wait"), got.slice("image"))
		}
	}
}

func TestCheckName(t *testing.T) {
	for name, ok := range map[string]bool{"ci": true, "a-1": true, "Bad": false, "-a": false, "a_b": false, "": false, strings.Repeat("a", 33): false} {
		if err := checkName(name); (err == nil) != ok {
			t.Errorf("%q: %v", name, err)
		}
	}
}

func TestOptionsCheck(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string // error, or the datastore chosen
	}{
		{Options{Name: "a", Servers: 1}, "sqlite"},
		{Options{Name: "a", Servers: 3}, "etcd"},
		{Options{Name: "a", Servers: 1, Datastore: "etcd"}, "etcd"},
		{Options{Name: "a", Servers: 0}, "at least one server"},
		{Options{Name: "a", Servers: 1, Agents: -1}, "--agents -1"},
		{Options{Name: "a", Servers: 2, Datastore: "sqlite"}, "--datastore sqlite takes one server"},
		{Options{Name: "a", Servers: 1, Datastore: "postgres"}, `--datastore "postgres"`},
		{Options{Name: "a", Servers: 1, Images: []string{"/nonexistent.tar"}}, "no such file"},
	} {
		err := tc.o.check(false)
		if err != nil && !strings.Contains(err.Error(), tc.want) || err == nil && tc.o.Datastore != tc.want {
			t.Errorf("%+v: %v, datastore %q; want %q", tc.o, err, tc.o.Datastore, tc.want)
		}
	}
}

func TestParsePort(t *testing.T) {
	if p, err := ParsePort("8080:30080"); err != nil || p != (Port{Host: 8080, Node: 30080}) {
		t.Errorf("8080:30080: %v %v", p, err)
	}
	for _, bad := range []string{"8080", "0:30080", "a:b", "8080:70000", ""} {
		if _, err := ParsePort(bad); err == nil || !strings.Contains(err.Error(), "HOST:NODEPORT") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestCheckHostNamespaces: a kernel without one of the namespaces a node
// needs is named (a fake /proc lacking the cgroup namespace).
func TestCheckHostNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the root check comes first")
	}
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "self", "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"net", "mnt", "uts"} {
		if err := os.WriteFile(filepath.Join(proc, "self", "ns", ns), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := CheckHost(proc); err == nil || !strings.Contains(err.Error(), "no cgroup namespaces") {
		t.Fatalf("got %v", err)
	}
}

// TestMergeKubeconfig: the cluster's context goes into a kubeconfig beside
// what it holds, becomes current, and leaves again with delete, the rest
// kept.
func TestMergeKubeconfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".kube", "config")
	mine := clientcmdapi.NewConfig()
	mine.Clusters["prod"] = &clientcmdapi.Cluster{Server: "https://prod:6443"}
	mine.AuthInfos["prod"] = &clientcmdapi.AuthInfo{Token: "t"}
	mine.Contexts["prod"] = &clientcmdapi.Context{Cluster: "prod", AuthInfo: "prod"}
	mine.CurrentContext = "prod"
	if err := writeConfig(path, mine); err != nil {
		t.Fatal(err)
	}
	ci := clientcmdapi.NewConfig()
	ci.Clusters["kelp-ci"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:40000"}
	ci.AuthInfos["kelp-ci"] = &clientcmdapi.AuthInfo{Token: "u"}
	ci.Contexts["kelp-ci"] = &clientcmdapi.Context{Cluster: "kelp-ci", AuthInfo: "kelp-ci"}
	ci.CurrentContext = "kelp-ci"
	if err := mergeKubeconfig(path, ci); err != nil {
		t.Fatal(err)
	}
	got, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.CurrentContext != "kelp-ci" || got.Contexts["prod"] == nil || got.Clusters["kelp-ci"].Server != "https://127.0.0.1:40000" {
		t.Fatalf("merged: %+v", got)
	}
	if err := unmergeKubeconfig(path, "ci"); err != nil {
		t.Fatal(err)
	}
	got, err = clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.CurrentContext != "" || got.Contexts["kelp-ci"] != nil || got.Clusters["kelp-ci"] != nil || got.AuthInfos["kelp-ci"] != nil || got.Contexts["prod"] == nil {
		t.Fatalf("after delete: %+v", got)
	}
	// A kubeconfig that is gone is nothing to remove from.
	if err := unmergeKubeconfig(filepath.Join(t.TempDir(), "none"), "ci"); err != nil {
		t.Error(err)
	}
}

// TestAllReady: a Node counts once its kubelet reported Ready after the
// wait began, not on a Ready of before a stop or a save.
func TestAllReady(t *testing.T) {
	since := time.Date(2026, 11, 27, 10, 0, 0, 500e6, time.UTC)
	node := func(status corev1.ConditionStatus, heartbeat time.Time) corev1.Node {
		return corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.NewTime(heartbeat)}}}}
	}
	fresh, stale := since.Add(2*time.Second), since.Add(-time.Minute)
	if err := allReady([]corev1.Node{node(corev1.ConditionTrue, fresh), node(corev1.ConditionTrue, since.Truncate(time.Second))}, 2, since); err != nil {
		t.Errorf("both reported after since: %v", err)
	}
	for name, nodes := range map[string][]corev1.Node{
		"stale":     {node(corev1.ConditionTrue, fresh), node(corev1.ConditionTrue, stale)},
		"not ready": {node(corev1.ConditionTrue, fresh), node(corev1.ConditionFalse, fresh)},
		"missing":   {node(corev1.ConditionTrue, fresh)},
	} {
		if err := allReady(nodes, 2, since); err == nil || !strings.Contains(err.Error(), "1 of 2 nodes Ready") {
			t.Errorf("%s: %v", name, err)
		}
	}
}
