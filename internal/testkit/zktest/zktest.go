// Package zktest starts real ZooKeeper servers (Debian's zookeeperd) for tests: one
// standalone server on a free loopback port, its data in a temporary directory. A test can
// kill it with SIGKILL, restart it on the same port with its data (a crash) or without (a
// wiped ensemble: a new incarnation). Start one per test package (TestMain) and share it:
// the JVM takes a second or two to start.
//
// There is no mock: when ZooKeeper is not installed, the helpers fail with the package to
// install. They never skip.
package zktest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/proctest"
)

// Script is the server's start script, as Debian's zookeeperd installs it.
const Script = "/usr/share/zookeeper/bin/zkServer.sh"

// ErrNotInstalled is returned when ZooKeeper's start script is missing.
var ErrNotInstalled = errors.New("zktest: ZooKeeper is needed (" + Script +
	"; Debian: apt-get install zookeeperd; scripts/test-deps installs it)")

// Server is one standalone ZooKeeper. Its methods are safe for concurrent use.
type Server struct {
	Port int
	dir  string

	proctest.Slot // the server's process: Kill, Pause, Resume
}

// Addr returns the client address, host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL returns the store URL the daemon and the demo take: zk://host:port.
func (s *Server) URL() string { return "zk://" + s.Addr() }

// Start starts a ZooKeeper on a free loopback port. The caller must Close it.
func Start() (*Server, error) {
	if _, err := os.Stat(Script); err != nil {
		return nil, ErrNotInstalled
	}
	if _, err := exec.LookPath("java"); err != nil {
		return nil, ErrNotInstalled
	}
	dir, err := os.MkdirTemp("", "zktest-")
	if err != nil {
		return nil, fmt.Errorf("zktest: %w", err)
	}
	var last error
	for range 5 {
		ports, err := proctest.FreePorts(1)
		if err != nil {
			last = err
			continue
		}
		s := &Server{Port: ports[0], dir: dir}
		if err := s.Restart(); err != nil {
			last = err
			continue
		}
		return s, nil
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("zktest: could not start ZooKeeper: %w", last)
}

// New starts a ZooKeeper for the test and stops it when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Restart starts the server again on its port (after Kill), with the data it had, or
// empty after Wipe. It returns once the server answers ruok.
func (s *Server) Restart() error {
	return s.Slot.Start("zktest", func() (*proctest.Proc, error) {
		cfg := fmt.Sprintf("tickTime=500\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\n"+
			"admin.enableServer=false\n4lw.commands.whitelist=ruok\nforceSync=no\n", filepath.Join(s.dir, "data"), s.Port)
		if err := os.WriteFile(filepath.Join(s.dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
			return nil, fmt.Errorf("zktest: %w", err)
		}
		cmd := exec.Command(Script, "start-foreground", filepath.Join(s.dir, "zoo.cfg"))
		cmd.Env = append(os.Environ(), "ZOOCFGDIR="+s.dir, "ZOO_LOG_DIR="+s.dir, "JVMFLAGS=-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1")
		p, err := proctest.Start(fmt.Sprintf("zktest: ZooKeeper on port %d", s.Port), cmd, filepath.Join(s.dir, "zk.out"),
			30*time.Second, 50*time.Millisecond, func() bool { return ruok(s.Addr()) })
		return p, err
	})
}

// ruok asks the four-letter word ruok: a serving server answers imok.
func ruok(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("ruok")); err != nil {
		return false
	}
	b := make([]byte, 4)
	n, _ := c.Read(b)
	return string(b[:n]) == "imok"
}

// Wipe kills the server and deletes its data: the next Restart begins with no znodes and
// zxids from the start, as an ensemble rebuilt from nothing.
func (s *Server) Wipe() error {
	s.Kill()
	if err := os.RemoveAll(filepath.Join(s.dir, "data")); err != nil {
		return fmt.Errorf("zktest: %w", err)
	}
	return nil
}

// Snapshot copies the server's data as it is now (the server paused for the copy: a crash
// image) and returns the copy's path for Rewind.
func (s *Server) Snapshot() (string, error) {
	snap, err := s.Slot.Snapshot(s.dir, filepath.Join(s.dir, "data"))
	if err != nil {
		return "", fmt.Errorf("zktest: snapshot: %w", err)
	}
	return snap, nil
}

// Rewind kills the server and puts back the data Snapshot copied: the next Restart comes
// back with the state it had then (its zxids go back), as a failover to a member that had
// not seen the writes since.
func (s *Server) Rewind(snap string) error {
	if err := s.Slot.Rewind(snap, filepath.Join(s.dir, "data")); err != nil {
		return fmt.Errorf("zktest: rewind: %w", err)
	}
	return nil
}

// Close kills the server and removes its directory.
func (s *Server) Close() {
	s.Kill()
	os.RemoveAll(s.dir)
}
