//go:build linux && !msan && !asan

package rawio

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind; in a child started by
// TestEnvironment, it reports whether raw I/O is enabled instead.
func TestMain(m *testing.M) {
	if os.Getenv("RAWIO_TEST_CHILD") != "" {
		if enabled {
			os.Exit(10)
		}
		os.Exit(11)
	}
	goleak.VerifyTestMain(m)
}

// TestEnvironment: SLUICE_RAW_IO=off (or 0, false, in any case) turns raw I/O off in a
// process started with it; any other value, or none, leaves it on.
func TestEnvironment(t *testing.T) {
	for v, want := range map[string]bool{"off": false, "OFF": false, " 0": false, "false": false, "": true, "on": true, "1": true} {
		cmd := exec.Command(os.Args[0], "-test.run", "^$")
		cmd.Env = append(os.Environ(), "RAWIO_TEST_CHILD=1", "SLUICE_RAW_IO="+v)
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || (ee.ExitCode() == 10) != want || ee.ExitCode() < 10 {
			t.Errorf("SLUICE_RAW_IO=%q: child said %v, want enabled %v", v, err, want)
		}
	}
}

// pair returns a connected client (dialled through Dialer) and server connection over
// network ("tcp" or "unix"), both closed at the test's end.
func pair(t *testing.T, network string) (client, server net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	var d net.Dialer
	client, err = Dialer(d.DialContext)(context.Background(), network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// wrapped fails the test unless c is a *Conn.
func wrapped(t *testing.T, c net.Conn) {
	t.Helper()
	if _, ok := c.(*Conn); !ok {
		t.Fatalf("connection %T not wrapped", c)
	}
}

// TestTransfer sends 8 MiB each way between a wrapped connection and a plain one, with
// the other side reading in small, slow steps so that the wrapped side's writes fill the
// socket's buffer (partial writes, EAGAIN, waits) and its reads find nothing yet: every
// byte arrives, in order.
func TestTransfer(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			client, server := pair(t, network)
			wrapped(t, client)
			data := make([]byte, 8<<20)
			for i := range data {
				data[i] = byte(rand.IntN(256))
			}
			want := sha256.Sum256(data)
			check := func(name string, r io.Reader) {
				h := sha256.New()
				buf := make([]byte, 7919)
				n, err := io.CopyBuffer(h, io.LimitReader(r, int64(len(data))), buf)
				if err != nil || n != int64(len(data)) || !bytes.Equal(h.Sum(nil), want[:]) {
					t.Errorf("%s: read %d of %d bytes (%v), digest equal %v", name, n, len(data), err, bytes.Equal(h.Sum(nil), want[:]))
				}
			}
			// The wrapped side writes; the plain side reads slowly at first.
			done := make(chan struct{})
			go func() {
				defer close(done)
				time.Sleep(50 * time.Millisecond)
				check("plain side", server)
			}()
			if n, err := client.Write(data); err != nil || n != len(data) {
				t.Fatalf("wrapped Write: %d, %v", n, err)
			}
			<-done
			// The plain side writes; the wrapped side reads.
			go func() { server.Write(data) }()
			check("wrapped side", client)
		})
	}
}

// TestEOF: a read after the peer closed returns io.EOF, bare, as net.Conn's does.
func TestEOF(t *testing.T) {
	client, server := pair(t, "tcp")
	server.Write([]byte("x"))
	server.Close()
	buf := make([]byte, 4)
	if n, err := client.Read(buf); n != 1 || err != nil {
		t.Fatalf("first read: %d, %v", n, err)
	}
	if n, err := client.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer closed: %d, %v; want 0, io.EOF", n, err)
	}
	if n, err := client.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty read: %d, %v", n, err)
	}
}

