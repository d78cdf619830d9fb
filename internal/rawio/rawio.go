// Package rawio makes the reads and writes of a TCP or Unix connection plain system calls
// that the Go scheduler does not account for, where Go's own net.Conn makes each one a
// blocking system call (syscall.Syscall).
//
// Go treats every read and write of a connection as a call that may block: it marks its
// goroutine's processor as in a system call (entersyscall), wakes the runtime's monitor
// thread (sysmon) if it sleeps, lets the monitor hand the processor to another thread if
// the call lasts more than about 20 µs while goroutines wait, and takes a processor back
// after it. But a connection's descriptor is non-blocking (the network poller waits for
// it), so its read and write never block: they return EAGAIN instead. On a machine where
// waking a thread costs tens of microseconds (a virtual machine whose cross-processor
// wake-ups go through the hypervisor), that bookkeeping cost more than the calls: a
// batch's write to a local Redis took 25 µs, long enough for the monitor to hand the
// processor over, and each wake-up took a processor from Redis. Conn makes the same calls
// with syscall.RawSyscall, which skips it, and waits through the poller exactly as
// net.Conn does when a call would block (syscall.RawConn's Read and Write), so deadlines
// and Close work as before. The technique is gVisor's netstack's (its fdbased link
// endpoint writes with RawSyscall because the write does not block).
//
// Measured on a 2-processor VM (BENCHMARKS.md): a strict-mode decision through a local
// Redis at one goroutine about 1.45 times as many a second; 64 goroutines on 10,000 keys
// about 1.27 times.
//
// Only on Linux, and not in builds with -msan or -asan (their checks of a system call's
// buffer are made by syscall's own Read and Write). Elsewhere, and when the environment
// variable SLUICE_RAW_IO is "off" (or "0", "false"), Wrap returns the connection it is
// given.
package rawio

import (
	"context"
	"net"
	"os"
	"strings"
)

// enabled is false when SLUICE_RAW_IO is off, 0 or false: the escape hatch, should a
// platform (a sandbox that filters system calls, say) not take the calls.
var enabled = enabledBy(os.Getenv("SLUICE_RAW_IO"))

// enabledBy reports whether raw I/O is on for the value of SLUICE_RAW_IO.
func enabledBy(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "off", "0", "false":
		return false
	}
	return true
}

// Dial is the signature of a dialer (net.Dialer.DialContext, go-redis' Options.Dialer).
type Dial func(ctx context.Context, network, addr string) (net.Conn, error)

// Dialer returns dial with every connection it makes wrapped (see Wrap): a TCP or Unix
// connection does its I/O as Conn does; any other (a TLS connection, say) is returned as
// dial made it.
func Dialer(dial Dial) Dial {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return Wrap(c), nil
	}
}
