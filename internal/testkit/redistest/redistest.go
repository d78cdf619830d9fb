// Package redistest starts real redis-server processes for tests: single servers,
// 3-master clusters, and Sentinel sets (a master, a replica and three redis-sentinel
// processes), on free loopback ports, with no persistence, in temporary directories.
// A test can kill a server with SIGKILL and restart it on the same port. Everything is
// cleaned up when the test (or the caller of Close) is done.
//
// There is no mock: when redis-server is not installed, the helpers fail the test with a
// message that says how to install it. They never skip.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/proctest"
)

// ErrNotInstalled is returned when redis-server (or redis-cli, for clusters) is not on the
// PATH.
var ErrNotInstalled = errors.New("redistest: redis-server and redis-cli are needed on the PATH " +
	"(Debian: apt-get install redis-server redis-tools; .ci/run installs them)")

// Server is one redis-server process. Its methods are safe for concurrent use.
type Server struct {
	Port    int
	dir     string
	cluster bool
	extra   []string // further redis-server arguments
	// sentinelConf, if set, makes the server a redis-sentinel reading this config file.
	sentinelConf string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL returns the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Start starts a single redis-server on a free loopback port. The caller must Close it.
func Start() (*Server, error) { return start(false) }

// startArgs starts a single redis-server with extra arguments; dir, if set, is its
// directory (made anew otherwise).
func startArgs(extra []string, dir string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNotInstalled
	}
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "redistest-"); err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
	}
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort(false)
		if err != nil {
			last = err
			continue
		}
		s := &Server{Port: port, dir: dir, extra: extra}
		if err := s.Restart(); err != nil {
			last = err
			continue
		}
		return s, nil
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redistest: could not start redis-server: %w", last)
}

// New starts a single redis-server for the test and stops it when the test ends. It fails
// the test if redis-server cannot be started.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func start(cluster bool) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNotInstalled
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort(cluster)
		if err != nil {
			last = err
			continue
		}
		s := &Server{Port: port, dir: dir, cluster: cluster}
		if err := s.Restart(); err != nil {
			last = err
			continue
		}
		return s, nil
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redistest: could not start redis-server: %w", last)
}

// freePort finds a free loopback port (proctest.FreePort: below the ephemeral range); for
// a cluster node, port+10000 (its bus) must be free too.
func freePort(cluster bool) (int, error) {
	for i := 0; i < 50; i++ {
		port, err := proctest.FreePort(false)
		if err != nil {
			return 0, err
		}
		if !cluster {
			return port, nil
		}
		if port+10000 >= 32768 { // the bus below the ephemeral range too
			continue
		}
		if bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
			bus.Close()
			return port, nil
		}
	}
	return 0, errors.New("redistest: no free port")
}

// Restart starts the server again on its port (after Kill). It returns once the server
// answers PING.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("redistest: server already running")
	}
	args := []string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--loglevel", "warning", "--daemonize", "no",
	}
	if s.cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+strconv.Itoa(s.Port)+".conf",
			"--cluster-node-timeout", "2000")
	}
	args = append(args, s.extra...)
	cmd := exec.Command("redis-server", args...)
	if s.sentinelConf != "" {
		cmd = exec.Command("redis-sentinel", s.sentinelConf)
	}
	log, err := os.OpenFile(filepath.Join(s.dir, "redis-"+strconv.Itoa(s.Port)+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.Addr()); err == nil {
			break
		}
		select {
		case <-done:
			return fmt.Errorf("redistest: redis-server on port %d exited at start: %s", s.Port, s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("redistest: redis-server on port %d did not answer PING: %s", s.Port, s.logTail())
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.cmd, s.done = cmd, done
	return nil
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis-"+strconv.Itoa(s.Port)+".log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.Join(lines, " | ")
}

// Kill kills the server with SIGKILL (kill -9) and waits for it to exit. Its data is
// lost (no persistence), and so is its script cache.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGCONT) // a paused process dies on SIGKILL too, but be plain
	s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

// Pause stops the server with SIGSTOP: connections stay open and nothing answers, as a
// hung or partitioned server. Resume continues it.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.cmd.Process.Signal(sig)
	}
}

// Close kills the server and removes its directory.
func (s *Server) Close() {
	s.Kill()
	if !s.cluster {
		os.RemoveAll(s.dir)
	}
}

// Do sends one command in the inline form and returns the first line of the reply. It is
// for tests and set-up (CONFIG, SCRIPT FLUSH, CLUSTER INFO), not for decisions.
func (s *Server) Do(args ...string) (string, error) { return do(s.Addr(), args...) }

func ping(addr string) error {
	r, err := do(addr, "PING")
	if err != nil {
		return err
	}
	if r != "+PONG" {
		return fmt.Errorf("redistest: PING answered %q", r)
	}
	return nil
}

// do sends one command in RESP and returns the reply's first line, and for a bulk
// string its content.
func do(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(encode(args)); err != nil {
		return "", err
	}
	rd := bufio.NewReader(c)
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if strings.HasPrefix(line, "$") {
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	if strings.HasPrefix(line, "-") {
		return line, fmt.Errorf("redistest: %s", line[1:])
	}
	return line, nil
}

// encode writes a command in RESP.
func encode(args []string) []byte {
	var sb strings.Builder
	fmt.Fprintf(&sb, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&sb, "$%d\r\n%s\r\n", len(a), a)
	}
	return []byte(sb.String())
}

// Cluster is a Redis Cluster of 3 masters and no replicas, made with
// `redis-cli --cluster create`.
type Cluster struct {
	Nodes []*Server
}

// Addrs returns the nodes' host:port.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// StartCluster starts 3 cluster-enabled servers and joins them into a cluster whose 16384
// slots are spread over the 3 masters. It returns once every node reports cluster_state:ok.
func StartCluster() (*Cluster, error) {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return nil, ErrNotInstalled
	}
	c := &Cluster{}
	for i := 0; i < 3; i++ {
		s, err := start(true)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w: %s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range c.Nodes {
		for {
			info, err := n.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				return nil, fmt.Errorf("redistest: cluster not ok after 20s: %q %v", info, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c, nil
}

// NewCluster starts a cluster for the test and stops it when the test ends.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Close kills every node and removes their directories.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		n.Kill()
		os.RemoveAll(n.dir)
	}
}