// TestDeadlines: a read with nothing to read and a write the peer does not drain end at
// their deadlines with a time-out error (os.ErrDeadlineExceeded, net.Error.Timeout).
func TestDeadlines(t *testing.T) {
	client, _ := pair(t, "tcp")
	timeout := func(op string, err error) {
		t.Helper()
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("%s past its deadline: %v (%T), want a time-out", op, err, err)
		}
	}
	client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	_, err := client.Read(make([]byte, 10))
	timeout("read", err)
	if waited := time.Since(start); waited < 40*time.Millisecond {
		t.Fatalf("read returned after %v, before its deadline", waited)
	}
	big := make([]byte, 64<<20) // more than the peer's buffers hold
	client.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := client.Write(big)
	timeout("write", err)
	if n <= 0 || n >= 64<<20 {
		t.Fatalf("write past its deadline reported %d bytes written", n)
	}
}

// TestCloseWhileReading: closing the connection ends a read that waits, with net.ErrClosed.
func TestCloseWhileReading(t *testing.T) {
	client, _ := pair(t, "tcp")
	errc := make(chan error, 1)
	go func() {
		_, err := client.Read(make([]byte, 10))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	client.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read ended by Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("read did not end when the connection closed")
	}
	if _, err := client.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v, want net.ErrClosed", err)
	}
}

// TestPeerReset: writing to a peer that reset the connection fails with the system
// call's error, wrapped as net.Conn wraps it (a *net.OpError around an *os.SyscallError).
func TestPeerReset(t *testing.T) {
	client, server := pair(t, "tcp")
	server.(*net.TCPConn).SetLinger(0) // Close sends RST
	server.Close()
	time.Sleep(20 * time.Millisecond)
	var err error
	for i := 0; i < 100 && err == nil; i++ { // the first write may still be accepted
		_, err = client.Write([]byte("hello"))
		time.Sleep(time.Millisecond)
	}
	var oe *net.OpError
	var se *os.SyscallError
	if !errors.As(err, &oe) || oe.Op != "write" || !errors.As(err, &se) ||
		!(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		t.Fatalf("write to a reset peer: %v (%T), want a *net.OpError of ECONNRESET or EPIPE", err, err)
	}
	_, err = client.Read(make([]byte, 4))
	if err == nil {
		t.Fatal("read from a reset peer succeeded")
	}
	// Writing on raises SIGPIPE with EPIPE, which the runtime ignores on a socket (as for
	// net.Conn's writes): the process lives, and the write fails.
	for i := 0; i < 10; i++ {
		if _, err = client.Write([]byte("hello")); err == nil {
			t.Fatal("write to a reset peer succeeded")
		}
	}
	if !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write after the reset was reported: %v, want EPIPE", err)
	}
}

// TestSyscallConn: a wrapped connection still gives its raw connection (go-redis checks
// a pooled connection's health through it).
func TestSyscallConn(t *testing.T) {
	client, _ := pair(t, "tcp")
	sc, ok := client.(syscall.Conn)
	if !ok {
		t.Fatalf("%T is not a syscall.Conn", client)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd uintptr
	if err := rc.Control(func(f uintptr) { fd = f }); err != nil || fd == 0 {
		t.Fatalf("Control: fd %d, %v", fd, err)
	}
}

// TestOthersUnwrapped: a connection other than TCP or Unix (here an in-memory pipe, as a
// TLS connection would be) is returned as it is, and so is every connection when rawio is
// turned off.
func TestOthersUnwrapped(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if c := Wrap(a); c != a {
		t.Fatalf("Wrap(pipe) = %T, want the pipe itself", c)
	}
	enabled = false
	defer func() { enabled = true }()
	tc, _ := pair(t, "tcp")
	if _, ok := tc.(*net.TCPConn); !ok {
		t.Fatalf("with SLUICE_RAW_IO=off, Dialer gave %T, want *net.TCPConn", tc)
	}
}

// TestNoAllocations: a read and a write through a Conn allocate nothing (the strict
// backend's batched Allow allocates nothing on the client, TestAllowAllocations).
func TestNoAllocations(t *testing.T) {
	client, server := pair(t, "tcp")
	msg, buf := []byte("ping"), make([]byte, 16)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := client.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(server, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
		if _, err := server.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(client, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("a write and a read through a Conn allocate %v times, want 0", allocs)
	}
}
