package robustness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/gossip"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/lease"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/strict"
)

// MemberEnv, when set, makes the test binary a member process (see MemberMain): its
// value is the member's JSON config.
const MemberEnv = "SLUICE_ROBUST_MEMBER"

// Group is a limiter of the workload: its limits and the keys it decides.
type Group struct {
	Limits string
	Keys   []string
}

// Groups are the workload's limiters: one limit, and two limits at once.
var Groups = []Group{
	{Limits: "200/s burst=10", Keys: []string{"a0", "a1", "a2"}},
	{Limits: "100/s burst=6; 3000/m burst=100", Keys: []string{"b0", "b1"}},
}

// Margin is the limiters' jitter tolerance (sluice.WithMargin): a permit used later than
// its slot by more is given up instead (permit expiry, as in the Redis permit design), so
// the referee may judge the use times with it.
const Margin = 20 * time.Millisecond

// StallTick is how often a member looks at its clock; a look later than StallMin after
// the one before records a stall.
const (
	StallTick = 20 * time.Millisecond
	StallMin  = 200 * time.Millisecond
)

// GossipSettle is how long a gossip member waits for its peers after it starts, before its
// load starts (memberlist spreads a join within a gossip round).
const GossipSettle = 500 * time.Millisecond

// OpTimeout is each call's context time-out; MaxWait the limiters' maximum wait.
const (
	OpTimeout = time.Second
	MaxWait   = 300 * time.Millisecond
)

// MemberConfig is one member process's task.
type MemberConfig struct {
	Mode       Mode          `json:"mode"`
	Proc       int           `json:"proc"`
	Addr       string        `json:"addr"` // the member's proxy to Redis
	Prefix     string        `json:"prefix"`
	Goroutines int           `json:"goroutines"`
	Duration   time.Duration `json:"duration"`
	Skew       time.Duration `json:"skew"`
	Members    int           `json:"members"` // member slots in the run (the local fail mode's share is 1/Members)
	// Gossip: the member's own address (UDP and TCP) and its peers'.
	Bind  string   `json:"bind,omitempty"`
	Peers []string `json:"peers,omitempty"`
	// Settle: how long the member waits after it starts before its load starts (its
	// share of the duration): a gossip member joins its peers first.
	Settle time.Duration `json:"settle,omitempty"`
	// Links: a gossip member's links to its peers as it starts, as control lines (later
	// changes come on its standard input).
	Links []string `json:"links,omitempty"`
	Seed  uint64   `json:"seed"`
	// Groups: the workload's limiters (Schedule.Groups); nil: the package's Groups.
	Groups []Group `json:"groups,omitempty"`
	// Calm: no penalties, no reservations given back (Schedule.Calm).
	Calm bool `json:"calm,omitempty"`
	// RelayAbove: the lease members' relay threshold (Schedule.RelayAbove), 0: default.
	RelayAbove int `json:"relay_above,omitempty"`
}

// skewed is a clock offset from the real one by a constant: a machine whose clock is
// wrong by seconds.
type skewed struct {
	clock.Clock
	off time.Duration
}

func (s skewed) Now() time.Time { return s.Clock.Now().Add(s.off) }

// Nanotime is the monotonic clock, shifted only by a forward offset: a monotonic clock
// counts from an arbitrary origin, but never reads below zero.
func (s skewed) Nanotime() int64 { return s.Clock.Nanotime() + int64(max(s.off, 0)) }

// LocalShare is the share of each limit a member of the strict-local mode decides at
// while Redis is out of reach: 1/members, so that the pool's fallbacks together hold the
// limit's rate.
func LocalShare(members int) float64 { return 1 / float64(members) }

// out writes record lines to standard output one at a time, unbuffered.
type out struct{ mu sync.Mutex }

func (o *out) print(s string) {
	o.mu.Lock()
	os.Stdout.WriteString(s)
	o.mu.Unlock()
}

