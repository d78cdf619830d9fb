package strict

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
)

// model is the Go core's side of the differential test: a key's TATs and the end of its
// latest penalty, driven exactly as package local drives the core.
type model struct {
	tats []int64
	hold int64
}

// randomLimits draws 1 to MaxLimits limits on scales from a nanosecond to weeks, some with
// a tolerance above 2^53 ns (beyond a double's exact integers).
func randomLimits(rng *rand.Rand) []gcra.Limit {
	ls := make([]gcra.Limit, 1+rng.IntN(gcra.MaxLimits))
	for i := range ls {
		var t int64
		switch rng.IntN(5) {
		case 0:
			t = 1 + rng.Int64N(1000) // nanoseconds
		case 1:
			t = 1 + rng.Int64N(int64(time.Millisecond))
		case 2:
			t = 1 + rng.Int64N(int64(time.Second))
		case 3:
			t = 1 + rng.Int64N(int64(time.Hour))
		default:
			t = 1 + rng.Int64N(int64(30*24*time.Hour)) // Tau may pass 2^53
		}
		if rng.IntN(3) == 0 {
			// Round figures, as real limits have (1/6s, 100/s): sums of nanosecond parts
			// then land exactly on whole seconds, the carry's edge.
			unit := []int64{1e3, 1e6, 1e8, 5e8, 1e9}[rng.IntN(5)]
			t = max(unit, t/unit*unit)
			if rng.IntN(2) == 0 { // a rate that does not divide its period: 3/s is 333,333,334 ns
				rate := 1 + rng.Int64N(1000)
				t = max(1, (t+rate-1)/rate)
			}
		}
		burst := 1 + rng.Int64N(8)
		if rng.IntN(8) == 0 && t <= int64(time.Hour) {
			burst = 1 + rng.Int64N(1000)
		}
		ls[i] = gcra.Limit{T: t, Tau: burst * t}
	}
	return ls
}

// randomRises gives some of ls a ramp (gcra.Limit.Rise) at a random point of it, each
// such limit being the ramp's limit there (gcra.Rise.At(0)), as the limiter sends them:
// starts from 1 to the limit's rate, per second, minute or hour, ramps of a millisecond
// to a day, bursts from 1 to 200, margins from none to a second.
func randomRises(rng *rand.Rand, ls []gcra.Limit) {
	for i := range ls {
		if rng.IntN(2) == 0 {
			continue
		}
		period := []int64{1e9, 60e9, 3600e9, 1e9 + rng.Int64N(1e9)}[rng.IntN(4)]
		rate := 1 + rng.Int64N(1000)
		r := gcra.Rise{
			Over:    []int64{1e6, 1e9, 60e9, 3600e9, 86400e9, 1 + rng.Int64N(1e12)}[rng.IntN(6)],
			Rate0:   1 + rng.Int64N(rate),
			Period0: period,
			Rate:    rate,
			Period:  period,
			Burst:   []int64{1, 1 + rng.Int64N(10), 1 + rng.Int64N(200)}[rng.IntN(3)],
			Margin:  []int64{0, 0, 1e6, 12e6, 1e9, rng.Int64N(1e8)}[rng.IntN(6)],
		}
		if rng.IntN(4) == 0 { // a start per a longer period: 10/m up to 100/s
			r.Period0 = 60 * period
		}
		r.Interval = (r.Period + r.Rate - 1) / r.Rate
		r.Elapsed = rng.Int64N(r.Over)
		if !r.Valid() {
			continue
		}
		ls[i].T, ls[i].Tau = r.At(0)
		ls[i].Rise = &r
	}
}

// riseLater moves each ramp of ls on by d (as the limiter's next decision would see it,
// d later), or ends it: the limit as it is then.
func riseLater(ls []gcra.Limit, d int64) []gcra.Limit {
	out := slices.Clone(ls)
	for i, l := range out {
		if l.Rise == nil {
			continue
		}
		r := *l.Rise
		r.Elapsed += d
		out[i].T, out[i].Tau = r.At(0)
		out[i].Rise = nil
		if r.Elapsed < r.Over {
			out[i].Rise = &r
		}
	}
	return out
}

