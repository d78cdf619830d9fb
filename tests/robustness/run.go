package robustness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// DumpDir, when set (ROBUST_DUMP), is where each run writes its members' records, one
// file per seed (robust-SEED.txt).
var DumpDir string

// Result is what one run found.
type Result struct {
	Schedule   Schedule
	Ops        int // calls the members made
	Uses       int // grants they used
	Violations []Violation
	Notes      []string
	Errors     map[string]int // calls by outcome other than granted and denied
	Excess     float64        // gossip: the largest excess over any window, in permits
	Pools      []Pool         // gossip: the pool sizes the members counted
	Start      int64          // the run's start, real Unix nanoseconds
	Elapsed    time.Duration
	Owners     []Fault // gossip modes: the owner faults injected, each with the target found as it started
}

// member is one running member process.
type member struct {
	proc, slot int
	cmd        *exec.Cmd
	stderr     bytes.Buffer
	lines      []string
	read       chan struct{} // closed once its output is read
	killed     bool
	stdin      io.WriteCloser // a gossip member's control lines (its links); nil otherwise
}

// runner executes one schedule.
type runner struct {
	s      Schedule
	exe    string
	srv    *redistest.Server // the Redis modes' store
	store  storeServer       // the store of every mode but gossip (srv, in the Redis modes)
	net    *Net
	addrs  []string // each slot's proxy address
	prefix string
	t0     time.Time

	daemons []*daemon  // the daemon mode's, by slot
	dnet    *DaemonNet // the daemon-gossip mode's network between the daemons
	// daemonPools: the pool sizes the gossip daemons counted (pollPools).
	daemonPools []Pool

	mu      sync.Mutex
	members []*member
	procs   int       // member processes numbered so far
	current []*member // each slot's running member
	losses  [][2]int64
	rewinds [][2]int64
	stopped map[int][][2]int64
	errs    []string

	// The gossip mode's network faults in force, by fault number, and their times.
	netFaults map[int]Fault
	splits    [][2]int64
	lateBy    time.Duration
	lossy     bool

	daemonStopped bool    // a daemon was paused (daemon_stop)
	owners        []Fault // the owner faults injected, their targets found
}

type dump struct {
	data string
	ttl  time.Duration
}

