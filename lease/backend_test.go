package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/backendtest"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/lease/allot"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/store"
)

var bg = context.Background()

// TestConformance: a single member holding the whole limit decides exactly as the local
// backend does. Leases outlast the suite's virtual time, so renewals (which could shrink
// an idle member's share) never come into it.
func TestConformance(t *testing.T) {
	factory := func(t *testing.T, clk *clock.Virtual) backend.Backend {
		c := DefaultConfig()
		c.TTL = time.Hour
		c.JoinWindow = 0 // a single member: nobody to share the first burst with
		b, err := New(store.NewMemory(clk), WithConfig(c), WithClock(clk), WithRenewEvery(10*time.Minute), WithIdleAfter(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	backendtest.Run(t, factory)
	t.Run("Allower", func(t *testing.T) { backendtest.RunAllower(t, factory) })
}

// cluster is several members (backends) sharing one in-memory store in virtual time.
type cluster struct {
	t       *testing.T
	clk     *clock.Virtual
	store   *store.Memory
	cfg     Config
	cut     []*cutStore
	members []*Backend
	limit   gcra.Limit
	permits []int64
	granted []int64
	// waitedOnClock counts the calls cut because they waited on the virtual clock (run).
	waitedOnClock int
}

// cutStore is a member's link to the store, which a test can cut (a crash or partition).
type cutStore struct {
	store.Store
	cut atomic.Bool
}

func (c *cutStore) Load(ctx context.Context, ids []string) (store.Snapshot, error) {
	if c.cut.Load() {
		return store.Snapshot{}, backend.ErrUnavailable
	}
	return c.Store.Load(ctx, ids)
}

func (c *cutStore) Swap(ctx context.Context, ws []store.Write) ([]uint64, error) {
	if c.cut.Load() {
		return nil, backend.ErrUnavailable
	}
	return c.Store.Swap(ctx, ws)
}

func (c *cutStore) Bucket(ctx context.Context, id string, op store.BucketOp) (store.BucketResult, error) {
	if c.cut.Load() {
		return store.BucketResult{}, backend.ErrUnavailable
	}
	if b, ok := c.Store.(store.Buckets); ok {
		return b.Bucket(ctx, id, op)
	}
	return store.DoBucket(ctx, store.CASOnly(c), id, op, MaxAttempts)
}

func newCluster(t *testing.T, l gcra.Limit, n int, cfg Config) *cluster {
	clk := clock.NewVirtual()
	clk.Set(int64(time.Hour))
	// The test's goroutine both decides and moves the clock: a first decision that waited
	// for a join window would wait for ever.
	cfg.JoinWindow = 0
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, clk: clk, store: store.NewMemory(clk), cfg: cfg, limit: l}
	for range n {
		c.add()
	}
	t.Cleanup(func() {
		for _, m := range c.members {
			m.Close()
		}
	})
	return c
}

func (c *cluster) add() int {
	i := len(c.members)
	cs := &cutStore{Store: c.store}
	b, err := New(cs, WithConfig(c.cfg), WithClock(c.clk), WithID(fmt.Sprint("m", i)), WithRenewEvery(100*time.Millisecond),
		WithMemberConfig(MemberConfig{RenewEvery: 100 * time.Millisecond, Margin: 5 * time.Millisecond}))
	if err != nil {
		c.t.Fatal(err)
	}
	c.cut = append(c.cut, cs)
	c.members = append(c.members, b)
	c.granted = append(c.granted, 0)
	return i
}

// settle waits until every live member's renewal goroutine is parked on the clock.
func (c *cluster) settle(live int) {
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	if err := c.clk.BlockUntil(ctx, live); err != nil {
		c.t.Fatalf("members did not settle: %v", err)
	}
}

// run advances virtual time by d in steps of 1 ms; at each step, every member in busy
// tries to take permits until it is denied (saturated demand).
func (c *cluster) run(d time.Duration, busy []int, live int) {
	for end := c.clk.Nanotime() + int64(d); c.clk.Nanotime() < end; {
		c.clk.Advance(time.Millisecond)
		c.settle(live)
		// A call that waits on the clock (a windowed quota's member waiting for its draw,
		// which its renewal goroutine holds back until half a renewal interval after the
		// last request) would wait for ever: this goroutine moves the clock. It is cut
		// after a moment of real time and counts as no permit at this instant.
		ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
		for _, i := range busy {
			for range 50 {
				ok, err := c.members[i].AllowOne(ctx, "api", c.limit)
				if errors.Is(err, context.DeadlineExceeded) {
					c.waitedOnClock++
					break
				}
				if err != nil {
					c.t.Fatal(err)
				}
				if !ok {
					break
				}
				c.permits = append(c.permits, c.clk.Nanotime())
				c.granted[i]++
			}
		}
		cancel()
	}
}

// conform checks every permit granted against the limit, strictly.
func (c *cluster) conform() {
	c.t.Helper()
	ps := slices.Clone(c.permits)
	slices.Sort(ps)
	var tat int64
	for i, at := range ps {
		var ok bool
		if tat, ok = gcra.AllowOne(tat, c.limit, at); !ok {
			c.t.Fatalf("permit %d of %d at %v broke the limit", i, len(ps), time.Duration(at))
		}
	}
}

func (c *cluster) share(i int) Share {
	for _, st := range c.members[i].Leases() {
		return st.Share
	}
	return Share{}
}

// TestMembersShareALimit: three members with saturated demand on 100/s burst 9 end up
// with a third each, use the limit (no more), and never break it.
func TestMembersShareALimit(t *testing.T) {
	l := lim(100, time.Second, 9)
	c := newCluster(t, l, 3, DefaultConfig())
	c.run(3*time.Second, []int{0, 1, 2}, 3)
	for i := range 3 {
		if got := c.share(i); got.Burst != 3 || got.Rate < RateScale/3 || got.Rate > RateScale/3+1 {
			t.Errorf("member %d: share %+v, want a third", i, got)
		}
		t.Logf("member %d granted %d", i, c.granted[i])
	}
	c.conform()
	before := slices.Clone(c.granted)
	c.run(2*time.Second, []int{0, 1, 2}, 3)
	var total int64
	for i := range 3 {
		total += c.granted[i] - before[i]
	}
	// 2 s at 100/s: 200 permits (201 in a closed window); a third each, give or take the
	// rounding of shares.
	if total < 196 || total > 201 {
		t.Errorf("%d permits in 2 s at steady state, want about 200", total)
	}
	c.conform()
	loads, swaps := c.store.Ops()
	t.Logf("%d store reads and %d writes for 3 members over 5 s", loads, swaps)
	// Renewals every 100 ms, every 50 ms while held back in a contended pool: about 20 a
	// second each, whatever the request rate (a read and a write each).
	if ops := loads; ops > 3*5*24 {
		t.Errorf("%d store round trips for 3 members over 5 s: more than a handful a second each", ops)
	}
}

// TestCloseHandsTheShareBack: when a member closes, the others get its share at their next
// renewal, not after its lease would have ended.
func TestCloseHandsTheShareBack(t *testing.T) {
	l := lim(100, time.Second, 10)
	c := newCluster(t, l, 2, DefaultConfig())
	c.run(time.Second, []int{0, 1}, 2)
	if got := c.share(1); got.Rate != RateScale/2 {
		t.Fatalf("member 1 share %+v, want half", got)
	}
	if err := c.members[0].Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.members[0].Decide(bg, "api", backend.Request{Limits: []gcra.Limit{l}, N: 1}); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Decide after Close: %v", err)
	}
	c.run(250*time.Millisecond, []int{1}, 1)
	if got := c.share(1); got != (Share{Rate: RateScale, Burst: 10}) {
		t.Errorf("250 ms after the other closed: share %+v, want the whole limit", got)
	}
	c.conform()
}

// TestCrashedMemberReclaimed: a member cut off from the store (as a crashed one is) keeps
// deciding on its lease for TTL + Grace at most; its share goes to the other within TTL +
// Grace + a renewal interval, and the limit holds throughout.
func TestCrashedMemberReclaimed(t *testing.T) {
	l := lim(100, time.Second, 10)
	cfg := DefaultConfig() // TTL 1 s, Grace 500 ms
	c := newCluster(t, l, 2, cfg)
	c.run(time.Second, []int{0, 1}, 2)
	c.cut[0].cut.Store(true)
	cutAt := c.clk.Nanotime()
	var whole int64
	for range 2000 {
		c.run(time.Millisecond, []int{0, 1}, 2)
		if c.share(1).Rate == RateScale && whole == 0 {
			whole = c.clk.Nanotime() - cutAt
		}
	}
	t.Logf("the survivor had the whole limit %v after the cut", time.Duration(whole))
	if whole == 0 || whole > int64(cfg.TTL+cfg.Grace+100*time.Millisecond) {
		t.Errorf("the survivor had the whole limit %v after the cut, want within TTL + Grace + a renewal", time.Duration(whole))
	}
	if st := c.members[0].Leases()[0]; st.Expires != 0 || st.Err == nil {
		t.Errorf("the cut member still uses its lease: %+v", st)
	}
	c.conform()
}

// TestStoreRestart: the store restarts empty; members find their epochs stale, join again,
// and get nothing until every lease granted before has ended; the limit holds.
func TestStoreRestart(t *testing.T) {
	l := lim(100, time.Second, 10)
	c := newCluster(t, l, 2, DefaultConfig())
	c.run(time.Second, []int{0, 1}, 2)
	c.store.Restart()
	c.run(3*time.Second, []int{0, 1}, 2)
	for i := range 2 {
		if st := c.members[i].Leases()[0]; st.Share.Rate != RateScale/2 || st.Epoch.Incarnation == 0 {
			t.Errorf("member %d after the restart: %+v", i, st)
		}
	}
	c.conform()
}

// TestOutageFailLocal: a store outage shorter than the lease plus its grace goes
// unnoticed; a longer one stops the members (fail mode local), which resume afterwards.
func TestOutageFailLocal(t *testing.T) {
	l := lim(100, time.Second, 10)
	c := newCluster(t, l, 1, DefaultConfig())
	c.run(time.Second, []int{0}, 1)
	c.store.SetDown(true)
	before := c.granted[0]
	c.run(time.Second, []int{0}, 1)
	if got := c.granted[0] - before; got < 95 {
		t.Errorf("%d permits in the first second of the outage, want the full rate on the lease", got)
	}
	c.run(2*time.Second, []int{0}, 1)
	before = c.granted[0]
	c.run(time.Second, []int{0}, 1)
	if got := c.granted[0] - before; got != 0 {
		t.Errorf("%d permits 3 s into the outage, after the lease and its grace ended", got)
	}
	c.store.SetDown(false)
	c.run(time.Second, []int{0}, 1)
	if got := c.granted[0] - before; got < 50 {
		t.Errorf("%d permits in the second after the outage, want the member back", got)
	}
	c.conform()
}

// TestWaitForCapacity: a caller that may wait is served when the share arrives, rather
// than told to retry.
func TestWaitForCapacity(t *testing.T) {
	l := lim(10, time.Second, 2)
	cfg := DefaultConfig()
	cfg.JoinWindow = 0
	c := newCluster(t, l, 1, cfg)
	g, err := c.members[0].Decide(bg, "api", backend.Request{Limits: []gcra.Limit{l}, N: 2})
	if err != nil || !g.Allowed {
		t.Fatalf("first decision: %+v %v", g, err)
	}
	// A reservation within the lease is granted at once with a delay.
	g, err = c.members[0].Decide(bg, "api", backend.Request{Limits: []gcra.Limit{l}, N: 1, MaxDelay: time.Second})
	if err != nil || !g.Allowed || g.Delay != int64(100*time.Millisecond) {
		t.Fatalf("reservation: %+v %v", g, err)
	}
	if err := c.members[0].Penalize(bg, "api", []gcra.Limit{l}, time.Second); err != nil {
		t.Fatal(err)
	}
	if g, _ := c.members[0].Decide(bg, "api", backend.Request{Limits: []gcra.Limit{l}, N: 1}); g.Allowed || g.RetryAfter < int64(900*time.Millisecond) {
		t.Errorf("during the penalty: %+v", g.Result)
	}
}

// TestObserver: the hook sees the member's share after each answer from the store, and
// when the request it answers was sent.
func TestObserver(t *testing.T) {
	clk := clock.NewVirtual()
	clk.Advance(time.Second) // so that a request's time is not the zero value
	cfg := DefaultConfig()
	cfg.JoinWindow = 0
	st := store.NewMemory(clk)
	var mu sync.Mutex
	var seen []Status
	b, err := New(st, WithConfig(cfg), WithClock(clk), WithID("obs"), WithObserver(ObserverFunc(func(s Status) {
		mu.Lock()
		seen = append(seen, s)
		mu.Unlock()
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l := lim(10, time.Second, 5)
	if ok, err := b.AllowOne(bg, "k", l); !ok || err != nil {
		t.Fatalf("first permit: %v %v", ok, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 || seen[0].Key != "k" || seen[0].Member != "obs" || seen[0].Share != (Share{Rate: RateScale, Burst: 5}) || seen[0].Expires <= 0 || seen[0].Rate != 10 ||
		seen[0].Asked != int64(time.Second) {
		t.Errorf("observed %+v", seen)
	}
}

// gateStore holds the member's store calls while armed, until the test opens the gate: a
// renewal round stalled (its process paused) between sending and applying.
type gateStore struct {
	store.Store
	armed   atomic.Bool
	entered chan struct{}
	open    chan struct{}
}

func (g *gateStore) Load(ctx context.Context, ids []string) (store.Snapshot, error) {
	if g.armed.CompareAndSwap(true, false) {
		g.entered <- struct{}{}
		<-g.open
	}
	return g.Store.Load(ctx, ids)
}

// TestStallAcrossARenewal: a member paused across a renewal (its round sent, then nothing
// run until long after its lease ended) holds, once its answer is applied, no more than
// the lease that request earned: sent + TTL − margin + grace on its own clock, which has
// passed, so its status says nothing is usable (and its decisions do not use it). (The
// robustness suite's seed 5018 recorded such a share as valid a second longer: its
// observer counted from when it printed, after the pause; see Status.At.)
func TestStallAcrossARenewal(t *testing.T) {
	clk := clock.NewVirtual()
	clk.Set(int64(time.Hour))
	cfg := DefaultConfig()
	cfg.JoinWindow = 0
	gate := &gateStore{Store: store.NewMemory(clk), entered: make(chan struct{}), open: make(chan struct{})}
	statuses := make(chan Status, 16)
	b, err := New(gate, WithConfig(cfg), WithClock(clk), WithID("m"), WithRenewEvery(100*time.Millisecond),
		WithStoreTimeout(time.Hour), WithObserver(ObserverFunc(func(s Status) { statuses <- s })))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l := lim(100, time.Second, 10)
	if ok, err := b.AllowOne(bg, "k", l); !ok || err != nil {
		t.Fatalf("first permit: %v %v", ok, err)
	}
	first := <-statuses
	if first.Expires <= 0 {
		t.Fatalf("the first answer gave no usable lease: %+v", first)
	}
	// The next round stalls in the store call; the member's clock runs on past its lease.
	gate.armed.Store(true)
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	for stalled := false; !stalled; {
		if err := clk.BlockUntil(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clk.Advance(50 * time.Millisecond)
		select {
		case <-gate.entered:
			stalled = true
		case <-statuses:
		case <-time.After(10 * time.Millisecond):
		}
	}
	sent := clk.Nanotime() // the stalled round's request was sent by now
	mc := DefaultMemberConfig()
	clk.Advance(cfg.TTL + cfg.Grace + time.Second)
	close(gate.open)
	st := <-statuses
	if end := st.At + int64(st.Expires); st.Expires > 0 && end > sent+int64(cfg.TTL-mc.Margin+cfg.Grace) {
		t.Errorf("after the stall the share is usable until %v after its request, past the lease it earned (%v): %+v",
			time.Duration(end-st.Asked), cfg.TTL-mc.Margin+cfg.Grace, st)
	}
	if st.Expires != 0 {
		t.Errorf("the share is usable for %v after a stall past its lease, want 0", st.Expires)
	}
	if st.At < sent+int64(cfg.TTL+cfg.Grace) {
		t.Errorf("the status was taken at %v, before the stall ended", time.Duration(st.At-sent))
	}
}

func TestNewRejectsBadSettings(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, allot.ErrInvalidConfig) {
		t.Errorf("no store: %v", err)
	}
	st := store.NewMemory(nil)
	if _, err := New(st, WithRenewEvery(0)); !errors.Is(err, allot.ErrInvalidConfig) {
		t.Errorf("zero renewal: %v", err)
	}
	if _, err := New(st, WithConfig(Config{})); !errors.Is(err, allot.ErrInvalidConfig) {
		t.Errorf("zero config: %v", err)
	}
}

// TestPenaltyDrainsOnlyTheShortestLimit: with two limits, a settlement during a penalty
// leaves the longer limit's share as it was (gcra.Adjust's rule: a penalty drains only the
// limit with the smallest tolerance), so when the penalty ends the key goes on at the
// shorter limit's rate with the longer one's burst intact.
func TestPenaltyDrainsOnlyTheShortestLimit(t *testing.T) {
	short, long := lim(100, time.Second, 10), lim(4500, time.Hour, 100)
	ls := []gcra.Limit{short, long}
	c := newCluster(t, short, 1, DefaultConfig())
	m := c.members[0]
	g, err := m.Decide(bg, "api", backend.Request{Limits: ls, N: 1})
	if err != nil || !g.Allowed {
		t.Fatalf("first decision: %+v %v", g, err)
	}
	if err := m.Penalize(bg, "api", ls, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := m.Adjust(bg, "api", ls, g.Ticket, 0); err != nil { // cancelled during the penalty
		t.Fatal(err)
	}
	c.run(1100*time.Millisecond, nil, 1)
	if g, err := m.Decide(bg, "api", backend.Request{Limits: ls, N: 5}); err != nil || !g.Allowed {
		t.Errorf("100ms after the penalty, 5 permits: %+v %v (the hourly share was drained too)", g.Result, err)
	}
}

// TestSmallLimitDecidedAtTheStore: 2/s burst=1 shared by five busy members is too small to
// share out (one permit of burst, five members): it is decided at the store, one round trip
// per permit, with no over-admission, nearly all of the limit used, and the members
// served (whoever asks first after a permit frees: random here); when four leave, the last holds a share again and decides in process.
func TestSmallLimitDecidedAtTheStore(t *testing.T) {
	l := lim(2, time.Second, 1)
	c := newCluster(t, l, 5, DefaultConfig())
	// The members ask in a random order each millisecond: in a real pool, whoever asks
	// first after a permit frees gets it.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		c.run(time.Millisecond, rng.Perm(5), 5)
	}
	c.conform()
	var total int64
	served := 0
	for _, n := range c.granted {
		total += n
		if n > 0 {
			served++
		}
	}
	if served < 3 {
		t.Errorf("%d of five members served in 10 s (%v)", served, c.granted)
	}
	if total < 18 {
		t.Errorf("%d permits in 10 s at 2/s, want nearly all 20", total)
	}
	if s := c.members[0].Leases(); len(s) != 1 || s[0].Share.Rate != 0 {
		t.Errorf("a member holds %+v of a limit decided at the store", s)
	}
	for _, m := range c.members[1:] {
		m.Close()
	}
	before := c.granted[0]
	c.run(5*time.Second, []int{0}, 1)
	c.conform()
	if s := c.members[0].Leases(); len(s) != 1 || s[0].Share.Rate != RateScale {
		t.Errorf("alone, the member holds %+v, want the whole limit back", s)
	}
	// 10 at most; going back to shares costs a renewal and a drained start.
	if got := c.granted[0] - before; got < 6 {
		t.Errorf("%d permits in 5 s alone at 2/s", got)
	}
	t.Logf("%d permits in 10 s among five members (%v)", total, c.granted)
}

// TestLimitChangeHandsTheOldShareBack: when a key's limit changes (a daemon reloads its
// rules), the member's share of the old limit goes back at the next round, not after it
// idles out, and the new limit is decided at once.
func TestLimitChangeHandsTheOldShareBack(t *testing.T) {
	old, nw := lim(100, time.Second, 10), lim(50, time.Second, 5)
	c := newCluster(t, old, 1, DefaultConfig())
	c.run(500*time.Millisecond, []int{0}, 1)
	m := c.members[0]
	if g, err := m.Decide(bg, "api", backend.Request{Limits: []gcra.Limit{nw}, N: 1}); err != nil || !g.Allowed {
		t.Fatalf("under the new limit: %+v %v", g.Result, err)
	}
	c.run(300*time.Millisecond, nil, 1)
	for _, s := range m.Leases() {
		if s.Limit == old {
			t.Fatalf("the old limit's share is still held: %+v", s)
		}
	}
	snap, _ := c.store.Load(bg, []string{RecordID("api", old)})
	if snap.Records[0].Version != 0 {
		st, _ := allot.UnmarshalState(snap.Records[0].Data)
		if c := st.Committed(snap.Now); c.Rate != 0 {
			t.Fatalf("the old record still counts %+v", c)
		}
	}
}

// crowd is members of one limit joining one memory store in virtual time, closed with
// the test.
type crowd struct {
	t       *testing.T
	clk     *clock.Virtual
	st      store.Store
	cfg     Config
	l       gcra.Limit
	members []*Backend
}

func newCrowd(t *testing.T, l gcra.Limit) *crowd {
	clk := clock.NewVirtual()
	clk.Advance(time.Second)
	cfg := DefaultConfig()
	cfg.JoinWindow = 0
	c := &crowd{t: t, clk: clk, st: store.NewMemory(clk), cfg: cfg, l: l}
	t.Cleanup(func() {
		for _, b := range c.members {
			b.Close()
		}
	})
	return c
}

// join adds n members, each logging to log (slog.Default() if nil), and has each decide
// once on key "k".
func (c *crowd) join(n int, log *slog.Logger) {
	for i := 0; i < n; i++ {
		opts := []Option{WithConfig(c.cfg), WithClock(c.clk), WithID(fmt.Sprintf("m%03d", len(c.members)))}
		if log != nil {
			opts = append(opts, WithLogger(log))
		}
		b, err := New(c.st, opts...)
		if err != nil {
			c.t.Fatal(err)
		}
		b.crowdAfter = 0 // warns at the first answer beyond the claim (TestWarnsOfALastingCrowd)
		c.members = append(c.members, b)
		c.allow(b)
	}
}

func (c *crowd) allow(b *Backend) {
	if _, err := b.AllowOne(bg, "k", c.l); err != nil {
		c.t.Fatal(err)
	}
}

// TestWarnsOfACrowdedLimit: a limit whose record holds more members than the mode
// serves (MaxMembers) is logged once, naming the strict mode; one within it is not.
func TestWarnsOfACrowdedLimit(t *testing.T) {
	var logs proctest.LockedBuffer
	c := newCrowd(t, lim(10000, time.Second, 1000))
	c.join(MaxMembers, nil)
	watch := slog.New(slog.NewTextHandler(&logs, nil))
	c.join(1, watch) // the 101st: one too many
	c.join(1, watch)
	c.allow(c.members[MaxMembers])
	if n := strings.Count(logs.String(), "more members than the lease mode claims to serve"); n != 2 || !strings.Contains(logs.String(), "strict mode") {
		t.Fatalf("the crowded limit was logged %d times: %q", n, logs.String())
	}
	for _, b := range c.members[MaxMembers:] {
		b.crowded.Range(func(k, _ any) bool {
			if k != "k" {
				t.Errorf("warned of %v", k)
			}
			return true
		})
	}
}

// TestWarnsOfALastingCrowd: which crowds the backend warns of, and when. A limit shared
// out is claimed up to MaxMembers; one decided at the store (and past allot.BucketAbove
// members on its bucket) up to MaxBucketMembers. A pool of a thousand starting at once
// passes a hundred while its record still shares the limit out, and each of its members
// warned of a crowd that lasted a second (694 warnings in two runs of
// BenchmarkLeaseRedisMembers/members=1000): a crowd beyond the claim is warned of once it
// has lasted crowdLasting, and one that ends before is forgotten.
func TestWarnsOfALastingCrowd(t *testing.T) {
	for _, tc := range []struct {
		live              int64
		onBucket, central bool
		want              bool
	}{
		{MaxMembers, false, false, false},
		{MaxMembers + 1, false, false, true},
		{MaxMembers + 1, false, true, false}, // decided at the store: bound for its bucket
		{MaxBucketMembers, false, true, false},
		{MaxBucketMembers + 1, false, true, true},
		{MaxBucketMembers, true, true, false},
		{MaxBucketMembers + 1, true, true, true},
	} {
		if got := beyondClaim(tc.live, tc.onBucket, tc.central); got != tc.want {
			t.Errorf("%d members (on its bucket: %v, decided at the store: %v): beyond the claim %v, want %v", tc.live, tc.onBucket, tc.central, got, tc.want)
		}
	}
	var logs proctest.LockedBuffer
	b, err := New(store.NewMemory(nil), WithID("m"), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	warned := func() int { return strings.Count(logs.String(), "more members than the lease mode claims to serve") }
	b.judgeCrowd("herd", 300, true, 0)
	b.judgeCrowd("herd", 400, true, int64(2*time.Second))
	b.judgeCrowd("herd", 1000, false, int64(3*time.Second)) // on its bucket now
	b.judgeCrowd("herd", 1000, false, int64(20*time.Second))
	if n := warned(); n != 0 {
		t.Fatalf("a crowd of two seconds warned of %d times: %q", n, logs.String())
	}
	b.judgeCrowd("steady", 200, true, int64(time.Second))
	b.judgeCrowd("steady", 200, true, int64(crowdLasting))
	if n := warned(); n != 0 {
		t.Fatalf("warned before the crowd had lasted %v: %q", crowdLasting, logs.String())
	}
	b.judgeCrowd("steady", 200, true, int64(time.Second+crowdLasting))
	b.judgeCrowd("steady", 200, true, int64(2*crowdLasting))
	if n := warned(); n != 1 || !strings.Contains(logs.String(), "key=steady") {
		t.Fatalf("a lasting crowd warned of %d times: %q; want once, naming its key", n, logs.String())
	}
}

// TestNewKeyRecordsOnce: callers that decide new keys under two limits at once, in either
// order, each get the same record for a key's limit, made once, while the others read the
// key's records (run it with -race: a record list published and then changed in place was
// a data race). The limits are the same for every caller: a key decided under other limits
// retires the records of its old ones, which is not this test's.
func TestNewKeyRecordsOnce(t *testing.T) {
	b, err := New(store.NewMemory(nil), WithID("m"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l0, l1 := gcra.Limit{T: 1e6, Tau: 1e8}, gcra.Limit{T: 1e7, Tau: 1e9}
	shapes := [][]gcra.Limit{{l0, l1}, {l1, l0}}
	const keys, callers = 200, 8
	got := make([][keys][2]*rec, callers)
	var wg sync.WaitGroup
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf [gcra.MaxLimits]*rec
			for i := 0; i < keys; i++ {
				ls := shapes[(c+i)%len(shapes)]
				for j, r := range b.records(fmt.Sprint("k", i), ls, &buf) {
					k := 0
					if ls[j] == l1 {
						k = 1
					}
					got[c][i][k] = r
				}
			}
		}()
	}
	wg.Wait()
	for i := 0; i < keys; i++ {
		for k := 0; k < 2; k++ {
			var first *rec
			for c := 0; c < callers; c++ {
				r := got[c][i][k]
				if r == nil {
					continue
				}
				if first == nil {
					first = r
				} else if r != first {
					t.Fatalf("key %d limit %d: two records made", i, k)
				}
			}
		}
		if e := b.keys.Load(fmt.Sprint("k", i)); e == nil || len(*e.Val.recs.Load()) != 2 {
			t.Fatalf("key %d: not two records in the table", i)
		}
	}
}

// TestLogsAColdStoresFence: on a store seen for the first time that cannot tell so (a
// Redis just started or flushed, here store.Memory after Restart), the first decision
// finds its limit fenced; the backend says so once, with how long and what to do, rather
// than answering no in silence. A fresh store (one that knows it is new) fences nothing
// and logs nothing.
func TestLogsAColdStoresFence(t *testing.T) {
	for _, cold := range []bool{true, false} {
		clk, st := memoryStore(cold)
		cfg := DefaultConfig()
		cfg.JoinWindow = 0
		var logs proctest.LockedBuffer
		b, err := New(st, WithConfig(cfg), WithClock(clk), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"a", "b", "c"} {
			if _, err := b.AllowOne(bg, key, lim(10, time.Second, 10)); err != nil {
				t.Fatal(err)
			}
		}
		b.Close()
		n := strings.Count(logs.String(), "limits fenced")
		switch {
		case cold && (n != 1 || !strings.Contains(logs.String(), "WaitUnfenced")):
			t.Errorf("a cold store's fence logged %d times (want once, naming lease.WaitUnfenced): %q", n, logs.String())
		case !cold && n != 0:
			t.Errorf("a fresh store logged a fence: %q", logs.String())
		}
	}
}

// TestPingSaysFenced: a backend on a store seen cold (a new Redis, a flush, a restart)
// answers Ping (the daemon's /readyz) with the fence and how long it lasts, until it ends;
// on a fresh store it is ready at once. It answered ready while every limit was refused.
func TestPingSaysFenced(t *testing.T) {
	for _, cold := range []bool{true, false} {
		clk, st := memoryStore(cold)
		b, err := New(st, WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		// The member reads the store when it starts (touch): wait for that read.
		for deadline := time.Now().Add(10 * time.Second); cold && b.apply.fencedTill.Load() == 0; {
			if time.Now().After(deadline) {
				t.Fatal("the member never read the store")
			}
			time.Sleep(time.Millisecond)
		}
		err = b.Ping(bg)
		switch {
		case cold && (err == nil || !strings.Contains(err.Error(), "fenced for 1.5s")):
			t.Errorf("a cold store: Ping %v, want the fence and how long it lasts", err)
		case !cold && err != nil:
			t.Errorf("a fresh store: Ping %v", err)
		}
		clk.Advance(1600 * time.Millisecond)
		if err := b.Ping(bg); err != nil {
			t.Errorf("cold %v, after the fence: Ping %v", cold, err)
		}
		b.Close()
	}
}

// memoryStore returns a virtual clock a second on and a store.Memory on it: seen cold (as
// a Redis just started or flushed: it cannot tell that no lease was granted from it) if
// cold, else fresh.
func memoryStore(cold bool) (*clock.Virtual, *store.Memory) {
	clk := clock.NewVirtual()
	clk.Advance(time.Second)
	st := store.NewMemory(clk)
	if cold {
		st.Restart()
	}
	return clk, st
}

// TestSameLimit: sameLimit is ==, field by field: it tells apart limits that differ in any
// one field, nested ones included, so a field added to gcra.Limit cannot be missed.
func TestSameLimit(t *testing.T) {
	base := gcra.Limit{T: 1, Tau: 2, Window: 3, Origin: 4, Ramp: gcra.Ramp{T0: 5, Over: 6}}
	if !sameLimit(&base, &base) {
		t.Fatal("a limit is not the same as itself")
	}
	var fields func(v reflect.Value, path string)
	n := 0
	fields = func(v reflect.Value, path string) {
		for i := range v.NumField() {
			f, name := v.Field(i), path+v.Type().Field(i).Name
			if f.Kind() == reflect.Struct {
				fields(f, name+".")
				continue
			}
			l := base
			lv := reflect.ValueOf(&l).Elem()
			for _, p := range strings.Split(name, ".") {
				lv = lv.FieldByName(p)
			}
			if lv.Kind() == reflect.Pointer {
				lv.Set(reflect.New(lv.Type().Elem())) // another pointer
			} else {
				lv.SetInt(lv.Int() + 100)
			}
			n++
			if sameLimit(&base, &l) || sameLimit(&l, &base) || (l == base) {
				t.Errorf("limits that differ in %s: sameLimit true", name)
			}
		}
	}
	fields(reflect.ValueOf(base), "")
	if n != 7 {
		t.Errorf("gcra.Limit has %d fields, sameLimit compares 7", n)
	}
}

// TestDecideAllocs: a decision on a share the member holds allocates nothing, the long way
// (Decide, keeping headroom for a higher class or not) as well as the fast one (AllowOne).
func TestDecideAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a share in real time")
	}
	c := DefaultConfig()
	c.JoinWindow = 0
	b, err := New(store.NewMemory(nil), WithConfig(c))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l := gcra.Limit{T: 1, Tau: 1000}
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	if g, err := b.Decide(ctx, "k", backend.Request{Limits: []gcra.Limit{l}, N: 1, MaxDelay: time.Second}); err != nil || !g.Allowed {
		t.Fatalf("no share: %+v %v", g, err)
	}
	req := backend.Request{Limits: []gcra.Limit{l}, N: 1}
	if n := testing.AllocsPerRun(1000, func() { _, _ = b.Decide(bg, "k", req) }); n != 0 {
		t.Errorf("Decide: %v allocations a call, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { _, _ = b.AllowOne(bg, "k", l) }); n != 0 {
		t.Errorf("AllowOne: %v allocations a call, want 0", n)
	}
	kept, _ := l.Keeping(0.4)
	keeping := backend.Request{Limits: []gcra.Limit{kept}, N: 1, Core: req.Limits}
	if n := testing.AllocsPerRun(1000, func() { _, _ = b.Decide(bg, "k", keeping) }); n != 0 {
		t.Errorf("Decide keeping headroom: %v allocations a call, want 0", n)
	}
}

// steppingClock is a virtual clock whose reads (Nanotime) it counts, and which moves
// step ahead after the next read when armed.
type steppingClock struct {
	*clock.Virtual
	reads atomic.Int64
	step  atomic.Int64
}

func (c *steppingClock) Nanotime() int64 {
	c.reads.Add(1)
	now := c.Virtual.Nanotime()
	if d := c.step.Swap(0); d > 0 {
		c.Advance(time.Duration(d))
	}
	return now
}

// TestFastDecisionRereadsBeforeTheLongWay: a fast decision that its share refuses while the
// member may borrow decides again at a fresh reading of the clock before it goes the long
// way, as the long way would first: a permit due by then is granted on the share, with two
// readings of the clock (the long way takes more).
func TestFastDecisionRereadsBeforeTheLongWay(t *testing.T) {
	clk := &steppingClock{Virtual: clock.NewVirtual()}
	c := DefaultConfig()
	c.JoinWindow = 0
	b, err := New(store.NewMemory(clk.Virtual), WithConfig(c), WithClock(clk), WithRenewEvery(100*time.Millisecond), WithIdleAfter(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l := gcra.Limit{T: int64(time.Microsecond), Tau: int64(time.Millisecond)} // 10⁶/s, burst 1000
	if g, err := b.Decide(bg, "k", backend.Request{Limits: []gcra.Limit{l}, N: 1, MaxDelay: time.Second}); err != nil || !g.Allowed {
		t.Fatalf("no share: %+v %v", g, err)
	}
	asleep := func() { // the renewal goroutine is done with what is due
		for deadline := time.Now().Add(10 * time.Second); ; {
			if s := b.sleepUntil.Load(); s > clk.Virtual.Nanotime() && s != math.MaxInt64 { // MaxInt64: awake
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the renewal goroutine never slept")
			}
			runtime.Gosched()
		}
	}
	// 4,000 a second for two seconds: the share follows the demand down, and the free
	// capacity saves up. Then a renewal with no call: a window in which it borrowed
	// nothing.
	for range 40 {
		for range 200 {
			b.AllowOne(bg, "k", l)
		}
		clk.Advance(50 * time.Millisecond)
		asleep()
	}
	clk.Advance(100 * time.Millisecond)
	asleep()
	r := b.keys.Load("k").Val.find(&l)
	r.lock() // shuts the fast path: what it spends here is spent for it too
	now := clk.Virtual.Nanotime()
	share, _ := r.m.Usable(now)
	for { // spend the share's burst at one instant
		allowed, ok := r.m.AllowOne(now)
		if !ok {
			break // refused where it may borrow: the long way's case
		}
		if !allowed {
			r.unlock()
			t.Fatalf("refused with nothing to borrow: the test needs a member that may borrow (%+v)", b.Leases())
		}
	}
	r.unlock()
	if share.T <= l.T {
		t.Fatalf("the share is the whole limit (%+v)", b.Leases())
	}
	clk.step.Store(share.T) // its next permit falls due after the first reading
	clk.reads.Store(0)
	if allowed, err := b.AllowOne(bg, "k", l); !allowed || err != nil {
		t.Fatalf("AllowOne = %v, %v, want a grant on the share at the second reading (%+v)", allowed, err, b.Leases())
	}
	if n := clk.reads.Load(); n != 2 {
		t.Errorf("the clock read %d times, want 2 (the fast decision and its second reading)", n)
	}
}

// TestCriticalCallersAreReported: a member whose callers carry the critical class
// (priority.With) reports that part of its demand, and the store gives it first: beside
// a member that wants all it can get, the member whose critical callers ask 60/s of 100/s
// is granted what they ask (its share holds it less the 16 a second it borrows from the
// reserve the store keeps for critical callers), where by member alone it held half.
func TestCriticalCallersAreReported(t *testing.T) {
	l := lim(100, time.Second, 20)
	c := newCluster(t, l, 2, DefaultConfig())
	crit := priority.With(bg, priority.Critical)
	var asked, granted int
	start := c.clk.Nanotime()
	for end := start + int64(4*time.Second); c.clk.Nanotime() < end; {
		c.clk.Advance(time.Millisecond)
		c.settle(2)
		if (c.clk.Nanotime()/int64(time.Millisecond))%16 == 0 { // about 60/s
			g, err := c.members[0].Decide(crit, "api", backend.Request{Limits: []gcra.Limit{l}, N: 1})
			if err != nil {
				t.Fatal(err)
			}
			if c.clk.Nanotime() >= start+int64(time.Second) {
				asked++
				if g.Allowed {
					granted++
				}
			}
		}
		for range 50 {
			if ok, err := c.members[1].AllowOne(bg, "api", l); err != nil || !ok {
				break
			}
		}
	}
	st := c.members[0].Leases()
	// (Within 6 a second: the share the critical member holds at the end depends on which
	// of the two members' renewals lands first at some virtual instants, which the load of
	// a whole package's tests changes: 42.14 a second where 63.3 were asked, 0.17 under a
	// bound of 5, in three runs of the package in a row.)
	if len(st) != 1 || st[0].Critical < RateScale/2 || st[0].Share.Rate < st[0].Critical-RateScale*16/100-RateScale*6/100 {
		t.Errorf("the critical member: %+v, want its critical demand (about 0.6 of the limit) reported and its share that less the 16 a second it borrows", st)
	}
	if granted*100 < asked*99 {
		t.Errorf("critical callers granted %d of %d from 1 s on, want at least 0.99", granted, asked)
	}
}

// TestFastPathGrantsTheShareExactly: goroutines that take single permits at one instant,
// while others lock the record over and over (Leases), are granted exactly what the share
// holds, no more, no fewer, whether the lock-free fast path or the locked one grants each;
// and the member counts every one in its demand (the Used it reports after its renewal).
func TestFastPathGrantsTheShareExactly(t *testing.T) {
	clk := clock.NewVirtual()
	c := DefaultConfig()
	c.JoinWindow = 0
	c.Policy = Equal // a lone member holds the whole limit, and borrows nothing
	b, err := New(store.NewMemory(clk), WithConfig(c), WithClock(clk), WithRenewEvery(100*time.Millisecond), WithIdleAfter(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l := gcra.Limit{T: int64(time.Microsecond), Tau: int64(5 * time.Millisecond)} // 10⁶/s, burst 5,000
	if g, err := b.Decide(bg, "k", backend.Request{Limits: []gcra.Limit{l}, N: 1, MaxDelay: time.Second}); err != nil || !g.Allowed {
		t.Fatalf("no share: %+v %v", g, err)
	}
	clk.Advance(10 * time.Millisecond) // the bucket refills
	r := b.keys.Load("k").Val.find(&l)
	r.lock()
	fs, ok := r.m.Fast()
	r.unlock()
	if !ok {
		t.Fatalf("no fast share: %+v", b.Leases())
	}
	var want int64
	for tat := fs.Tat; ; want++ {
		next, ok := gcra.AllowOne(tat, fs.Limit, clk.Nanotime())
		if !ok {
			break
		}
		tat = next
	}
	var granted atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() { // lock the record over and over meanwhile
		for {
			select {
			case <-stop:
				return
			default:
				b.Leases()
			}
		}
	}()
	for range 4 {
		wg.Go(func() {
			for {
				ok, err := b.AllowOne(bg, "k", l)
				if err != nil {
					t.Error(err)
				}
				if !ok {
					return
				}
				granted.Add(1)
			}
		})
	}
	wg.Wait()
	close(stop)
	if got := granted.Load(); got != want || want < 4000 {
		t.Fatalf("granted %d at one instant, want the share's %d", got, want)
	}
	var st []Status
	for range 5 { // until the renewal that closes the window that counted them
		clk.Advance(100 * time.Millisecond)
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		for s := b.sleepUntil.Load(); (s <= clk.Nanotime() || s == math.MaxInt64) && ctx.Err() == nil; s = b.sleepUntil.Load() {
			runtime.Gosched() // until the renewal goroutine is done with what is due (MaxInt64: awake)
		}
		cancel()
		if st = b.Leases(); len(st) == 1 && st[0].Used > 0 {
			break
		}
	}
	if len(st) != 1 || st[0].Used < want || st[0].Used > want+1 {
		t.Errorf("the member reports %+v, want Used %d (and the joining permit)", st, want)
	}
}
