package containerd

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A node that fails while it starts and the signal that stops kelp may
// stop containerd at the same moment.
func TestSupervisorStopFromSeveralGoroutines(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "containerd")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Supervise(fake, filepath.Join(dir, "config.toml"), filepath.Join(dir, "containerd.log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Stop(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	select {
	case <-s.Ready():
		t.Error("ready, though nothing answered on the socket")
	default:
	}
}

// The bundle's containerd is started with its config, and started again
// with the same arguments after it was killed.
func TestSupervisorRestartsKilledContainerd(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "containerd")
	calls := filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$$ $*\" >>" + calls + "\nexec sleep 60\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "config.toml")
	s, err := Supervise(fake, config, filepath.Join(dir, "containerd.log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	first := waitCalls(t, calls, 1)[0]
	pid, args, _ := strings.Cut(first, " ")
	if want := "--config " + config; args != want {
		t.Fatalf("containerd started with %q, want %q", args, want)
	}
	n, err := strconv.Atoi(pid)
	if err != nil {
		t.Fatalf("calls: %q: %v", first, err)
	}
	if err := syscall.Kill(n, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	second := waitCalls(t, calls, 2)[1]
	if pid2, args2, _ := strings.Cut(second, " "); pid2 == pid || args2 != args {
		t.Errorf("after a kill containerd was started as %q, first as %q", second, first)
	}
}

// waitCalls waits until the fake containerd was started n times, and
// returns a line "<pid> <args>" per start.
func waitCalls(t *testing.T, path string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		data, _ := os.ReadFile(path)
		if lines := strings.Split(strings.TrimSpace(string(data)), "\n"); len(data) > 0 && len(lines) >= n {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd was not started %d times within a minute: %q", n, data)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
