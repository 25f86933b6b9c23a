package testcluster

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// InNewNetns runs fn on a thread in a network namespace of its own, so a
// kernel test never touches the machine's interfaces, routes or nftables.
// The thread is discarded after, and the namespace with it.
func InNewNetns(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: Go retires the thread
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare: %v", err)
			return
		}
		fn()
	}()
	<-done
}

// NetnsFD opens the calling thread's network namespace (in InNewNetns: the
// test's own), for handles that look at it from other threads. It is
// closed when the test ends.
func NetnsFD(t *testing.T) int {
	t.Helper()
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// Netns is a network namespace of a test's own, with a thread in it that
// runs what Do hands it; both go when the test ends.
type Netns struct {
	// FD is the namespace, to move links into.
	FD    int
	funcs chan func()
}

// NewNetns makes a network namespace for the test.
func NewNetns(t *testing.T) *Netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	n := &Netns{funcs: make(chan func())}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: Go retires the thread
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- fmt.Errorf("unshare: %w", err)
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ready <- err
			return
		}
		n.FD = fd
		ready <- nil
		for f := range n.funcs {
			f()
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("a network namespace: %v", err)
	}
	t.Cleanup(func() {
		close(n.funcs)
		unix.Close(n.FD)
	})
	return n
}

// Do runs f on the namespace's thread, in the namespace.
func (n *Netns) Do(f func() error) error {
	errs := make(chan error)
	n.funcs <- func() { errs <- f() }
	return <-errs
}

// Accept listens on addr of network ("tcp", "tcp4", "tcp6") in the
// namespace and accepts and closes connections until the test ends.
func (n *Netns) Accept(t *testing.T, network, addr string) {
	t.Helper()
	if err := n.Do(func() error {
		l, err := net.Listen(network, addr)
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Loopback brings lo up in the calling thread's network namespace (a new
// namespace has it down) and returns it.
func Loopback(t *testing.T) netlink.Link {
	t.Helper()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	return lo
}

// AddAddrs adds the addresses (CIDRs) to link in the calling thread's
// network namespace, usable at once: IPv6 ones skip duplicate address
// detection.
func AddAddrs(link netlink.Link, cidrs ...string) error {
	for _, c := range cidrs {
		addr, err := netlink.ParseAddr(c)
		if err != nil {
			return err
		}
		addr.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("add %s to %s: %w", c, link.Attrs().Name, err)
		}
	}
	return nil
}

// AddrsOf are the addresses of link in the calling thread's network
// namespace, as CIDRs, sorted, link-local ones left out.
func AddrsOf(link netlink.Link) ([]string, error) {
	list, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range list {
		if !a.IP.IsLinkLocalUnicast() {
			out = append(out, a.IPNet.String())
		}
	}
	slices.Sort(out)
	return out, nil
}