// Run executes the schedule s: a fresh redis-server, a proxy per member slot, members
// re-executed from exe (the test binary, whose TestMain calls MemberMain when MemberEnv is
// set), the faults at their times; then it checks the history.
func Run(ctx context.Context, s Schedule, exe string) (Result, error) {
	start := time.Now()
	r := &runner{s: s, exe: exe, prefix: fmt.Sprintf("rb%d:", s.Seed), stopped: map[int][][2]int64{},
		current: make([]*member, s.Members), netFaults: map[int]Fault{}}
	if s.Mode == ModeGossip {
		// No store: each slot's address is the member's own (UDP and TCP), its peers the
		// other slots'.
		for range s.Members {
			a, err := freeAddr()
			if err != nil {
				return Result{}, err
			}
			r.addrs = append(r.addrs, a)
		}
	} else {
		r.net = NewNet()
		defer r.net.Close()
		upstream := "127.0.0.1:1" // the daemon modes re-point the members' links at the daemons
		st, err := startStore(s.Mode)
		if err != nil {
			return Result{}, err
		}
		if st != nil {
			defer st.Close()
			r.store, upstream = st, st.Addr()
			r.srv, _ = st.(*redistest.Server)
		}
		for i := range s.Members {
			a, err := r.net.Proxy(fmt.Sprint("m", i), upstream)
			if err != nil {
				return Result{}, err
			}
			r.addrs = append(r.addrs, a)
		}
	}
	if s.Mode == ModeDaemonLease {
		// The daemons' store, as a deploy would find it: unfenced.
		if err := waitUnfenced(ctx, ModeLease, r.store.Addr(), DaemonLeasePrefix); err != nil {
			return Result{}, err
		}
	}
	if isDaemon(s.Mode) {
		// Each slot's daemon reaches Redis through its own proxy ("r"), and the member
		// reaches its daemon through the slot's proxy ("m"), which is re-pointed there.
		err := r.startDaemons()
		if r.dnet != nil {
			defer r.dnet.Close() // after the daemons stop (deferred below, run first)
		}
		if err != nil {
			return Result{}, err
		}
		defer r.stopDaemons()
	}
	if isLease(s.Mode) {
		if err := waitUnfenced(ctx, s.Mode, r.store.Addr(), r.prefix); err != nil {
			return Result{}, err
		}
	}
	r.t0 = time.Now()
	for slot := range s.Members {
		if err := r.startMember(slot, s.Duration); err != nil {
			return Result{}, err
		}
	}
	var wg sync.WaitGroup
	stopPoll := func() {}
	if s.Mode == ModeDaemonGossip {
		stop := make(chan struct{})
		polled := make(chan struct{})
		go func() {
			defer close(polled)
			r.pollPools(stop)
		}()
		stopPoll = sync.OnceFunc(func() { close(stop); <-polled })
		defer stopPoll()
	}
	for i, f := range s.Faults {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.inject(ctx, i, f)
		}()
	}
	wg.Wait()
	r.closeControl()
	h, vs := r.collect(ctx)
	stopPoll()
	h.Pools = append(h.Pools, r.daemonPools...)
	if isDaemon(s.Mode) {
		vs = append(vs, r.stopDaemons()...)
	}
	t0 := r.t0.UnixNano()
	res := Result{Schedule: s, Ops: len(h.Ops), Uses: len(h.Uses), Errors: map[string]int{}, Pools: h.Pools, Start: t0, Owners: r.owners}
	res.Notes = append(res.Notes, r.errs...)
	for _, o := range h.Ops {
		if o.Outcome != "granted" && o.Outcome != "denied" {
			res.Errors[o.Outcome]++
		}
	}
	res.Violations = append(res.Violations, vs...)
	res.Violations = append(res.Violations, CheckLiveness(h, t0)...)
	switch s.Mode {
	case ModeStrict, ModeStrictLocal:
		v, notes := CheckStrict(h, t0)
		res.Violations = append(res.Violations, v...)
		res.Notes = append(res.Notes, notes...)
	case ModeLease, ModeLeaseEtcd, ModeLeaseZK:
		res.Violations = append(res.Violations, CheckLeases(h, t0)...)
	case ModeGossip, ModeDaemonGossip:
		nodes := len(r.members) // the gossip members, or the daemons each started
		if s.Mode == ModeDaemonGossip {
			nodes = r.daemonStarts()
		}
		v, excess, note := CheckGossip(h, t0, nodes, len(h.Stopped) > 0 || r.daemonStopped, s.groups())
		res.Violations = append(res.Violations, v...)
		res.Excess = excess
		res.Notes = append(res.Notes, note)
	}
	if s.Mode == ModeStrictLocal {
		res.Violations = append(res.Violations, CheckFallback(h, t0, LocalShare(s.Members))...)
	}
	// The referee judges what one shared state decided: in the strict-local mode the
	// grants Redis made (the fallbacks' are judged at their shares above). The gossip
	// mode over-admits by its documented bound, which CheckGossip judges instead.
	var keep func(Use) bool
	if s.Mode == ModeStrictLocal {
		keep = func(u Use) bool { return OnRedisClock(u.Slot) }
	}
	if s.Mode != ModeGossip && s.Mode != ModeDaemonGossip {
		res.Violations = append(res.Violations, CheckReferee(h, t0, keep)...)
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// since is the time since the run's start.
func (r *runner) since() time.Duration { return time.Since(r.t0) }

// startMember starts a new member process in slot for d.
func (r *runner) startMember(slot int, d time.Duration) error {
	// Numbered under the lock, once: two slots restarted at once must not share a number
	// (the records would merge, and two gossip members would share a name; seen as one
	// "member" at 1.5 times the limit, seed 1035).
	r.mu.Lock()
	proc := r.procs
	r.procs++
	r.mu.Unlock()
	cfg := MemberConfig{Mode: r.s.Mode, Proc: proc, Addr: r.addrs[slot], Prefix: r.prefix, Goroutines: r.s.Goroutines,
		Duration: d, Skew: r.s.Skews[slot], Seed: r.s.Seed, Members: r.s.Members, Groups: r.s.Groups, Calm: r.s.Calm,
		RelayAbove: r.s.RelayAbove}
	if r.s.Mode == ModeGossip {
		cfg.Bind, cfg.Settle = r.addrs[slot], GossipSettle
		r.mu.Lock()
		ls := r.links()
		r.mu.Unlock()
		for i, a := range r.addrs {
			if i != slot {
				cfg.Peers = append(cfg.Peers, a)
				cfg.Links = append(cfg.Links, ls[slot][i].line(a))
			}
		}
	}
	js, _ := json.Marshal(cfg)
	m := &member{proc: proc, slot: slot, cmd: exec.Command(r.exe, "-test.run", "^$"), read: make(chan struct{})}
	m.cmd.Env = append(os.Environ(), MemberEnv+"="+string(js))
	m.cmd.Stderr = &m.stderr
	if r.s.Mode == ModeGossip {
		var err error
		if m.stdin, err = m.cmd.StdinPipe(); err != nil {
			return err
		}
	}
	stdout, err := m.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := m.cmd.Start(); err != nil {
		return fmt.Errorf("robust: start member %d: %w", proc, err)
	}
	go func() {
		defer close(m.read)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			m.lines = append(m.lines, sc.Text())
		}
	}()
	r.mu.Lock()
	r.members = append(r.members, m)
	r.current[slot] = m
	if m.stdin != nil {
		r.tellLinks(m) // the network faults in force when it starts
	}
	r.mu.Unlock()
	return nil
}

