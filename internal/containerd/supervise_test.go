package containerd

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// A node that fails while it starts and the signal that stops kelp may
// stop containerd at the same moment.
func TestSupervisorStopFromSeveralGoroutines(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "kelp")
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