// MemberMain is one member process: it reads its config from MemberEnv, runs its
// goroutines' random requests for the config's duration, printing every record at once,
// closes everything and checks that no goroutine is left. It returns the exit code: 0,
// 2 for a bad set-up, 3 for a goroutine left behind.
func MemberMain() int {
	ignore := goleak.IgnoreCurrent()
	var cfg MemberConfig
	if err := json.Unmarshal([]byte(os.Getenv(MemberEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "robust member:", err)
		return 2
	}
	if code := runMember(cfg); code != 0 {
		return code
	}
	// goleak.Find retries for about a second; a goroutine may take a little longer to end
	// after Close (memberlist's probe of a peer in flight at Shutdown runs to its
	// time-out), so look again until GoroutineGrace has passed.
	for deadline := time.Now().Add(GoroutineGrace); ; {
		err := goleak.Find(ignore)
		if err == nil {
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "robust member: goroutine leak:", err)
			return 3
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// GoroutineGrace is how long after Close a member's goroutines may take to end: a
// goroutine still running then is a leak. memberlist's Shutdown does not wait for a probe
// in flight, which ends within its probe time-out and TCP fallback (about 1.5 s).
const GoroutineGrace = 5 * time.Second

func runMember(cfg MemberConfig) (code int) {
	clk := skewed{clock.NewReal(), cfg.Skew}
	var rec out
	var be backend.Backend
	var closeAll []func()
	var pool func() int // gossip: the pool size the member counts
	defer func() {
		for i := len(closeAll) - 1; i >= 0; i-- {
			closeAll[i]()
		}
	}()
	switch cfg.Mode {
	case ModeStrict, ModeStrictLocal:
		o, err := redisstore.ClientOptions("redis://"+cfg.Addr, strict.DefaultTimeout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "robust member:", err)
			return 2
		}
		client := goredis.NewClient(o)
		closeAll = append(closeAll, func() { client.Close() })
		opts := []strict.Option{strict.WithPrefix(cfg.Prefix), strict.WithClock(clk)}
		if cfg.Mode == ModeStrictLocal {
			opts = append(opts, strict.WithFailLocal(LocalShare(cfg.Members)))
		}
		b := strict.New(client, opts...)
		closeAll = append(closeAll, func() { b.Close() })
		be = b
	case ModeLease, ModeLeaseEtcd, ModeLeaseZK:
		store, closeStore, err := leaseStore(cfg.Mode, cfg.Addr, cfg.Prefix)
		if err != nil {
			fmt.Fprintln(os.Stderr, "robust member:", err)
			return 2
		}
		closeAll = append(closeAll, closeStore)
		var closing atomic.Bool // the limiters are closed: no share is in use any more
		obs := lease.ObserverFunc(func(s lease.Status) {
			if closing.Load() {
				return
			}
			rec.print(leaseRecord(cfg.Proc, s, time.Now().UnixNano(), clk.Nanotime()).line())
		})
		b, err := lease.New(store, lease.WithID(fmt.Sprint("m", cfg.Proc)), lease.WithClock(clk),
			lease.WithRenewEvery(100*time.Millisecond), lease.WithStoreTimeout(300*time.Millisecond), lease.WithObserver(obs),
			lease.WithRelayAbove(cfg.RelayAbove))
		if err != nil {
			fmt.Fprintln(os.Stderr, "robust member:", err)
			return 2
		}
		closeAll = append(closeAll, func() { b.Close() })
		// Runs first (closeAll runs backwards), once the limiters decide no more: the member
		// holds nothing from now on; Close hands the shares back to the store.
		closeAll = append(closeAll, func() {
			closing.Store(true)
			now := time.Now().UnixNano()
			for _, s := range b.Leases() {
				rec.print(Lease{Proc: cfg.Proc, Key: s.Key, T: s.Limit.T, From: now, Until: now, Asked: now}.line())
			}
		})
		be = b
	case ModeDaemon, ModeDaemonLease, ModeDaemonGossip:
		// A daemon on the lease back end answers in 100-300 ms under this load (it waits
		// for its store's rounds; seen on the loaded 2-core machine): at 300 ms the client
		// timed out, backed off (up to 5 s), and denied nearly every call for the whole
		// run. Its client waits longer and backs off for at most 500 ms.
		opts := []client.Option{client.WithFailMode(backend.FailClosed), client.WithTimeout(300 * time.Millisecond)}
		if cfg.Mode == ModeDaemonLease {
			opts = append(opts, client.WithTimeout(time.Second), client.WithBackoff(100*time.Millisecond, 500*time.Millisecond), client.WithConns(cfg.Goroutines))
		}
		c := client.New(cfg.Addr, opts...)
		be = c.Backend()
		closeAll = append(closeAll, func() { be.Close() })
	case ModeGossip:
		gc := gossip.DefaultConfig()
		gc.Bind, gc.Peers, gc.Name, gc.Clock = cfg.Bind, cfg.Peers, memberName(cfg.Proc), clk
		// The links' faults: those in force when the member was started, then the runner's
		// control lines, read from now on (before the member joins its peers, so that a
		// member started during a cut stays cut; they end, EOF, once the run's faults are
		// over, and so does this reader). The real transport is put under them in New.
		ft := NewFaultTransport(nil, cfg.Seed<<8|uint64(cfg.Proc))
		for _, l := range cfg.Links {
			addr, link, err := parseLink(l)
			if err != nil {
				fmt.Fprintln(os.Stderr, "robust member:", err)
				return 2
			}
			ft.SetLink(addr, link)
		}
		links := make(chan error, 1)
		go func() { links <- readLinks(os.Stdin, ft) }()
		gc.WrapTransport = func(t memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
			ft.NodeAwareTransport = t
			return ft
		}
		b, err := gossip.New(gc)
		if err != nil {
			fmt.Fprintln(os.Stderr, "robust member:", err)
			return 2
		}
		closeAll = append(closeAll, func() { b.Close() })
		be = b
		pool = b.Members
		defer func() {
			if err := <-links; err != nil {
				fmt.Fprintln(os.Stderr, "robust member:", err)
				code = 2
			}
		}()
	default:
		fmt.Fprintln(os.Stderr, "robust member: unknown mode", cfg.Mode)
		return 2
	}
	groups := Groups
	if cfg.Groups != nil {
		groups = cfg.Groups
	}
	lims := make([]*sluice.Limiter, len(groups))
	for i, g := range groups {
		l, err := sluice.New(sluice.MustParse(g.Limits), sluice.WithBackend(be), sluice.WithClock(clk),
			sluice.WithMargin(Margin), sluice.WithMaxWait(MaxWait))
		if err != nil {
			fmt.Fprintln(os.Stderr, "robust member:", err)
			return 2
		}
		closeAll = append(closeAll, func() { l.Close() })
		lims[i] = l
	}
	var poolWG sync.WaitGroup
	poolStop := make(chan struct{})
	defer func() { close(poolStop); poolWG.Wait() }()
	if pool != nil {
		// The pool size the member counts, every 100 ms from its start (before the settle
		// time): a cut shows in it.
		poolWG.Add(1)
		go func() {
			defer poolWG.Done()
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				rec.print(Pool{Proc: cfg.Proc, At: time.Now().UnixNano(), Members: pool()}.line())
				select {
				case <-poolStop:
					return
				case <-t.C:
				}
			}
		}()
	}
	time.Sleep(cfg.Settle)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration-cfg.Settle)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // stalls: spans the process was not run, as its own ticker saw them
		defer wg.Done()
		t := time.NewTicker(StallTick)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := time.Now()
			if now.Sub(last) > StallMin {
				rec.print(Stall{Proc: cfg.Proc, From: last.UnixNano(), To: now.UnixNano()}.line())
			}
			last = now
		}
	}()
	for g := range cfg.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &worker{proc: cfg.Proc, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.Proc)<<16|uint64(g))), lims: lims, groups: groups, calm: cfg.Calm, rec: &rec, clk: clk, strict: cfg.Mode == ModeStrict || cfg.Mode == ModeStrictLocal, daemon: isDaemon(cfg.Mode), within: OpTimeout}
			if w.strict {
				w.within = strict.DefaultTimeout // the members' strict backends' time-out
			}
			for ctx.Err() == nil {
				w.step(ctx)
			}
		}()
	}
	wg.Wait()
	return 0
}