// links computes each link's faults from the gossip network faults in force: links[i][j]
// is what member slot i's traffic to slot j suffers. Faults on one link add up.
func (r *runner) links() [][]Link {
	ls := make([][]Link, r.s.Members)
	for i := range ls {
		ls[i] = make([]Link, r.s.Members)
	}
	both := func(a, b int, f func(*Link)) {
		f(&ls[a][b])
		f(&ls[b][a])
	}
	for _, f := range r.netFaults {
		for peer := range r.s.Members {
			if peer == f.Target || (f.Kind == FaultLinkCut && peer != f.Peer) {
				continue
			}
			both(f.Target, peer, func(l *Link) {
				switch f.Kind {
				case FaultPeerPartition, FaultLinkCut:
					l.Cut = true
				case FaultPeerLoss:
					l.Loss = 1 - (1-l.Loss)*(1-float64(f.Loss)/100)
				case FaultPeerDelay:
					l.Delay += time.Duration(f.Latency) * time.Millisecond
					l.Jitter += time.Duration(f.Jitter) * time.Millisecond
				}
			})
		}
	}
	return ls
}

// tellLinks writes member m's links to its peers to its control input (r.mu held). A
// member killed cannot read them: the write's error is ignored.
func (r *runner) tellLinks(m *member) {
	ls := r.links()
	var b strings.Builder
	for peer, a := range r.addrs {
		if peer != m.slot {
			b.WriteString(ls[m.slot][peer].line(a))
		}
	}
	_, _ = io.WriteString(m.stdin, b.String())
}

// setNetFault puts the gossip network fault f (the i-th) in force, or ends it, and tells
// every running member its links.
func (r *runner) setNetFault(i int, f Fault, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on {
		r.netFaults[i] = f
	} else {
		delete(r.netFaults, i)
	}
	for _, m := range r.current {
		if m != nil && !m.killed && m.stdin != nil {
			r.tellLinks(m)
		}
	}
	if r.dnet != nil {
		r.dnet.SetLinks(r.links())
	}
}

// closeControl closes every member's control input once the faults are over: a gossip
// member's reader of it ends there.
func (r *runner) closeControl() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.members {
		if m.stdin != nil {
			m.stdin.Close()
		}
	}
}

