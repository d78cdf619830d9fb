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
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/proctest"
)

// ErrSentinelNotInstalled is returned when redis-sentinel is not on the PATH.
var ErrSentinelNotInstalled = errors.New("redistest: redis-sentinel is needed on the PATH " +
	"(Debian: apt-get install redis-sentinel; scripts/test-deps installs it)")

// MasterName is the name the sentinels of a Sentinels set monitor their master under.
const MasterName = "sluicetest"

// SentinelConfig sets a Sentinel set's timings.
type SentinelConfig struct {
	// DownAfter is how long the master may not answer before a sentinel thinks it down
	// (sentinel down-after-milliseconds; default 500 ms).
	DownAfter time.Duration
	// FailoverTimeout is sentinel failover-timeout (default 3 s).
	FailoverTimeout time.Duration
	// Replicas is the number of replicas (default 1).
	Replicas int
	// MasterArgs are extra redis-server arguments for the master and the replica, as
	// "--min-replicas-to-write", "1".
	MasterArgs []string
}

// Sentinels is a master, its replicas (one by default) and three redis-sentinel
// processes that monitor it with quorum 2, each its own process on a free loopback port.
// The sentinels promote a replica when the master fails (SIGKILL) or on Failover.
//
// After a failover the old master, if alive, goes on as a master until the sentinels
// make it a replica of the new one, about 10 s later: with one replica, the new master
// has none until then.
type Sentinels struct {
	Master    *Server
	Replica   *Server   // the first replica
	Replicas  []*Server // all of them
	Sentinels []*Server
	cfg       SentinelConfig
}

// Addrs returns the sentinels' host:port.
func (s *Sentinels) Addrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		out[i] = n.Addr()
	}
	return out
}

// URL returns the set's redis-sentinel:// URL (the sentinels and the master's name), the
// form strict.Open and the CLI's --redis-url read.
func (s *Sentinels) URL() string {
	return "redis-sentinel://" + strings.Join(s.Addrs(), ",") + "/" + MasterName
}

// StartSentinels starts a master, its replica (in sync before it returns) and three
// sentinels that all know the master, the replica and each other (SENTINEL CKQUORUM
// reports 3 usable sentinels). The caller must Close it.
func StartSentinels(cfg SentinelConfig) (*Sentinels, error) {
	if _, err := exec.LookPath("redis-sentinel"); err != nil {
		return nil, ErrSentinelNotInstalled
	}
	if cfg.DownAfter <= 0 {
		cfg.DownAfter = 500 * time.Millisecond
	}
	if cfg.FailoverTimeout <= 0 {
		cfg.FailoverTimeout = 3 * time.Second
	}
	s := &Sentinels{cfg: cfg}
	var err error
	// A replica's first sync is sent at once (the default waits 5 s for more replicas).
	args := append([]string{"--repl-diskless-sync-delay", "0"}, cfg.MasterArgs...)
	if s.Master, err = startArgs(args, ""); err != nil {
		return nil, err
	}
	for range max(1, cfg.Replicas) {
		r, err := startArgs(append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(s.Master.Port)}, args...), "")
		if err != nil {
			s.Close()
			return nil, err
		}
		s.Replicas = append(s.Replicas, r)
	}
	s.Replica = s.Replicas[0]
	// In sync: the master's writes stream to every replica. A replica's link is up, and
	// the master reports it online, before that: after a diskless first sync the master
	// streams writes to it only from its first acknowledgement (sent once a second), and
	// a promotion before then loses what was written meanwhile. So: each replica's link
	// up, then a write, and each replica's offset at least the master's after it.
	for _, r := range s.Replicas {
		if err := waitFor(10*time.Second, func() (bool, string) {
			info, err := r.Do("INFO", "replication")
			return err == nil && strings.Contains(info, "master_link_status:up"), info
		}); err != nil {
			s.Close()
			return nil, fmt.Errorf("redistest: replica %s not in sync: %w", r.Addr(), err)
		}
	}
	for _, cmd := range [][]string{{"SET", "redistest:sync", "1"}, {"DEL", "redistest:sync"}} {
		if _, err := s.Master.Do(cmd...); err != nil {
			s.Close()
			return nil, fmt.Errorf("redistest: %w", err)
		}
	}
	info, _ := s.Master.Do("INFO", "replication")
	want := infoInt(info, "master_repl_offset")
	for _, r := range s.Replicas {
		if err := waitFor(10*time.Second, func() (bool, string) {
			info, err := r.Do("INFO", "replication")
			return err == nil && infoInt(info, "slave_repl_offset") >= want, info
		}); err != nil {
			s.Close()
			return nil, fmt.Errorf("redistest: replica %s not in sync: %w", r.Addr(), err)
		}
	}
	// Each sentinel is told of the replica and of the others (their ids are set here), so
	// the set is whole at once instead of after rounds of hello messages (seconds).
	ports, err := proctest.FreePorts(3)
	if err != nil {
		s.Close()
		return nil, err
	}
	for i := range ports {
		n, err := s.startSentinel(ports, i)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.Sentinels = append(s.Sentinels, n)
	}
	for _, n := range s.Sentinels {
		if err := waitFor(20*time.Second, func() (bool, string) {
			q, err := n.Do("SENTINEL", "CKQUORUM", MasterName)
			if err != nil || !strings.Contains(q, "3 usable") {
				return false, q
			}
			r, err := doStrings(n.Addr(), "SENTINEL", "REPLICAS", MasterName)
			return err == nil && len(r) > 0, fmt.Sprint(r, err)
		}); err != nil {
			s.Close()
			return nil, fmt.Errorf("redistest: sentinel %s does not know the set: %w", n.Addr(), err)
		}
	}
	return s, nil
}