// readLinks applies the control lines from r to ft until r ends.
func readLinks(r io.Reader, ft *FaultTransport) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		addr, l, err := parseLink(sc.Text())
		if err != nil {
			return err
		}
		ft.SetLink(addr, l)
	}
	return sc.Err()
}

// worker is one goroutine of a member: random requests, each recorded.
type worker struct {
	proc int
	rng  *rand.Rand
	lims []*sluice.Limiter
	// groups are the workload's limiters, lims their limiters.
	groups []Group
	calm   bool // no penalties, no reservations given back: now-or-never calls and waits only
	rec    *out
	clk    clock.Clock
	// strict: slots are on Redis' clock (the machine's, in these runs).
	strict bool
	// daemon: the decisions are a daemon's, which tells no slot.
	daemon bool
	// within: the longest the backend takes to answer (see decidedFrom).
	within time.Duration
}

// leaseRecord is the record of a lease-mode member's status s, observed at realNow (real
// Unix nanoseconds) and clkNow (the member's clock, on which s is timed). The share holds
// from when the status was taken (s.At: its answer applied) for s.Expires: the observer may
// run much later (the process paused between the two; seed 5018), and counting from its
// own now would stretch the lease by the pause.
func leaseRecord(proc int, s lease.Status, realNow, clkNow int64) Lease {
	real := func(at int64) int64 { return realNow - (clkNow - at) }
	from := real(s.At)
	return Lease{Proc: proc, Key: s.Key, T: s.Limit.T, Rate: s.Rate, From: from, Until: from + int64(s.Expires), Asked: real(s.Asked)}
}

// decidedFrom is the earliest the backend may have decided the grant r, in real Unix
// nanoseconds: the call that got it, or, for a place the limiter's waiting room served
// (WaitN of one permit: a place reserved for another waiter before this call, and handed
// on when that waiter gave up), its answer's arrival less within, the longest the
// backend takes to answer. A grant's record starts there: a place decided before Redis
// lost its state and served after it is one of the lost writes (the failover bound's
// reservations), not a decision on the state restored (seed 7002, strict: such a place,
// recorded from its waiter's call, made the history look decided on two states at once).
func decidedFrom(call int64, r *sluice.Reservation, clk clock.Clock, within time.Duration) int64 {
	arrived := time.Now().UnixNano() - int64(clk.Now().Sub(r.TimeToAct())) - int64(r.Delay)
	if arrived >= call {
		return call
	}
	return arrived - int64(within)
}

