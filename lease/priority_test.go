package lease_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/store"
)

// aloneOn returns a limiter of limits on a lease member alone on a memory store, in
// virtual time, holding the whole limit (the equal policy) for longer than a test runs,
// the member, and where the limiter logs.
func aloneOn(t *testing.T, limits sluice.Limits) (*sluice.Limiter, *clock.Virtual, *lease.Backend, *proctest.LockedBuffer) {
	t.Helper()
	clk := clock.NewVirtual()
	clk.Advance(time.Second)
	cfg := lease.DefaultConfig()
	cfg.TTL = time.Hour
	cfg.JoinWindow = 0 // alone: nobody to share the first burst with
	cfg.Policy = lease.Equal
	be, err := lease.New(store.NewMemory(clk), lease.WithConfig(cfg), lease.WithClock(clk),
		lease.WithRenewEvery(10*time.Minute), lease.WithIdleAfter(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	logs := &proctest.LockedBuffer{}
	l, err := sluice.New(limits, sluice.WithBackend(be), sluice.WithClock(clk),
		sluice.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); be.Close() })
	return l, clk, be, logs
}

// TestLeaseKeepsHeadroomInAllow: a member holding 10/s burst 10 keeps the default
// headroom for a critical caller in the decisions of lower classes that do not wait. Once
// a critical caller asked, sheddable Allows are refused where they would leave less than
// 40% of the burst (4 permits), with a RetryAfter, while the critical caller still gets
// those 4. With no critical caller for longer than the time the limit takes to refill
// (1 s), sheddable Allows use the whole burst. The limiter does not warn that the back end
// keeps no headroom.
func TestLeaseKeepsHeadroomInAllow(t *testing.T) {
	l, clk, _, logs := aloneOn(t, sluice.Limits{{Rate: 10, Period: time.Second, Burst: 10}})
	ctx := context.Background()
	crit := priority.With(ctx, priority.Critical)
	shed := priority.With(ctx, priority.Sheddable)
	if !l.Allow(crit, "api") { // the member joins, and holds the limit
		t.Fatal("the first critical Allow was refused")
	}
	for i, s := range []struct {
		ctx   context.Context
		n     int
		grant bool
	}{
		{shed, 5, true},  // 9 left: 5 taken leave 4
		{shed, 1, false}, // it would leave 3
		{crit, 4, true},  // the headroom is the critical caller's
		{crit, 1, false},
	} {
		for k := range s.n {
			d, err := l.AllowN(s.ctx, "api", 1)
			if err != nil || d.Allowed != s.grant {
				t.Fatalf("step %d, call %d: got %+v, %v, want allowed %v", i, k, d, err, s.grant)
			}
			if !d.Allowed && d.RetryAfter <= 0 {
				t.Fatalf("step %d, call %d: refused with no RetryAfter: %+v", i, k, d)
			}
		}
	}
	clk.Advance(2 * time.Second) // the burst refills; the critical caller is no longer recent
	for k := range 10 {
		if !l.Allow(shed, "api") {
			t.Fatalf("no critical caller for 2 s: sheddable call %d of 10 refused", k)
		}
	}
	if l.Allow(shed, "api") {
		t.Fatal("an eleventh sheddable permit granted on a burst of 10")
	}
	if strings.Contains(logs.String(), "keeps no headroom") {
		t.Errorf("the limiter warned:\n%s", logs.String())
	}
}

// TestLeaseWindowKeepsNoHeadroom: a windowed quota keeps no headroom (its tolerance is its
// windows' arithmetic): beside a critical caller, sheddable Allows take the rest of the
// window's count, and no more.
func TestLeaseWindowKeepsNoHeadroom(t *testing.T) {
	l, _, _, _ := aloneOn(t, sluice.Limits{{Rate: 10, Period: time.Hour, Window: true}})
	ctx := context.Background()
	if !l.Allow(priority.With(ctx, priority.Critical), "api") {
		t.Fatal("the first critical Allow was refused")
	}
	shed := priority.With(ctx, priority.Sheddable)
	granted := 0
	for range 12 {
		if l.Allow(shed, "api") {
			granted++
		}
	}
	if granted != 9 {
		t.Errorf("sheddable Allows granted %d beside a critical one, want the window's other 9", granted)
	}
}

// TestLeaseKeptGrantSettlesOnItsRecord: a sheddable reservation, decided keeping headroom
// for a critical caller, is taken from the record of the key's own limit and cancelled
// there: the member holds one record, and the permits given back go to the critical
// caller.
func TestLeaseKeptGrantSettlesOnItsRecord(t *testing.T) {
	l, _, be, _ := aloneOn(t, sluice.Limits{{Rate: 10, Period: time.Second, Burst: 10}})
	ctx := context.Background()
	crit := priority.With(ctx, priority.Critical)
	if !l.Allow(crit, "api") {
		t.Fatal("the first critical Allow was refused")
	}
	r, err := l.Reserve(priority.With(ctx, priority.Sheddable), "api", 5)
	if err != nil || !r.Allowed || r.Delay != 0 {
		t.Fatalf("a sheddable reservation of 5 of the 9 left: %+v, %v", r.Decision, err)
	}
	if st := be.Leases(); len(st) != 1 {
		t.Fatalf("the member holds %d records, want the key's one: %+v", len(st), st)
	}
	if err := r.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	for k := range 9 {
		if !l.Allow(crit, "api") {
			t.Fatalf("critical call %d of the 9 left after the cancel refused", k)
		}
	}
}