// randomBase is the start of a sequence: virtual times near zero, Unix nanoseconds of
// this year or the next, or of the 2030s (all far above 2^53). A sequence stays well
// inside int64.
func randomBase(rng *rand.Rand) int64 {
	switch rng.IntN(4) {
	case 0:
		return rng.Int64N(int64(time.Hour))
	case 3: // a whole second
		return time.Now().Unix() * 1e9
	case 1:
		return time.Now().UnixNano() + rng.Int64N(int64(365*24*time.Hour))
	}
	return 2e18 + rng.Int64N(1e18)
}

// TestDifferential runs 2,500 random operation sequences (several limits, weights,
// bursts, reservations bounded and unbounded, cancellations, settlements up and down,
// penalties, queries, cost errors) through the script on a real Redis, with time passed
// to it as an argument, and through the Go core, and demands identical decisions, tickets
// and final state. SLUICE_STRICT_DIFF_SEQS runs more: make fuzz runs 20,000.
func TestDifferential(t *testing.T) {
	sequences := 2_500
	if testing.Short() {
		sequences = 1_000
	}
	if s := os.Getenv("SLUICE_STRICT_DIFF_SEQS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("SLUICE_STRICT_DIFF_SEQS=%q: want a positive count", s)
		}
		sequences = n
	}
	const workers = 24
	client := newClient(t, shared.URL())
	pfx := prefix(t)
	var next atomic.Int64
	var ops atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var now atomic.Int64
			b := New(client, withNow(now.Load), WithPrefix(pfx), WithTimeout(30*time.Second), WithPipelines(1, 8))
			b.p.refs = w%2 == 0 // half the workers send keys and fields as pointers, as Dial's backend does
			defer b.Close()
			for {
				seq := next.Add(1) - 1
				if seq >= int64(sequences) {
					return
				}
				n, err := runSequence(b, client, &now, seq)
				ops.Add(int64(n))
				if err != nil {
					errs <- fmt.Errorf("sequence %d: %w", seq, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d sequences, %d operations, identical", sequences, ops.Load())
}

// idleSame normalizes a ticket's TATs as decisions see them: a TAT in the past is the
// same as none (a query's ticket carries the key's TATs, which Redis forgets when idle).
func idleSame(tk gcra.Ticket, now int64) gcra.Ticket {
	for i := range tk.TatAfter {
		tk.TatAfter[i] = max(tk.TatAfter[i], now)
	}
	return tk
}

func runSequence(b *Backend, client *goredis.Client, now *atomic.Int64, seq int64) (int, error) {
	rng := rand.New(rand.NewPCG(uint64(seq), 0xd1ff))
	ls := randomLimits(rng)
	if seq%3 == 0 {
		randomRises(rng, ls) // a third of the sequences ramp: the script's 'r' records
	}
	key := strconv.FormatInt(seq, 10)
	m := model{tats: make([]int64, len(ls))}
	now.Store(randomBase(rng))
	var open []gcra.Ticket
	steps := 5 + rng.IntN(30)
	T := ls[0].T
	for step := 0; step < steps; step++ {
		// Time moves by nothing, by a fraction of an interval, or by a long idle spell.
		switch rng.IntN(4) {
		case 0:
		case 1:
			now.Add(rng.Int64N(2 * T))
		case 2: // whole intervals, or a round figure
			switch rng.IntN(3) {
			case 0:
				now.Add(T * rng.Int64N(3))
			case 1: // a nanosecond either side of a slot
				now.Add(max(0, T+rng.Int64N(3)-1))
			default:
				now.Add([]int64{1e6, 5e8, 1e9}[rng.IntN(3)])
			}
		default:
			now.Add(rng.Int64N(3 * max(ls[rng.IntN(len(ls))].Tau, 1)))
		}
		at := now.Load()
		fail := func(format string, a ...any) error {
			return fmt.Errorf("step %d (limits %v, now %d): %s", step, ls, at, fmt.Sprintf(format, a...))
		}
		if rng.IntN(4) == 0 { // a ramp moves on, as it does between a limiter's decisions
			ls = riseLater(ls, rng.Int64N(2*T))
		}
		switch op := rng.IntN(10); {
		case op < 6: // decide
			maxCost := gcra.MaxCost(ls)
			n := rng.Int64N(min(maxCost, 6) + 1)
			if rng.IntN(40) == 0 && maxCost < math.MaxInt64 {
				n = maxCost + 1 // a cost error on both sides
			}
			var md int64
			switch rng.IntN(4) {
			case 1:
				md = rng.Int64N(4 * T)
			case 2:
				md = rng.Int64N(4 * ls[len(ls)-1].Tau)
			case 3:
				md = math.MaxInt64
			}
			want, wantTk, wantErr := gcra.Decide(m.tats, ls, at, n, md)
			useAllow := len(ls) == 1 && n == 1 && md == 0 && rng.IntN(2) == 0
			if useAllow {
				got, err := b.AllowOne(ctx, key, ls[0])
				if err != nil || got != want.Allowed {
					return step, fail("AllowOne = %v %v, core %v", got, err, want.Allowed)
				}
				continue
			}
			g, err := b.Decide(ctx, key, backend.Request{Limits: ls, N: n, MaxDelay: time.Duration(md)})
			if !errors.Is(err, wantErr) || (err == nil) != (wantErr == nil) {
				return step, fail("n=%d: error %v, core %v", n, err, wantErr)
			}
			if g.Result != want || idleSame(g.Ticket, at) != idleSame(wantTk, at) {
				return step, fail("n=%d md=%d:\n script %+v %+v\n core   %+v %+v", n, md, g.Result, g.Ticket, want, wantTk)
			}
			if want.Allowed && n > 0 {
				open = append(open, wantTk)
			}
		case op < 8 && len(open) > 0: // cancel or settle
			i := rng.IntN(len(open))
			tk := open[i]
			open = append(open[:i], open[i+1:]...)
			newN := rng.Int64N(2*tk.N + 2)
			switch rng.IntN(30) {
			case 0, 1, 2, 3, 4, 5, 6, 7, 8, 9:
				newN = 0
			case 10: // a count whose cost overflows: both sides saturate
				newN = []int64{3_000_000, 1 << 40, math.MaxInt64}[rng.IntN(3)]
			}
			hold := m.hold
			if hold <= at {
				hold = 0
			}
			if _, err := gcra.Adjust(m.tats, ls, at, tk, newN, hold); err != nil {
				return step, fail("core Adjust: %v", err)
			}
			if err := b.Adjust(ctx, key, ls, tk, newN); err != nil {
				return step, fail("Adjust: %v", err)
			}
		case op < 9: // penalize
			d := 1 + rng.Int64N(3*T)
			if rng.IntN(20) == 0 { // a Retry-After centuries away: both sides saturate
				d = math.MaxInt64
			}
			until := gcra.After(at, d)
			m.hold = max(m.hold, until)
			gcra.Penalize(m.tats, ls, at, until)
			if err := b.Penalize(ctx, key, ls, time.Duration(d)); err != nil {
				return step, fail("Penalize: %v", err)
			}
		default: // a query
			want, _, _ := gcra.Decide(m.tats, ls, at, 0, 0)
			g, err := b.Decide(ctx, key, backend.Request{Limits: ls, N: 0})
			if err != nil || g.Result != want {
				return step, fail("query: %+v %v, core %+v", g.Result, err, want)
			}
		}
	}
	// The state left in Redis is the core's: the same TATs (a TAT in the past is the same
	// as none) and the same penalty in force, or no key at all if the core's is idle.
	at := now.Load()
	v, err := client.Get(ctx, b.KeyName(key)).Result()
	if errors.Is(err, goredis.Nil) {
		if !gcra.Idle(m.tats, at) || m.hold > at {
			return steps, fmt.Errorf("key gone, core state %v hold %d at %d", m.tats, m.hold, at)
		}
		return steps, nil
	}
	if err != nil {
		return steps, err
	}
	f := strings.Fields(v)
	if len(f) != 3+2*len(ls) || f[0] != "1" {
		return steps, fmt.Errorf("stored state %q", v)
	}
	field := func(i int) int64 {
		s, _ := strconv.ParseInt(f[1+2*i], 10, 64)
		ns, _ := strconv.ParseInt(f[2+2*i], 10, 64)
		return s*1e9 + ns
	}
	hold := field(0)
	if (m.hold > at) != (hold > at) || (hold > at && hold != m.hold) {
		return steps, fmt.Errorf("stored hold %d, core %d, at %d", hold, m.hold, at)
	}
	for i := range ls {
		tat := field(1 + i)
		if max(tat, at) != max(m.tats[i], at) {
			return steps, fmt.Errorf("stored TAT %d = %d, core %d, at %d", i, tat, m.tats[i], at)
		}
	}
	return steps, nil
}