// NewSentinels starts a Sentinel set for the test and stops it when the test ends.
func NewSentinels(t testing.TB, cfg SentinelConfig) *Sentinels {
	t.Helper()
	s, err := StartSentinels(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func sentinelID(i int) string { return fmt.Sprintf("%040x", 0x5e0+i) }

// startSentinel starts the i-th sentinel on ports[i], knowing the others on ports.
func (s *Sentinels) startSentinel(ports []int, i int) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-sentinel-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	port, m := ports[i], MasterName
	var b strings.Builder
	fmt.Fprintf(&b, "port %d\nbind 127.0.0.1\ndaemonize no\ndir %s\nsentinel myid %s\n", port, dir, sentinelID(i))
	fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d 2\n", m, s.Master.Port)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s %d\n", m, s.cfg.DownAfter.Milliseconds())
	fmt.Fprintf(&b, "sentinel failover-timeout %s %d\n", m, s.cfg.FailoverTimeout.Milliseconds())
	fmt.Fprintf(&b, "sentinel parallel-syncs %s 1\n", m)
	for _, r := range s.Replicas {
		fmt.Fprintf(&b, "sentinel known-replica %s 127.0.0.1 %d\n", m, r.Port)
	}
	for j, p := range ports {
		if j != i {
			fmt.Fprintf(&b, "sentinel known-sentinel %s 127.0.0.1 %d %s\n", m, p, sentinelID(j))
		}
	}
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redistest: %w", err)
	}
	n := &Server{Port: port, dir: dir, sentinelConf: conf}
	if err := n.Restart(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redistest: could not start redis-sentinel: %w", err)
	}
	return n, nil
}

// MasterAddr returns the master's host:port as the first sentinel that answers reports it.
func (s *Sentinels) MasterAddr() (string, error) {
	var last error
	for _, n := range s.Sentinels {
		r, err := doStrings(n.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
		if err == nil && len(r) == 2 {
			return net.JoinHostPort(r[0], r[1]), nil
		}
		last = fmt.Errorf("%v %v", r, err)
	}
	return "", fmt.Errorf("redistest: no sentinel names the master: %v", last)
}

// Failover asks a sentinel to fail over now (SENTINEL FAILOVER: the replica is promoted
// without the others' agreement, the old master is made its replica).
func (s *Sentinels) Failover() error {
	_, err := s.Sentinels[0].Do("SENTINEL", "FAILOVER", MasterName)
	return err
}

// WaitPromoted waits until every sentinel names a master other than old (host:port) and
// that server answers as a master. It returns the new master's address.
func (s *Sentinels) WaitPromoted(old string, within time.Duration) (string, error) {
	var addr string
	err := waitFor(within, func() (bool, string) {
		for _, n := range s.Sentinels {
			r, err := doStrings(n.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
			if err != nil || len(r) != 2 || net.JoinHostPort(r[0], r[1]) == old {
				return false, fmt.Sprint(n.Addr(), r, err)
			}
			addr = net.JoinHostPort(r[0], r[1])
		}
		info, err := do(addr, "ROLE")
		return err == nil && info == "*3", fmt.Sprint(addr, " ROLE ", info, err)
	})
	return addr, err
}

// ServerAt returns the set's data server (master or replica) at addr, or nil.
func (s *Sentinels) ServerAt(addr string) *Server {
	for _, n := range append([]*Server{s.Master}, s.Replicas...) {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Close kills every process of the set and removes their directories.
func (s *Sentinels) Close() {
	for _, n := range s.Sentinels {
		n.Close()
	}
	if s.Master != nil {
		s.Master.Close()
	}
	for _, n := range s.Replicas {
		n.Close()
	}
}

// infoInt returns the integer field name of an INFO reply (-1 if absent).
func infoInt(info, name string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// waitFor polls cond every 20 ms until it holds, or fails after within with cond's last
// word.
func waitFor(within time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(within)
	for {
		ok, last := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v: %s", within, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// doStrings sends one command and reads a reply that is an array of bulk strings (or
// nil); another reply is an error quoting it.
func doStrings(addr string, args ...string) ([]string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(encode(args)); err != nil {
		return nil, err
	}
	rd := bufio.NewReader(c)
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("redistest: %v: not an array: %q", args, line)
	}
	n, _ := strconv.Atoi(line[1:])
	var out []string
	for i := 0; i < n; i++ {
		h, err := rd.ReadString('\n')
		if err != nil {
			return nil, err
		}
		h = strings.TrimRight(h, "\r\n")
		switch {
		case strings.HasPrefix(h, "$"):
			size, _ := strconv.Atoi(h[1:])
			buf := make([]byte, size+2)
			if _, err := io.ReadFull(rd, buf); err != nil {
				return nil, err
			}
			out = append(out, string(buf[:size]))
		case strings.HasPrefix(h, "*"):
			// A nested array (SENTINEL REPLICAS): count it, skip its elements.
			m, _ := strconv.Atoi(h[1:])
			for j := 0; j < 2*m; j++ {
				if _, err := rd.ReadString('\n'); err != nil {
					return nil, err
				}
			}
			out = append(out, h)
		default:
			out = append(out, h)
		}
	}
	return out, nil
}
