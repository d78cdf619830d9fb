//go:build linux && !msan && !asan

package rawio

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// Conn is a TCP or Unix connection whose Read and Write are raw system calls (see the
// package comment). Every other method is the connection's own. Its calls allocate
// nothing: the functions handed to the raw connection are made once, and each takes its
// buffer and leaves its result in the Conn, under a lock of its direction (reads, like
// writes, may come from several goroutines at once, as net.Conn allows).
type Conn struct {
	net.Conn
	rc syscall.RawConn

	rmu  sync.Mutex
	rp   []byte        // the read's buffer
	rn   int           // what it read
	rerr syscall.Errno // its error, other than EAGAIN
	rdo  func(fd uintptr) bool
	wmu  sync.Mutex
	wp   []byte // what is left to write
	wn   int    // what was written
	werr syscall.Errno
	wdo  func(fd uintptr) bool
}

// Wrap returns c as a *Conn if it is a *net.TCPConn or a *net.UnixConn (and rawio is
// enabled), and c itself otherwise.
func Wrap(c net.Conn) net.Conn {
	if !enabled {
		return c
	}
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return c
	}
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return c
	}
	w := &Conn{Conn: c, rc: rc}
	w.rdo, w.wdo = w.read, w.write
	return w
}

// SyscallConn returns the connection's raw connection, as net.Conn's does: go-redis
// checks a pooled connection's health through it.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }

// Read reads as net.Conn's Read does: into p, at most len(p) bytes, waiting through the
// poller (and its read deadline) while nothing has arrived; io.EOF once the peer closed.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	c.rp, c.rn, c.rerr = p, 0, 0
	err := c.rc.Read(c.rdo)
	n, errno := c.rn, c.rerr
	c.rp = nil
	c.rmu.Unlock()
	switch {
	case err != nil: // the deadline, or the connection closed
		return 0, err
	case errno != 0:
		return 0, c.opError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// read is the raw connection's read function: true when done (c.rn, c.rerr), false to
// wait until the descriptor is readable.
func (c *Conn) read(fd uintptr) bool {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rp[0])), uintptr(len(c.rp)))
		switch e {
		case 0:
			c.rn = int(r)
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.rerr = e
			return true
		}
	}
}

// Write writes all of p as net.Conn's Write does, waiting through the poller (and its
// write deadline) whenever the socket's buffer is full, and returns how much was written.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	c.wp, c.wn, c.werr = p, 0, 0
	err := c.rc.Write(c.wdo)
	n, errno := c.wn, c.werr
	c.wp = nil
	c.wmu.Unlock()
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, c.opError("write", errno)
	}
	return n, nil
}

// write is the raw connection's write function: true when all of c.wp is written or an
// error (c.werr) stops it, false to wait until the descriptor is writable.
func (c *Conn) write(fd uintptr) bool {
	for c.wn < len(c.wp) {
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&c.wp[c.wn])), uintptr(len(c.wp)-c.wn))
		switch e {
		case 0:
			c.wn += int(r)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.werr = e
			return true
		}
	}
	return true
}

// opError wraps a system call's error as net.Conn's Read and Write do.
func (c *Conn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(),
		Err: os.NewSyscallError(op, errno)}
}
