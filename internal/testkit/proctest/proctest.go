// Package proctest runs the real servers that test helpers start (etcd, ZooKeeper): a
// process in its own process group with its output in a log file, waited for until it
// answers, and killed with everything it started.
package proctest

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a running server process.
type Proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts cmd in its own process group, its output appended to logPath, and polls
// ready every poll until it reports true. A process that exits first, or is not ready
// within timeout, is an error quoting the log's last lines (name names the server).
func Start(name string, cmd *exec.Cmd, logPath string, timeout, poll time.Duration, ready func() bool) (*Proc, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a script and what it runs: killed together
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); log.Close(); close(p.done) }()
	deadline := time.Now().Add(timeout)
	for !ready() {
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited at start: %s", name, LogTail(logPath))
		default:
		}
		if time.Now().After(deadline) {
			p.Kill()
			return nil, fmt.Errorf("%s was not ready within %v: %s", name, timeout, LogTail(logPath))
		}
		time.Sleep(poll)
	}
	return p, nil
}

// Kill kills the process group with SIGKILL (after SIGCONT, so that a stopped one goes
// too) and waits for the process to exit.
func (p *Proc) Kill() {
	pid := p.cmd.Process.Pid
	syscall.Kill(-pid, syscall.SIGCONT)
	syscall.Kill(-pid, syscall.SIGKILL)
	<-p.done
}

// Signal sends sig to the process group (SIGSTOP pauses a server and what it started,
// SIGCONT continues it). After SIGSTOP it waits, up to 2 s, until every process of the
// group is stopped (Linux: state T in /proc), so that the server answers nothing once
// Signal returns (a signal is delivered asynchronously: a thread may finish a request
// first).
func (p *Proc) Signal(sig syscall.Signal) {
	pgid := p.cmd.Process.Pid
	syscall.Kill(-pgid, sig)
	if sig != syscall.SIGSTOP {
		return
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && !groupStopped(pgid); {
		time.Sleep(time.Millisecond)
	}
}

// groupStopped reports whether every process of the group pgid is stopped.
func groupStopped(pgid int) bool {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if d.Name()[0] < '0' || d.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so read after its ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 2 && f[2] == strconv.Itoa(pgid) && f[0] != "T" && f[0] != "t" && f[0] != "Z" {
			return false
		}
	}
	return true
}

// LogTail returns the last three lines of the log at path, joined by " | ".
func LogTail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.Join(lines, " | ")
}

// FreeAddr returns a free loopback TCP address (FreePort) for a server the test starts
// later, failing tb if there is none.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	p, err := FreePort(false)
	if err != nil {
		tb.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(p)
}

// FreePorts returns n distinct free TCP ports on loopback (FreePort).
func FreePorts(n int) ([]int, error) {
	var ports []int
	for len(ports) < n {
		p, err := FreePort(false)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// FreePort returns a loopback port that is free for TCP (and for UDP too with udp), drawn
// at random below the system's ephemeral range (Linux: 32768 and up). A port the system
// hands out for port 0 lies in that range, where any connection's source port may take it
// between the pick and the server's bind: a gossip daemon of the robustness suite failed
// to start so ("address already in use") once its peers' connections were open.
func FreePort(udp bool) (int, error) {
	for range 200 {
		p := 10000 + rand.IntN(22000) // 10000-31999
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		ok := true
		if udp {
			var u net.PacketConn
			if u, err = net.ListenPacket("udp", l.Addr().String()); err != nil {
				ok = false
			} else {
				u.Close()
			}
		}
		l.Close()
		if ok {
			return p, nil
		}
	}
	return 0, fmt.Errorf("proctest: no free loopback port below 32000 in 200 draws")
}

// Shared is a server a test package starts once, at the first test that needs it, and
// stops when its tests end (Close, from TestMain): real servers take a second or two to
// start, too long to start per test. The zero value is unusable: set Start.
type Shared[S interface{ Close() }] struct {
	Start func() (S, error)

	mu      sync.Mutex
	s       S
	started bool
}

// Get returns the server, starting it at the first call. It fails the test if the server
// cannot be started (the error names the package to install when it is missing).
func (p *Shared[S]) Get(t testing.TB) S {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.started {
		s, err := p.Start()
		if err != nil {
			t.Fatal(err)
		}
		p.s, p.started = s, true
	}
	return p.s
}

// Close stops the server if it was started.
func (p *Shared[S]) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		p.s.Close()
		p.started = false
	}
}

