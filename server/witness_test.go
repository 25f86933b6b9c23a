package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// writesBackWithin bounds how long after SIGKILL of any one of two
// servers and a witness a write through a survivor is acknowledged: an
// etcd election (1 s election timeout) and the apiserver's retry.
const writesBackWithin = 30 * time.Second

// TestWitness runs two servers on embedded etcd and a witness, the third
// voting member on a machine that runs nothing else, and kills each of
// the three in turn with SIGKILL: writes through a survivor are back
// within writesBackWithin each time, and the killed one rejoins when it
// starts again. The witness holds its etcd certificates alone, and a
// deleted Node of its name does not remove its member.
func TestWitness(t *testing.T) {
	t.Parallel()
	lab := testcluster.NewLab(t)
	s1, s2, w := lab.NewNode("server-1", "10.99.0.2"), lab.NewNode("server-2", "10.99.0.3"), lab.NewNode("pi", "10.99.0.4")
	s1.Start("--cluster-init")
	s1.WaitReady(startTimeout)
	joinArgs := s1.JoinArgs()
	s2.Start(joinArgs...)
	s2.WaitReady(2 * startTimeout)
	w.StartWitness(s1.URL(), s1.TokenFile())
	w.WaitLog("The witness is a voting member of the cluster's etcd", startTimeout)
	if !s1.Logged("etcd witness joined") {
		t.Error("server-1 did not log the witness's join")
	}

	testcluster.Eventually(t, "three started voting members in `kelp etcdctl member list`", func() (bool, error) {
		out, err := s1.RunKelp(time.Minute, "etcdctl", "--data-dir", s1.DataDir, "member", "list")
		return err == nil && strings.Count(out, ", started, ") == 3 && strings.Contains(out, "witness/pi, https://10.99.0.4:2380") && !strings.Contains(out, ", true"), nil
	})
	if out, err := w.RunKelp(time.Minute, "etcdctl", "--data-dir", w.DataDir, "member", "list"); err != nil || strings.Count(out, ", started, ") != 3 {
		t.Errorf("`kelp etcdctl member list` on the witness: %v\n%s", err, out)
	}
	out, err := w.RunKelp(time.Minute, "witness", "status", "--data-dir", w.DataDir)
	if err != nil {
		t.Fatalf("kelp witness status: %v\n%s", err, out)
	}
	t.Logf("kelp witness status:\n%s", out)

	// What a stolen witness gives away: its etcd member's data and its two
	// etcd certificates; no CA key, no token, nothing of the control plane.
	var held []string
	if err := filepath.WalkDir(w.DataDir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.Contains(path, "/db/etcd/") {
			rel, _ := filepath.Rel(w.DataDir, path)
			held = append(held, rel)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{"witness/db/datastore.lock", "witness/tls/etcd/peer-ca.crt", "witness/tls/etcd/peer-server-client.crt", "witness/tls/etcd/peer-server-client.key",
		"witness/tls/etcd/server-ca.crt", "witness/tls/etcd/server-client.crt", "witness/tls/etcd/server-client.key"}
	slices.Sort(held)
	if !slices.Equal(held, want) {
		t.Errorf("the witness holds %v, want %v", held, want)
	}
	if procs := w.Processes(); len(procs) != 1 {
		t.Errorf("the witness runs %v, want kelp alone", procs)
	}
	m := smapsRollup(t, w.PID())
	t.Logf("witness footprint (/proc/%d/smaps_rollup): Rss %d MiB (anonymous %d MiB), Pss %d MiB (anonymous %d MiB, file %d MiB)",
		w.PID(), m["Rss"]>>10, m["Anonymous"]>>10, m["Pss"]>>10, m["Pss_Anon"]>>10, m["Pss_File"]>>10)

	// A Node named like the witness, deleted: its member stays.
	c := s1.Client()
	if _, err := c.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "pi"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubectl(t, s1, "delete", "node", "pi")

	for i, victim := range []*testcluster.Node{s1, s2, w} {
		writer := s2
		if victim == s2 {
			writer = s1
		}
		leader := witnessFollows(t, w)
		victim.Kill()
		back := writesBack(t, writer.Client(), fmt.Sprintf("after-kill-%d", i))
		t.Logf("%s SIGKILLed (the etcd leader was %s): a write through %s acknowledged %s after the kill", victim.Name, leader, writer.Name, back.Round(10*time.Millisecond))
		switch victim {
		case w:
			w.StartWitness(s1.URL(), s1.TokenFile())
			w.WaitLog("The witness is a voting member", startTimeout)
		case s1:
			s1.Start("--cluster-init")
			s1.WaitReady(startTimeout)
		default:
			victim.Start(joinArgs...)
			victim.WaitReady(startTimeout)
		}
	}
	witnessFollows(t, w)
	out, err = s2.RunKelp(time.Minute, "etcdctl", "--data-dir", s2.DataDir, "member", "list")
	if err != nil || strings.Count(out, ", started, ") != 3 || !strings.Contains(out, "witness/pi") {
		t.Errorf("the members after three kills: %v\n%s", err, out)
	}
	for i := range 3 {
		if _, err := s1.Client().CoreV1().ConfigMaps("default").Get(context.Background(), fmt.Sprintf("after-kill-%d", i), metav1.GetOptions{}); err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
}

// witnessFollows waits until `kelp witness status` on w shows it a voter
// that follows a leader, among three voters, and returns the leader.
func witnessFollows(t *testing.T, w *testcluster.Node) string {
	t.Helper()
	const voter = "witness witness/pi: voting member; etcd leader: "
	var leader string
	testcluster.Eventually(t, "the witness a voter following a leader", func() (bool, error) {
		out, _ := w.RunKelp(time.Minute, "witness", "status", "--data-dir", w.DataDir)
		_, after, ok := strings.Cut(out, voter)
		leader, _, _ = strings.Cut(after, " ")
		return ok && !strings.HasPrefix(leader, "none") && strings.Contains(out, "3 voting members"), nil
	})
	return leader
}

// writesBack creates the ConfigMap name, trying every 100 ms with a new
// request of at most a second, as a request sent to a member that lost
// its leader waits out etcd's request timeout (7 s); it returns how long
// the first acknowledged write took from now, and fails the test if none
// is within writesBackWithin.
func writesBack(t *testing.T, c kubernetes.Interface, name string) time.Duration {
	t.Helper()
	began := time.Now()
	var err error
	for time.Since(began) < writesBackWithin {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = c.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		cancel()
		if err == nil || apierrors.IsAlreadyExists(err) {
			return time.Since(began)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no write of %s acknowledged within %s: %v", name, writesBackWithin, err)
	return 0
}

// smapsRollup is /proc/<pid>/smaps_rollup: each field in KiB.
func smapsRollup(t *testing.T, pid int) map[string]int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		var name string
		var kb int
		if _, err := fmt.Sscanf(line, "%s %d kB", &name, &kb); err == nil {
			fields[strings.TrimSuffix(name, ":")] = kb
		}
	}
	return fields
}
