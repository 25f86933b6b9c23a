// Command flushdisk is the VM lab's disk with a volatile write cache, as
// an SD card or a cheap SSD has: an NBD server (the newstyle protocol of
// qemu's nbd: drives, served on a unix socket) of one raw image file that
// keeps every write in memory until the guest flushes, and only then puts
// the writes into the file and fsyncs it. When qemu is killed (a power cut)
// the connection ends and whatever was not flushed is gone, which a qemu
// drive on a file (cache=none) cannot show: the host already holds every
// write the guest sent.
//
// usage: flushdisk -socket PATH IMAGE
//
// It serves one connection, then exits: one qemu, one boot session (a
// reboot of the guest keeps the connection). At its end it says on stderr
// how many writes it dropped.
package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
)

// The protocol's numbers (the NBD protocol, doc/proto.md of nbd).
const (
	magicInit        = 0x4e42444d41474943 // "NBDMAGIC"
	magicOption      = 0x49484156454f5054 // "IHAVEOPT"
	magicOptionReply = 0x3e889045565a9
	magicRequest     = 0x25609513
	magicReply       = 0x67446698

	flagFixedNewstyle = 1 << 0
	flagNoZeroes      = 1 << 1

	optExportName = 1
	optAbort      = 2
	optGo         = 7

	repAck      = 1
	repInfo     = 3
	repErrUnsup = 1<<31 | 1

	infoExport = 0

	// The export has flags and takes flushes; it offers no FUA, trim or
	// write-zeroes, which qemu then does with writes and flushes.
	transmissionFlags = 1<<0 | 1<<2

	cmdRead  = 0
	cmdWrite = 1
	cmdDisc  = 2
	cmdFlush = 3

	errIO    = 5
	errInval = 22

	blockSize = 4096
	// maxRequest bounds one read or write, as qemu's client does (32 MiB).
	maxRequest = 32 << 20
)

func main() {
	socket := flag.String("socket", "", "unix socket to serve on")
	flag.Parse()
	if *socket == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: flushdisk -socket PATH IMAGE")
		os.Exit(2)
	}
	if err := serve(*socket, flag.Arg(0)); err != nil {
		log.Fatalf("flushdisk: %v", err)
	}
}

