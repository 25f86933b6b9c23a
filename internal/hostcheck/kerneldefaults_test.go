package hostcheck

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestCheckKernelDefaults(t *testing.T) {
	root := t.TempDir()
	write := func(name, value string) {
		path := filepath.Join(root, "proc/sys", name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(value+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range kubeletKernelDefaults {
		write(name, strconv.Itoa(want))
	}
	h := Host{Root: root}
	if err := h.CheckKernelDefaults(); err != nil {
		t.Fatalf("the kubelet's values: %v", err)
	}

	write("vm/overcommit_memory", "0")
	if err := os.Remove(filepath.Join(root, "proc/sys/kernel/panic")); err != nil {
		t.Fatal(err)
	}
	err := h.CheckKernelDefaults()
	if err == nil {
		t.Fatal("wrong values passed")
	}
	for _, want := range []string{"vm.overcommit_memory is 0, want 1", "kernel.panic is unreadable, want 10", `kernel.panic=10\nvm.overcommit_memory=1`, "/etc/sysctl.d/90-kelp.conf", "without --protect-kernel-defaults"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "panic_on_oops") {
		t.Errorf("error %q names a setting that is right", err)
	}
}
