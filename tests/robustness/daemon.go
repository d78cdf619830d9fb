package robustness

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/proctest"
)

// SluiceBin is the sluice binary the daemon mode runs (ROBUST_SLUICE); "" builds one
// from the repository once per process.
var SluiceBin string

var (
	buildOnce sync.Once
	buildErr  error
)

// sluiceBin returns the binary, building it when none was given.
func sluiceBin() (string, error) {
	buildOnce.Do(func() {
		if SluiceBin != "" {
			return
		}
		dir, err := os.MkdirTemp("", "robust-sluice-")
		if err != nil {
			buildErr = err
			return
		}
		bin := filepath.Join(dir, "sluice")
		// Built in the library's module (the repository's root, two folders up), whose
		// go.sum covers the command's dependencies.
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
		cmd.Dir = filepath.Join("..", "..")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("robust: go build ./cmd/sluice: %v: %s", err, out)
			return
		}
		SluiceBin = bin
	})
	return SluiceBin, buildErr
}

// DaemonLeasePrefix is the prefix of the keys `sluice serve --backend lease` keeps in its
// store.
const DaemonLeasePrefix = "sluice:lease:"

// daemon is one slot's `sluice serve`: the redis back end through the slot's proxy to
// Redis, fail mode closed (the daemon mode), or the lease back end on Redis through it
// (daemon-lease), or the gossip back end with the other slots' daemons as peers
// (daemon-gossip); the workload's limits as its rules, the margin.
type daemon struct {
	slot      int
	args      []string
	line      string // its line protocol address
	http      string // its HTTP address (metrics)
	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{}
	stderr    proctest.LockedBuffer // every start's, in turn
	unplanned []string              // exits nobody asked for
	stopping  bool
	starts    int
}

func (r *runner) startDaemons() error {
	bin, err := sluiceBin()
	if err != nil {
		return err
	}
	var gossipBinds, gossipAddrs []string // daemon-gossip: each slot's membership bind address, and its proxy's
	if r.s.Mode == ModeDaemonGossip {
		for range r.s.Members {
			a, err := freeAddr()
			if err != nil {
				return err
			}
			gossipBinds = append(gossipBinds, a)
		}
		// Each daemon advertises its proxy (DaemonNet), where the schedule's network
		// faults between daemons act.
		if r.dnet, err = NewDaemonNet(gossipBinds, r.s.Seed); err != nil {
			return err
		}
		gossipAddrs = r.dnet.Addrs()
	}
	for slot := range r.s.Members {
		line, err := freeAddr()
		if err != nil {
			return err
		}
		http, err := freeAddr()
		if err != nil {
			return err
		}
		args := []string{bin, "serve", "--fail-mode", "closed",
			"--listen-line", line, "--listen-http", http, "--margin", Margin.String(), "--log-level", "error"}
		switch r.s.Mode {
		case ModeDaemon, ModeDaemonLease:
			toRedis, err := r.net.Proxy(fmt.Sprint("r", slot), r.srv.Addr())
			if err != nil {
				return err
			}
			if r.s.Mode == ModeDaemon {
				args = append(args, "--backend", "strict", "--store", "redis://"+toRedis)
			} else {
				args = append(args, "--backend", "lease", "--store", "redis://"+toRedis)
			}
		case ModeDaemonGossip:
			var peers []string
			for i, a := range gossipAddrs {
				if i != slot {
					peers = append(peers, a)
				}
			}
			args = append(args, "--backend", "gossip", "--gossip-bind", gossipBinds[slot], "--gossip-advertise", gossipAddrs[slot],
				"--peers", strings.Join(peers, ","))
		}
		for _, rule := range daemonRules(r.s.groups()) {
			args = append(args, "--limit", rule)
		}
		d := &daemon{slot: slot, args: args, line: line, http: http}
		r.daemons = append(r.daemons, d)
		if err := d.start(); err != nil {
			return err
		}
		// The member's link goes to the daemon, not to the store.
		r.net.mu.Lock()
		p := r.net.byName[fmt.Sprint("m", slot)]
		r.net.mu.Unlock()
		p.Stop()
		p.Upstream = line
		if err := p.Start(); err != nil {
			return err
		}
	}
	if r.s.Mode == ModeDaemonGossip {
		// Let the daemons join each other before the load starts (memberlist spreads a
		// join within a gossip round).
		time.Sleep(GossipSettle)
	}
	return nil
}