// sleepUntil sleeps until d after the run's start, or ctx's end.
func (r *runner) sleepUntil(ctx context.Context, d time.Duration) {
	t := time.NewTimer(time.Until(r.t0.Add(d)))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (r *runner) note(format string, args ...any) {
	r.mu.Lock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// inject applies fault f (the i-th) at its time and undoes it after its duration.
func (r *runner) inject(ctx context.Context, i int, f Fault) {
	r.sleepUntil(ctx, f.At)
	if isOwnerFault(f.Kind) {
		// The key's owner now: the fault is the member's (or daemon's) kill, or its cut
		// from every peer.
		slot, owner, names, ok := r.owner(f.Key)
		if !ok {
			r.note("fault %s: no process up to target", f)
			return
		}
		f.Target = slot
		r.note("fault %s: the owner is member %d (%s, of %s)", f, slot, owner, strings.Join(names, " "))
		r.mu.Lock()
		r.owners = append(r.owners, f)
		r.mu.Unlock()
		switch {
		case f.Kind == FaultOwnerPartition:
			f.Kind = FaultPeerPartition
		case r.s.Mode == ModeDaemonGossip:
			f.Kind = FaultDaemonKill
		default:
			f.Kind = FaultMemberKill
		}
	}
	if f.Kind == FaultAllocatorKill {
		slot, holder, ok := r.allocator(ctx)
		if !ok {
			r.note("fault %s: no allocator up to target", f)
			return
		}
		r.note("fault %s: the allocator is member %d (%s)", f, slot, holder)
		f.Target, f.Kind = slot, FaultMemberKill
	}
	name := fmt.Sprintf("f%d", i)
	proxy := fmt.Sprint(f.Link, f.Target)
	var undo func()
	toxic := func(kind string, attrs map[string]int, streams ...string) {
		for _, st := range streams {
			if err := r.net.AddToxic(proxy, name+st, kind, st, attrs); err != nil {
				r.note("fault %s: %v", f, err)
			}
		}
		undo = func() {
			for _, st := range streams {
				_ = r.net.RemoveToxic(proxy, name+st)
			}
		}
	}
	switch f.Kind {
	case FaultLatency:
		toxic("latency", map[string]int{"latency": f.Latency, "jitter": f.Jitter}, "downstream", "upstream")
	case FaultBandwidth:
		toxic("bandwidth", map[string]int{"rate": f.Rate}, "downstream", "upstream")
	case FaultTimeout:
		toxic("timeout", map[string]int{"timeout": f.Timeout}, "upstream")
	case FaultResetPeer:
		toxic("reset_peer", map[string]int{"timeout": 0}, "upstream")
	case FaultBlackHole:
		toxic("timeout", map[string]int{"timeout": 0}, "upstream", "downstream")
	case FaultPartition:
		for slot := range r.s.Members {
			p := fmt.Sprint("m", slot)
			if err := r.net.AddToxic(p, name, "timeout", "upstream", map[string]int{"timeout": 0}); err != nil {
				r.note("fault %s: %v", f, err)
			}
		}
		undo = func() {
			for slot := range r.s.Members {
				_ = r.net.RemoveToxic(fmt.Sprint("m", slot), name)
			}
		}
	case FaultProxyDown:
		_ = r.net.Down(proxy)
		undo = func() {
			if err := r.net.Up(proxy); err != nil {
				r.note("fault %s: proxy up: %v", f, err)
			}
		}
	case FaultMemberKill:
		r.mu.Lock()
		m := r.current[f.Target]
		if m.killed {
			// Killed already by an owner fault (whose target the schedule did not know):
			// that fault starts the slot's next member.
			r.mu.Unlock()
			r.note("fault %s: skipped, the member is down already", f)
			return
		}
		m.killed = true
		r.mu.Unlock()
		_ = m.cmd.Process.Signal(syscall.SIGKILL)
		undo = func() {
			if left := r.s.Duration - r.since(); left > 500*time.Millisecond {
				if err := r.startMember(f.Target, left); err != nil {
					r.note("fault %s: restart: %v", f, err)
				}
			}
		}
	case FaultMemberStop:
		r.mu.Lock()
		m := r.current[f.Target]
		r.mu.Unlock()
		if m.killed {
			r.note("fault %s: skipped, the member is down", f) // by an owner fault
			return
		}
		from := time.Now().UnixNano()
		_ = m.cmd.Process.Signal(syscall.SIGSTOP)
		undo = func() {
			_ = m.cmd.Process.Signal(syscall.SIGCONT)
			r.mu.Lock()
			r.stopped[m.proc] = append(r.stopped[m.proc], [2]int64{from, time.Now().UnixNano()})
			r.mu.Unlock()
		}
	case FaultPeerPartition, FaultLinkCut, FaultPeerLoss, FaultPeerDelay:
		from := time.Now().UnixNano()
		r.setNetFault(i, f, true)
		undo = func() {
			r.setNetFault(i, f, false)
			r.mu.Lock()
			defer r.mu.Unlock()
			switch f.Kind {
			case FaultPeerPartition, FaultLinkCut:
				r.splits = append(r.splits, [2]int64{from, time.Now().UnixNano()})
			case FaultPeerLoss:
				r.lossy = true
			case FaultPeerDelay:
				r.lateBy = max(r.lateBy, time.Duration(f.Latency+f.Jitter)*time.Millisecond)
			}
		}
	case FaultDaemonKill:
		d := r.daemons[f.Target]
		if !d.kill() {
			r.note("fault %s: skipped, the daemon is down already", f) // as for member_kill
			return
		}
		undo = func() {
			if err := d.start(); err != nil {
				r.note("fault %s: restart the daemon: %v", f, err)
			}
		}
	case FaultDaemonStop:
		d := r.daemons[f.Target]
		r.mu.Lock()
		r.daemonStopped = true
		r.mu.Unlock()
		d.signal(syscall.SIGSTOP)
		undo = func() { d.signal(syscall.SIGCONT) }
	case FaultRedisStop:
		r.srv.Pause()
		undo = r.srv.Resume
	case FaultRedisEmpty:
		from := time.Now().UnixNano()
		r.srv.Kill()
		undo = func() {
			if err := r.srv.Restart(); err != nil {
				r.note("fault %s: restart redis: %v", f, err)
			}
			r.mu.Lock()
			r.losses = append(r.losses, [2]int64{from, time.Now().UnixNano()})
			r.mu.Unlock()
		}
	case FaultStoreStop:
		r.store.Pause()
		undo = r.store.Resume
	case FaultStoreKill, FaultStoreWipe:
		from := time.Now().UnixNano()
		r.store.Kill()
		if w, ok := r.store.(wiper); ok && f.Kind == FaultStoreWipe {
			if err := w.Wipe(); err != nil {
				r.note("fault %s: %v", f, err)
			}
		}
		undo = func() {
			if err := r.store.Restart(); err != nil {
				r.note("fault %s: restart the store: %v", f, err)
			}
			if f.Kind == FaultStoreWipe {
				r.mu.Lock()
				r.losses = append(r.losses, [2]int64{from, time.Now().UnixNano()})
				r.mu.Unlock()
			}
		}
	case FaultRestoreOld:
		if rw, ok := r.store.(rewinder); ok && r.srv == nil {
			// etcd, ZooKeeper: a copy of the data directory now, put back after.
			snap, err := rw.Snapshot()
			if err != nil {
				r.note("fault %s: %v", f, err)
				break
			}
			undo = func() { r.rewindStore(rw, snap) }
			break
		}
		dumps := r.dump(ctx)
		undo = func() { r.restore(ctx, dumps) }
	}
	r.sleepUntil(ctx, f.At+f.For)
	if undo != nil {
		undo()
	}
}

// dump takes a DUMP of every key of the run's Redis (the members' under the run's prefix,
// and the daemons').
func (r *runner) dump(ctx context.Context) map[string]dump {
	c := goredis.NewClient(&goredis.Options{Addr: r.srv.Addr(), DisableIdentity: true})
	defer c.Close()
	out := map[string]dump{}
	iter := c.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		data, err := c.Dump(ctx, k).Result()
		if err != nil {
			continue
		}
		ttl, _ := c.PTTL(ctx, k).Result()
		out[k] = dump{data, ttl}
	}
	if err := iter.Err(); err != nil {
		r.note("fault restore_old: dump: %v", err)
	}
	return out
}

// restore writes an old DUMP back over the keys (RESTORE ... REPLACE): the writes since
// are lost, as in a failover to a replica that lagged.
func (r *runner) restore(ctx context.Context, dumps map[string]dump) {
	c := goredis.NewClient(&goredis.Options{Addr: r.srv.Addr(), DisableIdentity: true})
	defer c.Close()
	from := time.Now().UnixNano()
	for k, d := range dumps {
		ttl := d.ttl
		if ttl <= 0 {
			ttl = 0 // no expiry
		}
		if err := c.RestoreReplace(ctx, k, ttl, d.data).Err(); err != nil {
			r.note("fault restore_old: restore %s: %v", k, err)
		}
	}
	r.mu.Lock()
	r.losses = append(r.losses, [2]int64{from, time.Now().UnixNano()})
	r.rewinds = append(r.rewinds, r.losses[len(r.losses)-1])
	r.mu.Unlock()
}

// rewindStore kills the store (etcd, ZooKeeper), puts back the data directory snapshot
// snap copied, and restarts it: the records, and their versions (etcd's revisions,
// ZooKeeper's zxids), go back to what they were then, as in a failover to a member that
// had not seen the writes since. The lease mode's fence (a member presenting a version
// newer than the record's) must catch it.
func (r *runner) rewindStore(rw rewinder, snap string) {
	from := time.Now().UnixNano()
	if err := rw.Rewind(snap); err != nil {
		r.note("fault restore_old: %v", err)
	}
	if err := r.store.Restart(); err != nil {
		r.note("fault restore_old: restart the store: %v", err)
	}
	r.mu.Lock()
	r.losses = append(r.losses, [2]int64{from, time.Now().UnixNano()})
	r.rewinds = append(r.rewinds, r.losses[len(r.losses)-1])
	r.mu.Unlock()
}

// collect waits for every member, reads their records, and reports members that died
// unplanned or did not finish.
func (r *runner) collect(ctx context.Context) (*History, []Violation) {
	var vs []Violation
	h := &History{Stopped: r.stopped, Losses: r.losses, Rewinds: r.rewinds, Splits: r.splits, LateBy: r.lateBy, Lossy: r.lossy}
	r.mu.Lock()
	ms := append([]*member(nil), r.members...)
	r.mu.Unlock()
	deadline := time.After(r.s.Duration + 30*time.Second - r.since())
	for _, m := range ms {
		done := make(chan error, 1)
		go func() {
			<-m.read
			done <- m.cmd.Wait()
		}()
		var err error
		select {
		case err = <-done:
		case <-deadline:
			_ = m.cmd.Process.Signal(syscall.SIGKILL)
			err = <-done
			vs = append(vs, Violation{Check: "process", Detail: fmt.Sprintf("member %d did not finish 30 s after its run ended: killed", m.proc)})
		case <-ctx.Done():
			_ = m.cmd.Process.Signal(syscall.SIGKILL)
			err = <-done
		}
		if err != nil && !m.killed {
			vs = append(vs, Violation{Check: "process", Detail: fmt.Sprintf("member %d (slot %d) died unplanned: %v: %s", m.proc, m.slot, err, tail(m.stderr.String(), 40))})
		}
		for _, l := range m.lines {
			if err := h.parseLine(l); err != nil && !m.killed {
				vs = append(vs, Violation{Check: "process", Detail: err.Error()})
			}
		}
	}
	sort.Slice(h.Losses, func(i, j int) bool { return h.Losses[i][0] < h.Losses[j][0] })
	if DumpDir != "" {
		var b strings.Builder
		fmt.Fprintf(&b, "# seed %d mode %s start %d\n", r.s.Seed, r.s.Mode, r.t0.UnixNano())
		for _, l := range h.Losses {
			fmt.Fprintf(&b, "# loss %d %d\n", l[0], l[1])
		}
		for _, m := range ms {
			for _, l := range m.lines {
				b.WriteString(l + "\n")
			}
		}
		path := filepath.Join(DumpDir, fmt.Sprintf("robust-%d.txt", r.s.Seed))
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			r.note("history: %v", err)
		}
	}
	return h, vs
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Line is the run's one-line report.
func (res Result) Line(i int) string {
	status := "ok"
	if len(res.Violations) > 0 {
		status = "FAIL"
	}
	var errs []string
	for k, v := range res.Errors {
		errs = append(errs, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(errs)
	owners := ""
	if len(res.Owners) > 0 {
		owners = fmt.Sprintf(" (%d on a key's owner)", len(res.Owners))
	}
	return fmt.Sprintf("run %d seed %d %s: %s, %d faults%s, %d operations (%d grants used; %s), %d violations, %.1fs",
		i, res.Schedule.Seed, res.Schedule.Mode, status, res.Schedule.FaultCount(), owners, res.Ops, res.Uses, strings.Join(errs, ", "), len(res.Violations), res.Elapsed.Seconds())
}

// freeAddr returns a loopback address whose TCP and UDP ports were both free a moment ago.
func freeAddr() (string, error) {
	p, err := proctest.FreePort(true)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// allocator returns the slot of a live member that holds a lease limit's ballot (its
// allocator: docs/lease.md, "Crowded limits: the relay"), read from the run's Redis, and
// its name.
func (r *runner) allocator(ctx context.Context) (slot int, holder string, ok bool) {
	c := goredis.NewClient(&goredis.Options{Addr: r.srv.Addr(), DisableIdentity: true})
	defer c.Close()
	iter := c.Scan(ctx, 0, r.prefix+"*|alloc", 1000).Iterator()
	var holders []string
	for iter.Next(ctx) {
		v, err := c.Get(ctx, iter.Val()).Result()
		if err != nil {
			continue
		}
		// A record's value is "VERSION DATA" (store/redis), the data the ballot's JSON.
		_, data, _ := strings.Cut(v, " ")
		var bl struct {
			Holder string `json:"h"`
		}
		if json.Unmarshal([]byte(data), &bl) == nil && bl.Holder != "" {
			holders = append(holders, bl.Holder)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range holders {
		for s, m := range r.current {
			if m != nil && !m.killed && fmt.Sprint("m", m.proc) == h {
				return s, h, true
			}
		}
	}
	return 0, "", false
}