// step makes one random request and records it (and any use of its permits).
func (w *worker) step(run context.Context) {
	gi := w.rng.IntN(len(w.groups))
	lim, g := w.lims[gi], w.groups[gi]
	key := g.Keys[w.rng.IntN(len(g.Keys))]
	n := int64(1 + w.rng.IntN(int(min(gcra.MaxCost(limitconv.Core(lim.Limits(), Margin)), 3))))
	ctx, cancel := context.WithTimeout(run, OpTimeout)
	defer cancel()
	op := Op{Proc: w.proc, Key: key, N: n, Timeout: OpTimeout, Call: time.Now().UnixNano()}
	pause := time.Duration(w.rng.IntN(4)) * time.Millisecond
	var r *sluice.Reservation
	var err error
	x := w.rng.IntN(50)
	if w.calm {
		x %= 30 // now-or-never calls and waits only
	}
	switch {
	case x < 14: // pessimistic: now or not at all
		op.Kind = "now"
		r, err = lim.ReserveWithin(ctx, key, n, 0)
	case x < 30: // wait for the permits, as a worker before its API call
		op.Kind = "wait"
		r, err = lim.WaitN(ctx, key, n)
		if err != nil && r != nil && r.Allowed {
			op.Outcome = "cancelled" // granted, and given back as the wait ended
		}
	case x < 42: // reserve; give back the far ones at once, wait for the others
		op.Kind = "reserve"
		r, err = lim.Reserve(ctx, key, n)
		if err == nil && r.Allowed {
			if r.Delay >= 100*time.Millisecond {
				_ = r.Cancel(ctx)
				op.Outcome = "cancelled"
			} else if err = r.Wait(ctx); err != nil {
				op.Outcome = "cancelled"
			}
		}
	case x < 49: // hold a reservation and give it up
		op.Kind = "hold"
		r, err = lim.ReserveWithin(ctx, key, n, 50*time.Millisecond)
		if err == nil && r.Allowed {
			_ = r.Cancel(ctx)
			op.Outcome = "cancelled"
		}
	default: // a worker got a 429: hold the whole pool back a little
		op.Kind = "penalize"
		err = lim.Penalize(ctx, key, w.clk.Now().Add(time.Duration(10+w.rng.IntN(40))*time.Millisecond))
		op.Return = time.Now().UnixNano()
		op.Outcome = "ok"
		if err != nil {
			op.Outcome = "error:" + errKind(err)
		}
		w.rec.print(op.line())
		time.Sleep(pause)
		return
	}
	op.Return = time.Now().UnixNano()
	switch {
	case op.Outcome != "":
	case err != nil:
		op.Outcome = "error:" + errKind(err)
	case r == nil || !r.Allowed:
		op.Outcome = "denied"
		if r != nil {
			pause += min(r.RetryAfter, 20*time.Millisecond)
		}
	default:
		// The permits are used now, unless now is past their slot by more than the margin
		// (a member paused, a slow wake-up): then they are given up, unused.
		// In the strict mode the slot is on Redis' clock, which is this machine's here: the
		// lateness counts from it, so that a slow answer (a toxic's latency) counts too.
		late := w.clk.Now().Sub(r.TimeToAct())
		switch {
		case w.strict && OnRedisClock(r.Slot()):
			late = time.Duration(time.Now().UnixNano() - r.Slot())
		case w.daemon:
			// The daemon decided after the call was made: the slot is no earlier than the
			// call plus the delay, so this is the most the use can be late.
			late = time.Duration(time.Now().UnixNano()-op.Call) - r.Delay
		}
		if late > Margin {
			op.Outcome = "expired"
			_ = r.Cancel(context.WithoutCancel(ctx))
			break
		}
		used := n
		if w.rng.IntN(4) == 0 {
			used = int64(w.rng.IntN(int(n))) // the real cost, known after the call: settled down
		}
		op.Outcome = "granted"
		if used > 0 {
			call := decidedFrom(op.Call, r, w.clk, w.within)
			w.rec.print(Use{Proc: w.proc, Key: key, N: used, Slot: r.Slot(), Call: call, At: op.Return}.line())
		}
		if used < n {
			_ = r.Settle(ctx, used)
		}
	}
	w.rec.print(op.line())
	time.Sleep(pause)
}

// errKind names an error by its kind for the record.
func errKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, sluice.ErrThrottled):
		return "throttled"
	case errors.Is(err, backend.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, backend.ErrClosed):
		return "closed"
	}
	return "other"
}
