package nft

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// bufferSize bounds one batch and its acknowledgements: 1,000 Services of
// 10 endpoints take some 20 MiB. The kernel allocates only what a batch
// uses.
const bufferSize = 64 << 20

// New opens a connection to nftables with buffers beyond the system's
// defaults (net.core.rmem_max, wmem_max); kelp runs as root, which may.
func New(opts ...nftables.ConnOption) (*nftables.Conn, error) {
	c, err := nftables.New(append(opts, nftables.WithSockOptions(forceBuffers))...)
	if err != nil {
		return nil, fmt.Errorf("open nftables: %w", err)
	}
	return c, nil
}

func forceBuffers(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = errors.Join(
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, bufferSize),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bufferSize))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("size the nftables socket's buffers: %w", serr)
	}
	return nil
}