// Slot is a restartable test server's process: nil while it is down. A server keeps one
// and says how it starts; Slot does the killing, pausing and guarding of the rest.
type Slot struct {
	mu   sync.Mutex
	proc *Proc
}

// Start runs start, under the slot's lock, unless a process is running (then it returns
// an error naming what, e.g. "etcdtest: server already running").
func (s *Slot) Start(what string, start func() (*Proc, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return fmt.Errorf("%s: server already running", what)
	}
	p, err := start()
	if err != nil {
		return err
	}
	s.proc = p
	return nil
}

// Kill kills the running process, if any, with SIGKILL and waits for it to exit.
func (s *Slot) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.Kill()
		s.proc = nil
	}
}

// Pause stops the running process with SIGSTOP: connections stay open and nothing
// answers, as a server that hangs. Resume continues it.
func (s *Slot) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused process with SIGCONT.
func (s *Slot) Resume() { s.signal(syscall.SIGCONT) }

func (s *Slot) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.Signal(sig)
	}
}

// Snapshot copies the directory data to a new directory under parent, with the slot's
// process paused for the copy (SIGSTOP: a crash image, which a server that survives a
// crash recovers from), and returns the copy's path for Rewind.
func (s *Slot) Snapshot(parent, data string) (string, error) {
	snap, err := os.MkdirTemp(parent, "snap-")
	if err != nil {
		return "", err
	}
	s.Pause()
	defer s.Resume()
	return snap, copyDir(data, filepath.Join(snap, "data"))
}

// Rewind kills the slot's process and puts the copy snap (from Snapshot) in place of the
// directory data: the next start comes back with the state it had then.
func (s *Slot) Rewind(snap, data string) error {
	s.Kill()
	if err := os.RemoveAll(data); err != nil {
		return err
	}
	return os.Rename(filepath.Join(snap, "data"), data)
}

// copyDir copies the tree src (directories and regular files, with their modes) to dst,
// which must not exist.
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Mkdir(to, info.Mode().Perm())
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		return copySparse(path, to, info.Mode().Perm(), info.Size())
	})
}

// copySparse copies the file src to dst, leaving holes for its holes and its blocks of
// zeros: etcd and ZooKeeper preallocate their logs (64 MB each, mostly unwritten), and
// reading or writing those out would keep the server paused for seconds on a loaded
// machine. The data's extents are found with SEEK_DATA and SEEK_HOLE where the file
// system has them.
func copySparse(src, dst string, perm os.FileMode, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	copyRange := func(from, to int64) error {
		for off := from; off < to; {
			n, err := in.ReadAt(buf[:min(int64(len(buf)), to-off)], off)
			if n > 0 && !allZero(buf[:n]) {
				if _, err := out.WriteAt(buf[:n], off); err != nil {
					return err
				}
			}
			off += int64(n)
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	const seekData, seekHole = 3, 4 // lseek(2)'s SEEK_DATA and SEEK_HOLE
	for off := int64(0); off < size; {
		data, err := syscall.Seek(int(in.Fd()), off, seekData)
		if err == syscall.ENXIO {
			break // no data after off
		}
		if err != nil { // no SEEK_DATA here: copy the rest
			err = copyRange(off, size)
			if err != nil {
				out.Close()
				return err
			}
			break
		}
		hole, err := syscall.Seek(int(in.Fd()), data, seekHole)
		if err != nil {
			hole = size
		}
		if err := copyRange(data, hole); err != nil {
			out.Close()
			return err
		}
		off = hole
	}
	if err := out.Truncate(size); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

var zeros = make([]byte, 64<<10)

func allZero(b []byte) bool { return bytes.Equal(b, zeros[:len(b)]) }

// LockedBuffer is a bytes.Buffer safe for a writer and a reader in different goroutines:
// a process's standard error, written by os/exec's copier while a test reads it.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
