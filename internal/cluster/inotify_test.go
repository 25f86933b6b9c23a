package cluster

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeProc makes a procfs with the given limit and one root process
// holding held inotify instances (and another user's process holding
// more, which do not count).
func fakeProc(t *testing.T, limit, held int) string {
	t.Helper()
	proc := t.TempDir()
	write := func(path, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(proc, inotifyLimit), strconv.Itoa(limit)+"\n")
	for pid, uid := range map[string]string{"10": "0", "20": "1000"} {
		write(filepath.Join(proc, pid, "status"), "Name:\tx\nUid:\t"+uid+"\t"+uid+"\t"+uid+"\t"+uid+"\n")
		fds := filepath.Join(proc, pid, "fd")
		if err := os.MkdirAll(fds, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range held {
			if err := os.Symlink("anon_inode:inotify", filepath.Join(fds, strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink("/dev/null", filepath.Join(fds, "999")); err != nil {
			t.Fatal(err)
		}
	}
	return proc
}

func limitOf(t *testing.T, proc string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(proc, inotifyLimit))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestInotifyEnough(t *testing.T) {
	proc := fakeProc(t, 8192, 100)
	var out bytes.Buffer
	if err := ensureInotify(proc, 9, &out); err != nil || out.Len() > 0 || limitOf(t, proc) != 8192 {
		t.Fatalf("room for 9 nodes left alone: %v %q limit %d", err, out.String(), limitOf(t, proc))
	}
}

// TestInotifyRaised: Linux's default of 128 with 100 held gives three
// nodes no room; the limit is raised, with room for as many again, and
// the user is told how to keep it.
func TestInotifyRaised(t *testing.T) {
	proc := fakeProc(t, 128, 100)
	var out bytes.Buffer
	if err := ensureInotify(proc, 3, &out); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(t, proc); got < 100+2*3*inotifyPerNode {
		t.Errorf("limit raised to %d, want room for 3 nodes twice beside 100 held", got)
	}
	if !strings.Contains(out.String(), "raised fs.inotify.max_user_instances from 128") || !strings.Contains(out.String(), "/etc/sysctl.d/") {
		t.Errorf("the user must hear of the raise and how to keep it: %q", out.String())
	}
}

// TestInotifyNotWritable: where the limit cannot be raised (a container
// with a read-only /proc/sys), the error says the sysctl to run. A
// read-only sysctl of the kernel's stands in for it: root cannot write
// it either.
func TestInotifyNotWritable(t *testing.T) {
	proc := fakeProc(t, 128, 100)
	const readOnly = "/proc/sys/kernel/cap_last_cap"
	if _, err := os.Stat(readOnly); err != nil {
		t.Skip(err)
	}
	limit := filepath.Join(proc, inotifyLimit)
	if err := os.Remove(limit); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(readOnly, limit); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := ensureInotify(proc, 3, &out)
	if err == nil || !strings.Contains(err.Error(), "could not be raised") || !strings.Contains(err.Error(), "sysctl -w fs.inotify.max_user_instances=") {
		t.Fatalf("want an error naming the sysctl to run, got %v", err)
	}
	if out.Len() > 0 {
		t.Errorf("nothing was raised, yet: %q", out.String())
	}
}