// daemonStarts counts the daemon processes started (restarts included): the gossip
// check's pool size.
func (r *runner) daemonStarts() int {
	n := 0
	for _, d := range r.daemons {
		d.mu.Lock()
		n += d.starts
		d.mu.Unlock()
	}
	return n
}

// start starts the daemon and waits until its line protocol answers.
func (d *daemon) start() error {
	d.mu.Lock()
	cmd := exec.Command(d.args[0], d.args[1:]...)
	cmd.Stderr = &d.stderr
	if err := cmd.Start(); err != nil {
		d.mu.Unlock()
		return fmt.Errorf("robust: start daemon %d: %w", d.slot, err)
	}
	done := make(chan struct{})
	d.cmd, d.done = cmd, done
	d.starts++
	d.mu.Unlock()
	go func() {
		err := cmd.Wait()
		d.mu.Lock()
		if !d.stopping && d.cmd == cmd {
			d.unplanned = append(d.unplanned, fmt.Sprint(err))
		}
		d.mu.Unlock()
		close(done)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", d.line, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("robust: daemon %d exited at start: %s", d.slot, tail(d.stderr.String(), 5))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("robust: daemon %d did not listen within 10 s: %v", d.slot, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill kills the daemon with SIGKILL (a planned exit) and waits for it. It reports false,
// and does nothing, when the daemon was down already.
func (d *daemon) kill() bool {
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.cmd = nil // its exit is planned
	d.mu.Unlock()
	if cmd == nil {
		return false
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-done
	return true
}

// up reports whether the daemon runs (started and not killed since).
func (d *daemon) up() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cmd != nil
}

func (d *daemon) signal(sig os.Signal) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		_ = d.cmd.Process.Signal(sig)
	}
}

// stopDaemons stops every daemon with SIGTERM, as an operator would, and reports those
// that exited unplanned during the run or did not stop cleanly. It is idempotent.
func (r *runner) stopDaemons() []Violation {
	var vs []Violation
	for _, d := range r.daemons {
		d.mu.Lock()
		cmd, done := d.cmd, d.done
		already := d.stopping
		d.stopping = true
		d.mu.Unlock()
		if already {
			continue
		}
		if cmd != nil {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
				if cmd.ProcessState != nil && !cmd.ProcessState.Success() {
					vs = append(vs, Violation{Check: "process", Detail: fmt.Sprintf("daemon %d exited %v on SIGTERM: %s", d.slot, cmd.ProcessState, tail(d.stderr.String(), 10))})
				}
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				vs = append(vs, Violation{Check: "process", Detail: fmt.Sprintf("daemon %d did not stop within 10 s of SIGTERM", d.slot)})
			}
		}
		for _, u := range d.unplanned {
			vs = append(vs, Violation{Check: "process", Detail: fmt.Sprintf("daemon %d died unplanned: %s: %s", d.slot, u, tail(d.stderr.String(), 10))})
		}
	}
	if len(vs) > 0 {
		return vs
	}
	return nil
}

// pollPools records, every 100 ms until stop, the pool size each gossip daemon counts
// (its sluice_gossip_members metric) as a Pool of its slot: a cut between daemons shows in
// it. Each daemon is read by a goroutine of its own, with a 1 s time-out (a loaded daemon
// answers late, and one paused or killed not at all: skipped).
func (r *runner) pollPools(stop <-chan struct{}) {
	var wg sync.WaitGroup
	for _, d := range r.daemons {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: time.Second}
			defer hc.CloseIdleConnections()
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				if n, ok := gossipMembers(hc, d.http); ok {
					r.mu.Lock()
					r.daemonPools = append(r.daemonPools, Pool{Proc: d.slot, At: time.Now().UnixNano(), Members: n})
					r.mu.Unlock()
				}
				select {
				case <-stop:
					return
				case <-t.C:
				}
			}
		}()
	}
	wg.Wait()
}

// gossipMembers reads a gossip daemon's sluice_gossip_members metric.
func gossipMembers(hc *http.Client, addr string) (int, bool) {
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "sluice_gossip_members "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err == nil
		}
	}
	return 0, false
}
