package adaptive

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ratehdr"
)

const sec = int64(time.Second)

// ok is an answer of the referee's IETF style: the policy (limit per window, burst) and
// what is left.
func ok(limit, remaining int64, window time.Duration, burst int64) ratehdr.Facts {
	return ratehdr.Facts{Status: 200, Quotas: []ratehdr.Quota{{Name: "p", Limit: limit, Remaining: remaining, Reset: -1, Window: window, Burst: burst}}}
}

func refused(retry time.Duration) ratehdr.Facts {
	f := ok(20, 0, time.Second, 10)
	f.Status, f.RetryAfter, f.HasRetryAfter = 429, retry, true
	return f
}

func newC(t *testing.T, cfg Config) *Controller {
	t.Helper()
	c, err := New(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestStrategyNames(t *testing.T) {
	for _, s := range Strategies() {
		b, _ := s.MarshalText()
		var got Strategy
		if err := got.UnmarshalText(b); err != nil || got != s {
			t.Errorf("%v: read back %v, %v", s, got, err)
		}
	}
	if _, err := ParseStrategy("aimd"); err == nil {
		t.Error("unknown strategy accepted")
	}
	if s, _ := ParseStrategy("SRE"); s != SRE {
		t.Errorf("names are case-insensitive: got %v", s)
	}
	// The Heroku strategy's former name reads for one release, and says it is one.
	if s, err := ParseStrategy("seed"); err != nil || s != Heroku {
		t.Errorf("seed: %v, %v; want heroku", s, err)
	}
	if s, ok := FormerName("seed"); !ok || s != Heroku {
		t.Errorf("FormerName(seed) = %v, %v; want heroku, true", s, ok)
	}
	for _, s := range Strategies() {
		if _, ok := FormerName(s.String()); ok {
			t.Errorf("FormerName(%v): a current name is not a former one", s)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{Fairness: 2}, {Jitter: 2}, {Reserve: -1}, {Horizon: -1},
		{Strategy: 9}, {Limit: sluice.Limit{Rate: -1, Period: time.Second}}} {
		if _, err := New(c, 1); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if _, err := New(Config{Limit: sluice.Limit{Rate: 4500, Period: time.Hour}}, 1); err != nil {
		t.Errorf("a valid limit refused: %v", err)
	}
}

// TestOneDecreasePerEvent: the goroutines of a process refused together (their requests
// sent before the first refusal came back) back off once; a refusal of a request sent
// after it is a new event. The same for the Heroku strategy's doubling.
func TestOneDecreasePerEvent(t *testing.T) {
	c := newC(t, Config{})
	c.observe(1*sec, 1*sec-1, ok(20, 3, time.Second, 10), 0) // below the reserve: no spare spent
	r0 := c.Rate()
	c.observe(2*sec, 2*sec-10, refused(time.Second), 0)
	c.observe(2*sec+5, 2*sec-5, refused(time.Second), 0) // sent before the first refusal came back
	if got := c.Rate(); got != r0/2 {
		t.Fatalf("step 1: rate %v after two refusals of one event, want %v (one halving)", got, r0/2)
	}
	c.observe(4*sec, 3*sec, refused(time.Second), 0) // sent after: a new event
	if got := c.Rate(); got != r0/4 {
		t.Fatalf("step 2: rate %v after a second event, want %v", got, r0/4)
	}

	s := newC(t, Config{Strategy: Heroku})
	s.observe(1*sec, 1*sec-1, ok(4500, 0, time.Hour, 4500), 0)
	s.observe(2*sec, 2*sec-10, refused(time.Second), 0)
	r1 := s.Rate() // the sleep is 2 × 0.8 s doubled: 3.2 s
	s.observe(2*sec+5, 2*sec-5, refused(time.Second), 0)
	if got := s.Rate(); math.Abs(1/r1-3.2) > 1e-9 || got != r1 {
		t.Fatalf("heroku: sleeps %.3fs then %.3fs, want 3.2s twice (one doubling per event)", 1/r1, 1/got)
	}
}

// TestRetryAfterHolds: nothing goes before the Retry-After a refusal names.
func TestRetryAfterHolds(t *testing.T) {
	c := newC(t, Config{})
	c.observe(1*sec, 1*sec-1, ok(20, 9, time.Second, 10), 0)
	c.observe(2*sec, 2*sec-1, refused(3*time.Second), 0)
	if at := send(t, c, 2*sec, 0); at < 5*sec || at > 6*sec {
		t.Fatalf("a request sent at %v, want soon after the Retry-After (5s)", time.Duration(at))
	}
}

// TestSlotsAreNotHeldFarAhead: goroutines asking at once get the next slot each within
// one pause; the others are told to ask again, so that a pace that changes meanwhile
// applies to them.
func TestSlotsAreNotHeldFarAhead(t *testing.T) {
	c := newC(t, Config{Jitter: 1e-9})
	c.observe(1*sec, 1*sec-1, ok(4500, 10, time.Hour, 4500), 0) // a pace of 4500/h / 16
	pause := 1 / c.Rate()
	var sent, waiting int
	for range 5 {
		at, out := c.Next(2*sec, 0)
		switch out {
		case Send:
			sent++
			if float64(at-2*sec)/1e9 > pause*1.01 {
				t.Errorf("a slot %v ahead, more than one pause (%.2fs)", time.Duration(at-2*sec), pause)
			}
		case Wait:
			waiting++
		}
	}
	if sent != 2 || waiting != 3 {
		t.Errorf("%d sent and %d told to wait, want 2 and 3 (the slot now and the next)", sent, waiting)
	}
}

// send asks c for a slot from now until it gives one, as a goroutine does.
func send(t *testing.T, c *Controller, now, tokens int64) int64 {
	t.Helper()
	for range 1000 {
		at, out := c.Next(now, tokens)
		if out == Send {
			return at
		}
		now = max(at, now+1)
	}
	t.Fatal("no slot after 1000 waits")
	return 0
}

// TestCancelGivesTheSlotBack: a slot given back (the request's context ended) is the next
// request's.
func TestCancelGivesTheSlotBack(t *testing.T) {
	c := newC(t, Config{})
	c.observe(1*sec, 1*sec-1, ok(20, 5, time.Second, 10), 0)
	at, out := c.Next(2*sec, 0)
	if out != Send {
		t.Fatalf("first request: %v", out)
	}
	c.Cancel(at, 0)
	if again, out := c.Next(2*sec, 0); out != Send || again != at {
		t.Fatalf("after the cancel: slot %v (%v), want %v", again, out, at)
	}
}

// TestTheTighterLimitPaces: an LLM API's answers name a request limit and a token limit
// per minute (OpenAI's fields); requests of many tokens are paced by the token limit,
// the costs settled from the answers.
func TestTheTighterLimitPaces(t *testing.T) {
	c := newC(t, Config{Jitter: 1e-9})
	f := ratehdr.Facts{Status: 200, Quotas: []ratehdr.Quota{
		{Name: "requests", Limit: 500, Remaining: 100, Reset: -1, Burst: -1},
		{Name: "tokens", Limit: 40000, Remaining: 20000, Reset: -1, Burst: -1},
	}}
	c.observe(1*sec, 1*sec-1, f, 4000)
	// Both limits below their reserves: a request pace and a token pace of a sixteenth of
	// each.
	reqPause := 1 / (500.0 / 60 / 16)
	tokPause := 4000 / (40000.0 / 60 / 16)
	at1 := send(t, c, 2*sec, 4000)
	at2 := send(t, c, at1, 4000)
	got := float64(at2-at1) / 1e9
	if math.Abs(got-tokPause) > 0.01*tokPause || got <= reqPause {
		t.Fatalf("requests of 4000 tokens %.2fs apart, want %.2fs (the token limit's pause, longer than the request limit's %.2fs)", got, tokPause, reqPause)
	}
	// A cost unknown in advance is the mean of those settled.
	at3 := send(t, c, at2, 0)
	if d := float64(at3-at2) / 1e9; math.Abs(d-tokPause) > 0.01*tokPause {
		t.Fatalf("a request of unknown cost %.2fs after the last, want %.2fs (the mean cost, 4000 tokens)", d, tokPause)
	}
}

// TestLimitAssumed: with Heroku's bare RateLimit-Remaining, the limit Config.Limit names
// is the one learned; the Heroku strategy uses it as its MAX_LIMIT.
func TestLimitAssumed(t *testing.T) {
	bare := ratehdr.Facts{Status: 200, Quotas: []ratehdr.Quota{{Limit: -1, Remaining: 10, Reset: -1, Burst: -1}}}
	c := newC(t, Config{Limit: sluice.Limit{Rate: 4500, Period: time.Hour}})
	c.observe(1*sec, 1*sec-1, bare, 0)
	if got, want := c.Rate(), 4500.0/3600/16; math.Abs(got-want) > 1e-9 {
		t.Fatalf("pace %v after a first answer near the reserve, want a sixteenth of the assumed limit (%v)", got, want)
	}
	u := newC(t, Config{})
	u.observe(1*sec, 1*sec-1, bare, 0)
	if got := u.Rate(); got != 1 {
		t.Fatalf("pace %v with no limit known, want 1/s (it grows until refused)", got)
	}
}

// TestHerokuDecrease: the Heroku strategy's decrease, sleep −= remaining × sleep /
// (limit × time factor), the time factor 1/(1 − e^(−t/window)) high just after a
// doubling.
func TestHerokuDecrease(t *testing.T) {
	c := newC(t, Config{Strategy: Heroku})
	c.observe(1*sec, 1*sec-1, ok(4500, 4000, time.Hour, 4500), 0)
	c.observe(10*sec, 10*sec-1, refused(time.Second), 0) // doubles: 3.2 s
	before := 1 / c.Rate()
	c.observe(40*sec, 40*sec-1, ok(4500, 900, time.Hour, 4500), 0)
	tf := 1 / (1 - math.Exp(-31.0/3600))
	want := before - 900*before/(tf*4500)
	if got := 1 / c.Rate(); math.Abs(got-want) > 1e-9 {
		t.Fatalf("sleep %.6fs after 900 remaining 30 s after a doubling, want %.6fs", got, want)
	}
}

// TestCubic: on a throttle the rate is cut to 0.7 of the measured send rate, and regrows
// along CUBIC's curve back to it K = ∛(w_max × 0.3 / 0.4) seconds later.
func TestCubic(t *testing.T) {
	c := newC(t, Config{Strategy: Cubic})
	if at, out := c.Next(0, 0); out != Send || at != 0 {
		t.Fatal("cubic paces before its first throttle")
	}
	// Ten answers a second for three seconds: a measured rate near 10/s.
	var now int64
	for now = 0; now < 3*sec; now += sec / 10 {
		c.observe(now, now, ok(20, 5, time.Second, 10), 0)
	}
	c.observe(now, now, refused(time.Second), 0)
	measured := c.s.(*cubicStrategy).wMax // the measured rate, this answer counted
	if got := c.Rate(); math.Abs(got-0.7*measured) > 1e-9 || math.Abs(measured-10) > 0.5 {
		t.Fatalf("rate %v after a throttle at a measured %v/s, want 0.7 of it (about 10/s)", got, measured)
	}
	// Still ten answers a second: at K the curve is back at the rate of the throttle.
	k := math.Cbrt(measured * 0.3 / 0.4)
	later := now + int64(k*1e9)
	for now += sec / 10; now < later; now += sec / 10 {
		c.observe(now, now, ok(20, 5, time.Second, 10), 0)
	}
	c.observe(later, later, ok(20, 5, time.Second, 10), 0)
	if got := c.Rate(); math.Abs(got-measured) > 0.02*measured {
		t.Fatalf("rate %v K=%.2fs after the throttle, want back near %v", got, k, measured)
	}
}

// TestSRE: no local rejection while the API accepts; once it accepts nothing, nearly
// every request is rejected locally, (requests − 2 × accepts) / (requests + 1) of them;
// two minutes later the window has forgotten.
func TestSRE(t *testing.T) {
	c := newC(t, Config{Strategy: SRE})
	for i := range 200 {
		now := int64(i) * sec / 10
		if _, out := c.Next(now, 0); out != Send {
			t.Fatalf("step %d: rejected while the API accepts everything", i)
		}
		c.observe(now, now, ok(20, 5, time.Second, 10), 0)
	}
	// 200 requests and 200 accepts in the window: the next 200 pass whatever happens,
	// (400 − 400) / 401 = 0; then each refusal adds a request and no accept, and the
	// part rejected grows to (3200 − 400) / 3201 = 0.87 after 3000 more.
	var first, last int
	for i := range 3000 {
		now := 20*sec + int64(i)*sec/100
		if _, out := c.Next(now, 0); out == Reject {
			switch {
			case i < 200:
				first++
			case i >= 2800:
				last++
			}
			continue
		}
		c.observe(now, now, refused(time.Second), 0)
	}
	if first > 5 || last < 150 || last > 195 {
		t.Fatalf("rejected %d of the first 200 and %d of the last 200 locally while the API refused everything, want about none and about 174", first, last)
	}
	if _, out := c.Next(200*sec, 0); out != Send {
		t.Fatal("still rejecting two minutes after the last request")
	}
}

// TestFastClientBacksOffMore: "when fast and slow clients both hit a limit, the fast
// client is more likely to be chosen": two clients, one four times the other's pace,
// watch the count left fall from the reserve to nothing over a minute (the pool is over
// the limit); the fast one, with more answers, comes down by more, relatively too.
func TestFastClientBacksOffMore(t *testing.T) {
	start := func(pace float64) *Controller {
		c := newC(t, Config{})
		c.observe(1*sec, 1*sec-1, ok(4500, 20, time.Hour, 4500), 0)
		c.s.(*sluiceStrategy).q[reqQ].base = pace
		c.s.(*sluiceStrategy).q[reqQ].updated = 1*sec - 1
		return c
	}
	fast, slow := start(0.8), start(0.2)
	for _, cl := range []struct {
		c     *Controller
		every int64
	}{{fast, sec}, {slow, 4 * sec}} {
		for now := 2 * sec; now <= 62*sec; now += cl.every {
			left := 20 - 20*(now-2*sec)/(60*sec)
			cl.c.observe(now, now-1, ok(4500, left, time.Hour, 4500), 0)
		}
	}
	f, s := fast.Rate()/0.8, slow.Rate()/0.2
	t.Logf("fast: %.3f of its pace left, slow: %.3f", f, s)
	if f >= s || fast.Rate() <= slow.Rate()*0.5 {
		t.Fatalf("the fast client kept %.3f of its pace, the slow one %.3f: want the fast to come down by more (and stay faster)", f, s)
	}
}

// TestCancelKeepsThePace: a slot given back is the next request's, at its time: the
// chain of slots goes on from it, and the next request does not go at once (a cancelled
// slot is not a reset of the pace).
func TestCancelKeepsThePace(t *testing.T) {
	c := newC(t, Config{Jitter: 1e-9})
	c.observe(1*sec, 1*sec-1, ok(10, 2, time.Second, 10), 0)
	at1, out := c.Next(2*sec, 0)
	if out != Send {
		t.Fatalf("first request: %v", out)
	}
	at2, out := c.Next(2*sec, 0)
	if out != Send || at2 <= at1 {
		t.Fatalf("second request: slot %v (%v), want one after %v", at2, out, at1)
	}
	c.Cancel(at2, 0) // its context ended before the slot
	if at3, out := c.Next(2*sec+1, 0); out == Send && at3 < at2 {
		t.Fatalf("after the cancel: a slot at %v, before the cancelled one's %v: the pace was reset", time.Duration(at3-2*sec), time.Duration(at2-2*sec))
	}
	// Given back twice in a row, the slot is still not earlier.
	at3 := send(t, c, 2*sec+2, 0)
	c.Cancel(at3, 0)
	if at4 := send(t, c, 2*sec+3, 0); at4 < at2 {
		t.Fatalf("after two cancels: a slot at %v, before %v", time.Duration(at4-2*sec), time.Duration(at2-2*sec))
	}
}

// TestRefusalHalvesInEveryState: a 429 halves the pace, whatever the controller knows:
// with the limit's rate named, and with none (the pace grows until refused), where it
// used to drop to nothing and start again at one request a second.
func TestRefusalHalvesInEveryState(t *testing.T) {
	bare := func(r int64) ratehdr.Facts {
		return ratehdr.Facts{Status: 200, Quotas: []ratehdr.Quota{{Limit: -1, Remaining: r, Reset: -1, Burst: -1}}}
	}
	u := newC(t, Config{})
	for i := int64(1); i <= 10; i++ {
		at := send(t, u, i*sec-sec/2, 0) // the pace is used: it grows
		u.observe(i*sec, at, bare(50), 0)
	}
	before := u.Rate()
	if before <= 1 {
		t.Fatalf("pace %v after ten answers with room, want it grown above 1/s", before)
	}
	f := ratehdr.Facts{Status: 429, RetryAfter: time.Second, HasRetryAfter: true, Quotas: []ratehdr.Quota{{Limit: -1, Remaining: 0, Reset: -1, Burst: -1}}}
	u.observe(11*sec, 11*sec-1, f, 0)
	if got := u.Rate(); math.Abs(got-before/2) > 1e-9 {
		t.Fatalf("no limit known: pace %v after a 429, want %v (halved)", got, before/2)
	}
	at := send(t, u, 13*sec-sec/2, 0)
	u.observe(13*sec, at, bare(50), 0)
	if got := u.Rate(); got < before/2 || got > before {
		t.Fatalf("no limit known: pace %v after the next 200, want it to grow from %v, not start again", got, before/2)
	}

	k := newC(t, Config{})
	k.observe(1*sec, 1*sec-1, ok(20, 3, time.Second, 10), 0)
	before = k.Rate()
	k.observe(2*sec, 2*sec-1, refused(time.Second), 0)
	if got := k.Rate(); math.Abs(got-before/2) > 1e-9 {
		t.Fatalf("limit known: pace %v after a 429, want %v", got, before/2)
	}
}

// TestBackFromIdleToAFullLimit: a client quiet for a while starts again gently, unless
// the first answer after its quiet finds the limit full: nobody took its pace up, and
// it has it again (a lone client with on and off demand does not lose each spell's
// start to growing back).
func TestBackFromIdleToAFullLimit(t *testing.T) {
	for _, full := range []bool{true, false} {
		c := newC(t, Config{Jitter: 1e-9})
		c.observe(1*sec, 1*sec-1, ok(10, 3, time.Second, 10), 0)
		s := c.s.(*sluiceStrategy)
		s.q[reqQ].base, s.q[reqQ].pace = 8, 8
		at := send(t, c, 2*sec, 0)
		s.q[reqQ].sending = 8 // it has been sending at that pace
		c.observe(at+sec/50, at, ok(10, 3, time.Second, 10), 0)
		before := c.Rate()
		at = send(t, c, 42*sec, 0) // forty seconds quiet
		if got := c.Rate(); got >= before/2 {
			t.Fatalf("pace %v after forty seconds quiet, want a restart well below %v", got, before)
		}
		left := int64(9) // the limit full: nobody spent from it
		if !full {
			left = 2 // others spent it meanwhile
		}
		c.observe(at+sec/50, at, ok(10, left, time.Second, 10), 0)
		if got := c.Rate(); full && got < before || !full && got >= before/2 {
			t.Errorf("full %v: pace %v after the first answer, was %v before the quiet", full, got, before)
		}
	}
}

// TestLateSendMovesTheChain: a request sent later than its slot (a timer that fired late,
// a busy machine) is where the next interval counts from: on a burst of one, the next
// request must not reach the API an interval after the slot when the request went later.
func TestLateSendMovesTheChain(t *testing.T) {
	c := newC(t, Config{})
	c.observe(sec/100, 0, ok(1, 0, time.Second, 1), 0) // 1/s, burst 1: nothing left
	at1 := send(t, c, sec/100, 0)
	late := at1 + 300*int64(time.Millisecond)
	c.observe(late+sec/100, late, ok(1, 0, time.Second, 1), 0)
	at2 := send(t, c, late+sec/100, 0)
	if at2 < late+sec {
		t.Fatalf("the request of the slot at %v went at %v; the next slot is at %v, want at least %v (an interval after it went)",
			time.Duration(at1), time.Duration(late), time.Duration(at2), time.Duration(late+sec))
	}
}

// TestLoneClientOnASmallLimitRecovers: a lone client on 1/s refused once (a request that
// reached the API early: refused for the 20 ms it was early) has the limit's whole rate
// ten seconds later (it no longer halves: TestEarlyArrivalIsNotCongestion; when it did, it
// grew back within ten seconds). Refused for 600 ms (another client's slot), it halves
// and grows back as slowly as before: several clients on a burst of one learn of each other by
// refusals alone, and growing back fast raised their refusals (13.2% to 16.6% in the
// quick matrix's cell of four clients on 2/s burst 2).
func TestLoneClientOnASmallLimitRecovers(t *testing.T) {
	for _, c := range []struct {
		retry    time.Duration
		min, max float64
	}{{20 * time.Millisecond, 0.9, 1}, {600 * time.Millisecond, 0, 0.8}} {
		if got := regrowth(t, c.retry); got < c.min || got > c.max {
			t.Errorf("refused for %v: pace %.2f ten seconds after the 429, want it in [%.1f, %.1f] of the limit's 1/s", c.retry, got, c.min, c.max)
		}
	}
}

// regrowth is the pace of a lone client on 1/s ten seconds after a 429 that named retry.
func regrowth(t *testing.T, retry time.Duration) float64 {
	c := newC(t, Config{})
	rtt := sec / 100
	c.observe(rtt, 0, ok(1, 0, time.Second, 1), 0)
	now := rtt
	for i := 0; now < 60*sec; i++ {
		at := send(t, c, now, 0)
		f := ok(1, 0, time.Second, 1)
		if i == 20 {
			f = refused(retry)
			f.Quotas = ok(1, 0, time.Second, 1).Quotas
		}
		c.observe(at+rtt, at, f, 0)
		now = at + rtt
		if i == 20 {
			if got := c.Rate(); retry >= 100*time.Millisecond && got > 0.6 {
				t.Fatalf("pace %v after the 429, want it halved", got)
			}
			for now < at+10*sec {
				a := send(t, c, now, 0)
				c.observe(a+rtt, a, ok(1, 0, time.Second, 1), 0)
				now = a + rtt
			}
			return c.Rate()
		}
	}
	return 0
}

// TestUnusedPaceDoesNotGrow: a client whose requests never wait for their slots (it
// asks less than its pace allows) does not grow its pace, however much room the answers
// show, as TCP does not grow a window it does not fill (RFC 7661): a pool of such
// clients would otherwise hold paces far above what each sends, and overrun the limit
// together when their demand rises (24 clients on 100/s burst 20, their demand swinging
// over the limit: 1.26% refused, 0.91% now).
func TestUnusedPaceDoesNotGrow(t *testing.T) {
	c := newC(t, Config{})
	c.observe(sec/100, 0, ok(100, 19, time.Second, 20), 0)
	start := c.Rate()
	for now := sec; now <= 60*sec; now += sec { // one request a second, far below its pace
		at := send(t, c, now, 0)
		if at != now {
			t.Fatalf("step %d: a request at %v waited until %v", now/sec, time.Duration(now), time.Duration(at))
		}
		c.observe(at+sec/100, at, ok(100, 19, time.Second, 20), 0)
	}
	if got := c.Rate(); got > 1.5*start {
		t.Fatalf("pace %.1f after a minute of one request a second, from %.1f: want it not grown", got, start)
	}
	// Once its requests wait, it grows with the room.
	now := 61 * sec
	for range 200 {
		at := send(t, c, now, 0)
		c.observe(at+sec/100, at, ok(100, 19, time.Second, 20), 0)
		now = at
	}
	if got := c.Rate(); got < 2*start {
		t.Fatalf("pace %.1f after 200 requests that waited for their slots, from %.1f: want it grown", got, start)
	}
}

// TestSlowStart: a client whose requests wait for their slots, and whose answers show
// room, doubles its pace every Horizon from its cautious start (a sixteenth of the
// limit), as TCP's slow start does: most of the limit within two seconds. (It grew by a
// fifth of the limit per time constant, which stretched with its answers' spacing: 5.2
// a second after two seconds, 9 after four; four clients of Poisson demand at 85% of
// 10/s waited up to 5 s at their start.)
func TestSlowStart(t *testing.T) {
	c := newC(t, Config{})
	rtt := sec / 100
	c.observe(rtt, 0, ok(10, 7, time.Second, 10), 0)
	now := rtt
	for now < 2*sec {
		at := send(t, c, now, 0)
		c.observe(at+rtt, at, ok(10, 9, time.Second, 10), 0)
		now = at + rtt
	}
	if got := c.Rate(); got < 8 {
		t.Fatalf("pace %.2f after two seconds of room, want at least 8 of the limit's 10/s", got)
	}
	// Slow start ends when the count falls to the reserve: the pace is then steady.
	c.observe(now+rtt, now, ok(10, 3, time.Second, 10), 0)
	if s := c.s.(*sluiceStrategy); s.q[reqQ].phase != steady {
		t.Fatalf("phase %v after the count fell to the reserve, want steady", s.q[reqQ].phase)
	}
}

// TestShortQuietKeepsThePace: a client whose demand pauses for two seconds comes back at
// most of the pace it used (it halves every sixteen Horizons quiet, not every one: a pace
// is grown only while used, so the pace it kept is one it used).
func TestShortQuietKeepsThePace(t *testing.T) {
	c := newC(t, Config{Jitter: 1e-9})
	c.observe(1*sec, 1*sec-1, ok(10, 3, time.Second, 10), 0)
	s := c.s.(*sluiceStrategy)
	s.q[reqQ].base, s.q[reqQ].pace = 8, 8
	at := send(t, c, 2*sec, 0)
	c.observe(at+sec/50, at, ok(10, 3, time.Second, 10), 0)
	before := c.Rate()
	send(t, c, at+2*sec, 0) // two seconds quiet
	if got := c.Rate(); got < 0.85*before {
		t.Fatalf("pace %.2f after two seconds quiet, was %.2f: want at least 0.85 of it", got, before)
	}
}

// TestNoLimitKnownFollowsTheCount: with answers that carry the count left and no rate
// (Heroku's RateLimit-Remaining alone), a client grows while the count is high and cuts
// its pace when the count falls low, before any refusal. (It grew by a tenth a second
// until refused: five processes of five goroutines on 4,500 an hour were refused 18.7%
// of the time.)
func TestNoLimitKnownFollowsTheCount(t *testing.T) {
	count := func(r int64) ratehdr.Facts {
		return ratehdr.Facts{Status: 200, Quotas: []ratehdr.Quota{{Limit: -1, Remaining: r, Reset: -1, Burst: -1}}}
	}
	c := newC(t, Config{})
	now := int64(0)
	step := func(r int64) {
		at := send(t, c, now, 0)
		c.observe(at+sec/50, at, count(r), 0)
		now = at + sec/50
	}
	for now < 20*sec {
		step(100) // the count full: nobody spends it
	}
	high := c.Rate()
	if high < 2 {
		t.Fatalf("pace %.2f after 20 s of a full count, want it grown from 1/s", high)
	}
	for range 5 {
		step(3) // the count down to 3 of the 100 it showed: the pool spends the limit
	}
	if got := c.Rate(); got > 0.85*high {
		t.Fatalf("pace %.2f after five answers with 3 left of 100, was %.2f: want it cut before a refusal", got, high)
	}
}

// TestOneRequestBeforeTheFirstAnswer: a client that has learned nothing sends one request
// and waits for its answer before it sends another (TCP starts with a small window): the
// goroutines of one process that ask at once must not send several requests blind,
// which on a burst of one is a 429 for every request but the first. The request's answer
// (or its cancel) lets the next go at the pace it taught; an answer that does not come
// within a second lets another request go, one a second.
func TestOneRequestBeforeTheFirstAnswer(t *testing.T) {
	c := newC(t, Config{Jitter: 1e-9})
	first, out := c.Next(0, 0)
	if out != Send || first != 0 {
		t.Fatalf("first request: slot %v (%v), want now (Send)", first, out)
	}
	for step, now := range []int64{0, sec / 100, sec / 5, sec / 2, sec - 1} {
		if at, out := c.Next(now, 0); out != Wait || at <= now || at > sec {
			t.Fatalf("step %d: at %v before the first answer: slot %v (%v), want Wait, to ask again within the second", step, time.Duration(now), time.Duration(at), out)
		}
	}
	// The answer names 1/s: the next request goes a second after the first.
	c.observe(sec/4, first, ok(1, 0, time.Second, 1), 0)
	if at := send(t, c, sec/4, 0); at < sec || at > sec+sec/2 {
		t.Fatalf("after the answer: slot %v, want about a second after the first", time.Duration(at))
	}

	// An answer that does not come: one more request a second.
	c = newC(t, Config{Jitter: 1e-9})
	if _, out := c.Next(0, 0); out != Send {
		t.Fatalf("first request: %v", out)
	}
	if at, out := c.Next(sec, 0); out != Send || at != sec {
		t.Fatalf("a second on, no answer: slot %v (%v), want now (Send)", time.Duration(at), out)
	}
	if _, out := c.Next(sec, 0); out != Wait {
		t.Fatalf("beside the second blind request: %v, want Wait", out)
	}

	// A first request given back (its context ended): the next goes at once.
	c = newC(t, Config{Jitter: 1e-9})
	at, _ := c.Next(0, 0)
	c.Cancel(at, 0)
	if again, out := c.Next(sec/10, 0); out != Send || again != sec/10 {
		t.Fatalf("after the first request was given back: slot %v (%v), want now (Send)", time.Duration(again), out)
	}
}

// TestBackFromIdleNoSlotFarAhead: a client on a large limit with most of its burst left
// (4,500 an hour) goes quiet for a minute, then two requests come at once. Its measurements
// are old and its pace restarted low (a sixteenth of the limit: one request in 13 s), so
// the second request does not take a slot at that pace: it waits for the first one's
// answer, which finds the limit full and paces it at once. (It took the slot an interval of
// the low pace ahead and waited 13 s: four clients of diurnal demand on 4,500 an hour,
// never over the limit, waited 7.8 s more than under the ideal throttle at the 99th
// percentile.)
func TestBackFromIdleNoSlotFarAhead(t *testing.T) {
	c := newC(t, Config{Jitter: 1e-9})
	rtt := sec / 50
	now := int64(0)
	for range 20 {
		at := send(t, c, now, 0)
		c.observe(at+rtt, at, ok(4500, 4490, time.Hour, 4500), 0)
		now = at + rtt
	}
	now += time.Minute.Nanoseconds()
	first := send(t, c, now, 0)
	if first != now {
		t.Fatalf("the first request after the quiet: slot %v ahead, want now", time.Duration(first-now))
	}
	at, out := c.Next(now, 0)
	if out == Send && at > now+sec {
		t.Fatalf("the second request: a slot %v ahead, at the restarted pace of %.3f/s", time.Duration(at-now), c.Rate())
	}
	if out == Wait && at > now+rtt {
		t.Fatalf("the second request: told to ask again %v later, after the first answer is due", time.Duration(at-now))
	}
	c.observe(first+rtt, first, ok(4500, 4499, time.Hour, 4500), 0)
	if at := send(t, c, first+rtt, 0); at > first+rtt+sec {
		t.Fatalf("after the first answer: the second request's slot %v after it", time.Duration(at-first-rtt))
	}
}

// TestCutAppliesToWhatIsSent: a client of 2000/s burst 400 that sends ten requests a
// second, far below its pace (it started at a sixteenth of the limit, 125 a second, and a
// pace it does not use does not grow, nor shrink while there is room), sees the count
// fall below the reserve as the pool's demand rises over the limit. Its cuts apply to
// what it sends (at most twice that, as Linux grows a window only up to twice what is in
// flight), so that they slow it at once: cut by a few percent an answer from 125 a
// second, it did not slow at all for seconds, and 200 such clients were refused 1.16% of
// the time across a diurnal peak in the guarantee matrix.
func TestCutAppliesToWhatIsSent(t *testing.T) {
	c := newC(t, Config{Jitter: 1e-9})
	rtt := sec / 100
	now := int64(0)
	r := int64(399)
	for step := range 20 {
		at, out := c.Next(now, 0)
		if out != Send || at != now {
			t.Fatalf("step %d: slot %v ahead (%v): a request a tenth of a second should not wait", step, time.Duration(at-now), out)
		}
		c.observe(at+rtt, at, ok(2000, r, time.Second, 400), 0)
		r = max(r-30, 100) // the pool spends 300 a second over the limit, then the limit
		now += sec / 10
	}
	if got := c.Rate(); got > 25 {
		t.Fatalf("pace %.1f/s after a second with the count below the reserve, sending 10/s: want at most 25", got)
	}
}

// TestEarlyArrivalIsNotCongestion: a lone client at the whole rate of 1/s, one of whose
// requests reached the API 20 ms early (its way there slower for the request before it:
// a loaded machine) and was refused for those 20 ms, does not halve its pace: it sends
// the next request when the Retry-After says (the refused one took no permit), and from
// then on spaces its requests by what it was early on top of the round trip. (It halved,
// and a twenty-second run on 1/s lost three of its twenty permits to one such refusal.)
func TestEarlyArrivalIsNotCongestion(t *testing.T) {
	c := newC(t, Config{})
	rtt := sec / 100
	c.observe(rtt, 0, ok(1, 0, time.Second, 1), 0) // 1/s, burst 1: nothing left
	at1 := send(t, c, rtt, 0)
	early := ok(1, 0, time.Second, 1)
	early.Status, early.RetryAfter, early.HasRetryAfter = 429, 20*time.Millisecond, true
	c.observe(at1+rtt, at1, early, 0)
	if got := c.Rate(); got < 0.99 {
		t.Fatalf("pace %.2f after a refusal for arriving 20 ms early, want the whole rate (1/s)", got)
	}
	at2 := send(t, c, at1+rtt, 0)
	if at2 > at1+rtt+20*int64(time.Millisecond)+rtt {
		t.Fatalf("the next request %v after the refused one, want at its Retry-After (30 ms)", time.Duration(at2-at1))
	}
	c.observe(at2+rtt, at2, ok(1, 0, time.Second, 1), 0)
	at3 := send(t, c, at2+rtt, 0)
	if d := time.Duration(at3 - at2); d < time.Second+20*time.Millisecond {
		t.Fatalf("the request after it %v later, want at least 1.02 s (the interval and what it was early)", d)
	}
}

// TestGuardCoversTheLastRoundTrip: a lone client on 1/s (burst 1) whose answers come 2 ms
// away, and one in five 40 ms away (a loaded machine). A request whose way to the API was
// long must not be followed by one whose way is short and arrives early: each request goes
// at least the interval plus the last request's round trip after that request went. The
// mean round trip, which a rare slow answer barely moves, let the next request follow
// 1.007 s after a slow one; the longest of the last sixteen held every request 40 ms
// longer for sixteen seconds after each slow one.
func TestGuardCoversTheLastRoundTrip(t *testing.T) {
	c := newC(t, Config{})
	c.observe(sec/500, 0, ok(1, 0, time.Second, 1), 0) // 1/s, burst 1: nothing left
	now := sec / 500
	var prev, prevRTT int64
	for i := range 20 {
		at := send(t, c, now, 0)
		went := at // as Transport asks: when the slot comes, and again when told to wait
		for g := c.went(at, went); g > went; g = c.went(at, went) {
			went = g
		}
		if i > 0 {
			if d := went - prev; d < sec+prevRTT {
				t.Fatalf("step %d: the request went %v after the last, whose round trip was %v: want at least the interval and that", i, time.Duration(d), time.Duration(prevRTT))
			} else if prevRTT < 10*int64(time.Millisecond) && d > sec+20*int64(time.Millisecond) {
				t.Fatalf("step %d: the request went %v after the last, whose round trip was %v: held longer than an old slow trip needs", i, time.Duration(d), time.Duration(prevRTT))
			}
		}
		rtt := sec / 500
		if i%5 == 0 {
			rtt = 40 * int64(time.Millisecond)
		}
		c.observe(went+rtt, went, ok(1, 0, time.Second, 1), 0)
		prev, prevRTT, now = went, rtt, went+rtt
	}
}

// TestFullLimitAtFirstAnswer: a client whose first answer finds the limit full (10/s,
// burst 10, nine left after its own request: nobody spent from it for a refill's time)
// starts at the part of the limit the count holds above its reserve (4.5 of 10), not at a
// sixteenth: a lone client of eight goroutines used 0.867 of 20/s burst 10 over the demo's
// ten seconds, 0.938 now. A count below full (another client spends it) starts at a
// sixteenth, as before.
func TestFullLimitAtFirstAnswer(t *testing.T) {
	for _, c := range []struct {
		left     int64
		min, max float64
	}{{9, 5, 10}, {6, 0, 1}} {
		ctl := newC(t, Config{})
		ctl.observe(sec/100, 0, ok(10, c.left, time.Second, 10), 0)
		if got := ctl.Rate(); got < c.min || got > c.max {
			t.Errorf("%d of 10 left at the first answer: pace %.2f, want it in [%.0f, %.0f]", c.left, got, c.min, c.max)
		}
	}
}

// TestRefusalsAloneBoundAndStepThePace: with answers that carry nothing but a refusal's
// Retry-After (no rate, no count), a refusal's wait bounds the pace (a wait is for the
// limit's next permit, so the limit's rate is at most one over it), and afterwards every
// client adds the same step each interval the waits taught, whatever its pace: the fast
// and the slow client of a pool draw together. (A client grew by 1% of its pace a second:
// five processes on 4,500 an hour were refused 4.9% of the time.)
func TestRefusalsAloneBoundAndStepThePace(t *testing.T) {
	const rtt = sec / 20
	okBare := ratehdr.Facts{Status: 200}
	refusedBare := func(wait time.Duration) ratehdr.Facts {
		return ratehdr.Facts{Status: 429, RetryAfter: wait, HasRetryAfter: true}
	}
	// busy sends one request at a time, each asked for as soon as the last is answered,
	// until virtual time end, and answers each with f.
	busy := func(c *Controller, now, end int64, f ratehdr.Facts) int64 {
		for now < end {
			at := send(t, c, now, 0)
			c.observe(at+rtt, at, f, 0)
			now = at + rtt
		}
		return now
	}
	fast, slow := newC(t, Config{Jitter: 1e-9}), newC(t, Config{Jitter: 1e-9})
	var now [2]int64
	for i, c := range []*Controller{fast, slow} {
		now[i] = busy(c, 0, 5*sec, okBare) // slow start: the pace doubles every second
		if r := c.Rate(); r < 8 {
			t.Fatalf("client %d: pace %.2f after 5 s of slow start, want at least 8", i, r)
		}
		at := send(t, c, now[i], 0)
		c.observe(at+rtt, at, refusedBare(800*time.Millisecond), 0)
		now[i] = at + rtt + sec
		if r := c.Rate(); r > 1/0.8+1e-9 {
			t.Fatalf("client %d: pace %.4f after a refusal that waits 800 ms, want at most 1.25 a second", i, r)
		}
	}
	// The slow client is refused once more: half the pace of the fast one.
	at := send(t, slow, now[1], 0)
	slow.observe(at+rtt, at, refusedBare(400*time.Millisecond), 0)
	now[1] = at + rtt + sec
	if f, s := fast.Rate(), slow.Rate(); math.Abs(s-f/2) > 1e-9 {
		t.Fatalf("paces %.4f and %.4f, want the second half the first", f, s)
	}
	var grew [2]float64
	for i, c := range []*Controller{fast, slow} {
		before := c.Rate()
		end := now[i] + 400*sec
		busy(c, now[i], end, okBare)
		grew[i] = c.Rate() - before
	}
	// 400 s are 500 intervals of 800 ms: a step of refusedStep of 1.25 a second each.
	want := 500 * refusedStep * 1.25
	for i, g := range grew {
		if math.Abs(g-want) > 0.02*want {
			t.Errorf("client %d: pace grew by %.5f in 400 s, want %.5f (the same step for both)", i, g, want)
		}
	}
}

// TestLongWaitIsNotAnInterval: with answers that carry nothing but a refusal's wait, a
// wait of a second or more (a window's reset, a penalty) is not the limit's interval: the
// refusal halves the pace and holds the client for the wait, and does not bound the pace
// at one request a second (the interval read as at most a second did).
func TestLongWaitIsNotAnInterval(t *testing.T) {
	c := newC(t, Config{Jitter: 1e-9})
	now := int64(0)
	for now < 5*sec {
		at := send(t, c, now, 0)
		c.observe(at+sec/20, at, ratehdr.Facts{Status: 200}, 0)
		now = at + sec/20
	}
	before := c.Rate()
	at := send(t, c, now, 0)
	c.observe(at+sec/20, at, ratehdr.Facts{Status: 429, RetryAfter: 30 * time.Second, HasRetryAfter: true}, 0)
	if got := c.Rate(); math.Abs(got-before/2) > 1e-9 {
		t.Fatalf("pace %.4f after a refusal that waits 30 s, was %.4f: want it halved", got, before)
	}
}