func serve(socket, image string) error {
	f, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size()%blockSize != 0 {
		return fmt.Errorf("%s: its size %d is not a multiple of %d", image, st.Size(), blockSize)
	}
	_ = os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	conn, err := l.Accept()
	l.Close()
	if err != nil {
		return err
	}
	defer conn.Close()
	d := &disk{file: f, size: uint64(st.Size()), dirty: map[uint64][]byte{}}
	rw := bufio.NewReadWriter(bufio.NewReaderSize(conn, 1<<20), bufio.NewWriterSize(conn, 1<<20))
	if err := handshake(rw, d.size); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	err = d.transmit(rw)
	log.Printf("flushdisk: the connection ended: %d unflushed blocks (%d writes since the last flush) dropped", len(d.dirty), d.writes)
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// handshake is the fixed newstyle negotiation, up to the export: it
// refuses every option but the export's name and GO.
func handshake(rw *bufio.ReadWriter, size uint64) error {
	if err := send(rw, uint64(magicInit), uint64(magicOption), uint16(flagFixedNewstyle|flagNoZeroes)); err != nil {
		return err
	}
	var clientFlags uint32
	if err := get(rw, &clientFlags); err != nil {
		return err
	}
	for {
		var hdr struct {
			Magic  uint64
			Option uint32
			Length uint32
		}
		if err := get(rw, &hdr); err != nil {
			return err
		}
		if hdr.Magic != magicOption || hdr.Length > 1<<16 {
			return fmt.Errorf("bad option header %+v", hdr)
		}
		if _, err := io.CopyN(io.Discard, rw, int64(hdr.Length)); err != nil {
			return err
		}
		switch hdr.Option {
		case optExportName:
			if clientFlags&flagNoZeroes == 0 {
				return send(rw, size, uint16(transmissionFlags), [124]byte{})
			}
			return send(rw, size, uint16(transmissionFlags))
		case optGo:
			info := []any{uint16(infoExport), size, uint16(transmissionFlags)}
			if err := optionReply(rw, hdr.Option, repInfo, info...); err != nil {
				return err
			}
			return optionReply(rw, hdr.Option, repAck)
		case optAbort:
			_ = optionReply(rw, hdr.Option, repAck)
			return io.EOF
		default:
			if err := optionReply(rw, hdr.Option, repErrUnsup); err != nil {
				return err
			}
		}
	}
}

func optionReply(w *bufio.ReadWriter, option, kind uint32, data ...any) error {
	length := 0
	for _, d := range data {
		length += binary.Size(d)
	}
	return send(w, append([]any{uint64(magicOptionReply), option, kind, uint32(length)}, data...)...)
}

// disk is the image with its volatile cache: dirty holds, by block index,
// each block written since the last flush.
type disk struct {
	file   *os.File
	size   uint64
	dirty  map[uint64][]byte
	writes int
}

func (d *disk) transmit(rw *bufio.ReadWriter) error {
	buf := make([]byte, 0, 1<<20)
	for {
		var req struct {
			Magic  uint32
			Flags  uint16
			Type   uint16
			Cookie uint64
			Offset uint64
			Length uint32
		}
		if err := get(rw, &req); err != nil {
			return err
		}
		if req.Magic != magicRequest {
			return fmt.Errorf("bad request magic %#x", req.Magic)
		}
		inRange := req.Length <= maxRequest && req.Offset <= d.size && uint64(req.Length) <= d.size-req.Offset
		switch req.Type {
		case cmdRead:
			if !inRange {
				if err := send(rw, uint32(magicReply), uint32(errInval), req.Cookie); err != nil {
					return err
				}
				continue
			}
			buf = sized(buf, req.Length)
			errno := uint32(0)
			if err := d.read(buf, req.Offset); err != nil {
				log.Printf("flushdisk: read %d at %d: %v", req.Length, req.Offset, err)
				errno = errIO
			}
			reply := []any{uint32(magicReply), errno, req.Cookie}
			if errno == 0 {
				reply = append(reply, buf)
			}
			if err := send(rw, reply...); err != nil {
				return err
			}
		case cmdWrite:
			if req.Length > maxRequest {
				return fmt.Errorf("write of %d bytes: more than %d", req.Length, maxRequest)
			}
			buf = sized(buf, req.Length)
			if _, err := io.ReadFull(rw, buf); err != nil {
				return err
			}
			errno := uint32(errInval)
			if inRange {
				errno = 0
				if err := d.write(buf, req.Offset); err != nil {
					log.Printf("flushdisk: write %d at %d: %v", req.Length, req.Offset, err)
					errno = errIO
				}
			}
			if err := send(rw, uint32(magicReply), errno, req.Cookie); err != nil {
				return err
			}
		case cmdFlush:
			errno := uint32(0)
			if err := d.flush(); err != nil {
				log.Printf("flushdisk: flush: %v", err)
				errno = errIO
			}
			if err := send(rw, uint32(magicReply), errno, req.Cookie); err != nil {
				return err
			}
		case cmdDisc:
			return io.EOF
		default:
			if err := send(rw, uint32(magicReply), uint32(errInval), req.Cookie); err != nil {
				return err
			}
		}
	}
}

// sized is buf with length n, grown if its capacity is less.
func sized(buf []byte, n uint32) []byte {
	if cap(buf) < int(n) {
		return make([]byte, n)
	}
	return buf[:n]
}

// read fills p from offset off: each block from the cache if it is
// there, else from the file.
func (d *disk) read(p []byte, off uint64) error {
	for len(p) > 0 {
		i, in := off/blockSize, off%blockSize
		n := min(uint64(len(p)), blockSize-in)
		if b, ok := d.dirty[i]; ok {
			copy(p[:n], b[in:])
		} else if _, err := d.file.ReadAt(p[:n], int64(off)); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		p, off = p[n:], off+n
	}
	return nil
}

// write puts p at offset off into the cache, a whole block at a time.
func (d *disk) write(p []byte, off uint64) error {
	d.writes++
	for len(p) > 0 {
		i, in := off/blockSize, off%blockSize
		n := min(uint64(len(p)), blockSize-in)
		b, ok := d.dirty[i]
		if !ok {
			b = make([]byte, blockSize)
			if n < blockSize {
				if err := d.read(b, i*blockSize); err != nil {
					return err
				}
			}
			d.dirty[i] = b
		}
		copy(b[in:], p[:n])
		p, off = p[n:], off+n
	}
	return nil
}

// flush puts the cache into the file and syncs it: after it, every
// write before the flush survives a power cut.
func (d *disk) flush() error {
	for i, b := range d.dirty {
		if _, err := d.file.WriteAt(b, int64(i*blockSize)); err != nil {
			return err
		}
	}
	if err := d.file.Sync(); err != nil {
		return err
	}
	clear(d.dirty)
	d.writes = 0
	return nil
}

// send writes fields, big-endian, as one message.
func send(w *bufio.ReadWriter, fields ...any) error {
	for _, f := range fields {
		if err := binary.Write(w, binary.BigEndian, f); err != nil {
			return err
		}
	}
	return w.Flush()
}

func get(r io.Reader, v any) error { return binary.Read(r, binary.BigEndian, v) }
