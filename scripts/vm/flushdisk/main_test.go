package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPowerCut: qemu's own NBD client (qemu-io, of qemu-utils) writes a
// block and flushes, writes another and reads it back, and is killed. The
// flushed block is in the image; the other, acknowledged but not flushed,
// is not, as on a card that lost its write cache.
func TestPowerCut(t *testing.T) {
	qemuIO, err := exec.LookPath("qemu-io")
	if err != nil {
		t.Fatal("qemu-io is missing: apt-get install qemu-utils (scripts/test.sh does)")
	}
	dir := t.TempDir()
	image, socket := filepath.Join(dir, "disk.raw"), filepath.Join(dir, "nbd.sock")
	if err := os.Truncate(mustCreate(t, image), 4<<20); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve(socket, image) }()
	waitFor(t, socket)

	// -t writeback: the guest's view, a disk with a write cache that takes
	// flushes (writethrough would flush after every write). abort ends
	// qemu-io as a kill would: without the flush of an orderly close.
	qio := exec.Command("stdbuf", "-oL", qemuIO, "-t", "writeback", "-f", "raw",
		"-c", "write -P 0xab 0 4k", "-c", "write -P 0xee 64k 2M", "-c", "flush",
		"-c", "write -P 0xcd 4k 4k", "-c", "read -P 0xcd 4k 4k", "-c", "abort",
		"nbd+unix:///?socket="+socket)
	out, err := qio.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "read 4096/4096 bytes at offset 4096") || strings.Contains(string(out), "Pattern verification failed") {
		t.Fatalf("qemu-io: %v (want it aborted after the read)\n%s", err, out)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("flushdisk still serves after its client was killed")
	}

	got, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:4096], bytes.Repeat([]byte{0xab}, 4096)) {
		t.Error("the flushed block is not in the image")
	}
	if !bytes.Equal(got[64<<10:64<<10+2<<20], bytes.Repeat([]byte{0xee}, 2<<20)) {
		t.Error("the flushed 2 MiB write (more than one request buffer) is not in the image")
	}
	if !bytes.Equal(got[4096:8192], make([]byte, 4096)) {
		t.Error("the block written after the last flush is in the image: it should have been lost with the cache")
	}
}

// TestReadsSeeTheCache: what was written and not flushed reads back,
// whole and in part, over blocks from the image.
func TestReadsSeeTheCache(t *testing.T) {
	image := mustCreate(t, filepath.Join(t.TempDir(), "disk.raw"))
	if err := os.WriteFile(image, bytes.Repeat([]byte{1}, 3*blockSize), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := &disk{file: f, size: 3 * blockSize, dirty: map[uint64][]byte{}}
	if err := d.write(bytes.Repeat([]byte{2}, 100), blockSize-50); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 3*blockSize)
	if err := d.read(got, 0); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{1}, 3*blockSize)
	copy(want[blockSize-50:], bytes.Repeat([]byte{2}, 100))
	if !bytes.Equal(got, want) {
		t.Error("a read over cached and uncached blocks differs from what was written")
	}
	if onDisk, _ := os.ReadFile(image); bytes.Equal(onDisk, want) {
		t.Error("the write reached the image before a flush")
	}
	if err := d.flush(); err != nil {
		t.Fatal(err)
	}
	if onDisk, _ := os.ReadFile(image); !bytes.Equal(onDisk, want) || len(d.dirty) != 0 {
		t.Error("after the flush the image differs from what was written")
	}
}

func mustCreate(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return path
}

func waitFor(t *testing.T, socket string) {
	t.Helper()
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(socket); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", socket)
}
