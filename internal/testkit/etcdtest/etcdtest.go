// Package etcdtest starts real etcd servers (Debian's etcd-server) for tests: one member on
// free loopback ports, its data in a temporary directory. A test can kill it with SIGKILL,
// restart it on the same ports with its data (a crash) or without (a wiped cluster: a new
// incarnation). Start one per test package (TestMain) and share it: an etcd takes a second
// or so to start.
//
// There is no mock: when etcd is not installed, the helpers fail with the package to
// install. They never skip.
package etcdtest

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/proctest"
)

// ErrNotInstalled is returned when etcd is not on the PATH.
var ErrNotInstalled = errors.New("etcdtest: etcd is needed on the PATH " +
	"(Debian: apt-get install etcd-server; scripts/test-deps installs it)")

// Server is one single-member etcd cluster. Its methods are safe for concurrent use.
type Server struct {
	Port     int // clients'
	PeerPort int
	dir      string

	proctest.Slot // the server's process: Kill, Pause, Resume
}

// Addr returns the client address, host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL returns the store URL the daemon and the demo take: etcd://host:port.
func (s *Server) URL() string { return "etcd://" + s.Addr() }

// Start starts an etcd on free loopback ports. The caller must Close it.
func Start() (*Server, error) {
	if _, err := exec.LookPath("etcd"); err != nil {
		return nil, ErrNotInstalled
	}
	dir, err := os.MkdirTemp("", "etcdtest-")
	if err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	var last error
	for range 5 {
		ports, err := proctest.FreePorts(2)
		if err != nil {
			last = err
			continue
		}
		s := &Server{Port: ports[0], PeerPort: ports[1], dir: dir}
		if err := s.Restart(); err != nil {
			last = err
			continue
		}
		return s, nil
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("etcdtest: could not start etcd: %w", last)
}

// New starts an etcd for the test and stops it when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Restart starts the server again on its ports (after Kill), with the data it had, or
// as a new cluster after Wipe. It returns once the server reports itself healthy.
func (s *Server) Restart() error {
	return s.Slot.Start("etcdtest", func() (*proctest.Proc, error) {
		peer := "http://127.0.0.1:" + strconv.Itoa(s.PeerPort)
		client := "http://" + s.Addr()
		cmd := exec.Command("etcd", "--name", "test", "--data-dir", filepath.Join(s.dir, "data"),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "test="+peer, "--log-level", "error",
			"--unsafe-no-fsync") // tests only: a kill -9 loses nothing the OS has
		hc := &http.Client{Timeout: time.Second}
		defer hc.CloseIdleConnections()
		p, err := proctest.Start(fmt.Sprintf("etcdtest: etcd on port %d", s.Port), cmd, filepath.Join(s.dir, "etcd.log"),
			20*time.Second, 20*time.Millisecond, func() bool {
				r, err := hc.Get(client + "/health")
				if err != nil {
					return false
				}
				r.Body.Close()
				return r.StatusCode == http.StatusOK
			})
		return p, err
	})
}

// Wipe kills the server and deletes its data: the next Restart begins a new cluster with
// no keys and its revisions from the start, as a cluster rebuilt from nothing.
func (s *Server) Wipe() error {
	s.Kill()
	if err := os.RemoveAll(filepath.Join(s.dir, "data")); err != nil {
		return fmt.Errorf("etcdtest: %w", err)
	}
	return nil
}

// Snapshot copies the server's data as it is now (the server paused for the copy: a crash
// image) and returns the copy's path for Rewind.
func (s *Server) Snapshot() (string, error) {
	snap, err := s.Slot.Snapshot(s.dir, filepath.Join(s.dir, "data"))
	if err != nil {
		return "", fmt.Errorf("etcdtest: snapshot: %w", err)
	}
	return snap, nil
}

// Rewind kills the server and puts back the data Snapshot copied: the next Restart comes
// back with the state it had then (a snapshot restored without --bump-revision: revisions go back), as a failover to a member that had
// not seen the writes since.
func (s *Server) Rewind(snap string) error {
	if err := s.Slot.Rewind(snap, filepath.Join(s.dir, "data")); err != nil {
		return fmt.Errorf("etcdtest: rewind: %w", err)
	}
	return nil
}

// Close kills the server and removes its directory.
func (s *Server) Close() {
	s.Kill()
	os.RemoveAll(s.dir)
}
