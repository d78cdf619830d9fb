package wire

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

func TestParseQuery(t *testing.T) {
	cases := []struct {
		in      string
		tag     string
		n, w, p int64
		v, ok   bool
		err     bool
		x       bool
	}{
		{in: "api", tag: "api", n: 1, ok: true},
		{in: "api\r", tag: "api", n: 1, ok: true},
		{in: "", n: 1},
		{in: "a b c", tag: "a b c", n: 1, ok: true}, // spaces are part of a plain tag
		{in: "~~", tag: "~", n: 1, ok: true},
		{in: "~~a", tag: "~a", n: 1, ok: true},
		{in: "~n=5 a", tag: "a", n: 5, ok: true},
		{in: "~n=0,v a", tag: "a", n: 0, v: true, ok: true},
		{in: "~v,n=2,w=300 a b", tag: "a b", n: 2, w: 300, v: true, ok: true},
		{in: "~p=1500 a", tag: "a", n: 1, p: 1500, ok: true},
		{in: "~n=-1 a", err: true, n: 1},
		{in: "~n= a", err: true, n: 1},
		{in: "~y a", err: true, n: 1},
		{in: "~x a", tag: "a", n: 1, x: true, ok: true},
		{in: "~x,n=3 a", tag: "a", n: 3, x: true, ok: true},
		{in: "~x,w=10 a", err: true, n: 1, w: 10, x: true},
		{in: "~x,n=0 a", err: true, n: 0, x: true},
		{in: "~p=5,x a", err: true, n: 1, p: 5, x: true},
		{in: "~v", err: true, n: 1},
		{in: "~ a", err: true, n: 1},
		{in: "~p=0 a", err: true, n: 1},
		{in: "\xff", tag: "\xff", n: 1},
		{in: "a\tb", tag: "a\tb", n: 1},
	}
	for i, c := range cases {
		q, ok, err := ParseQuery([]byte(c.in))
		if (err != nil) != c.err || ok != c.ok || string(q.Tag) != c.tag || q.N != c.n || q.WaitMs != c.w || q.PenaltyMs != c.p || q.Verbose != c.v || q.Expired != c.x {
			t.Errorf("case %d %q: got %+v ok=%v err=%v", i, c.in, q, ok, err)
		}
	}
}

func TestAnswers(t *testing.T) {
	cases := []struct {
		a    Answer
		line string
	}{
		{Answer{Allowed: true, DelayMs: -1, At: -1}, "OK"},
		{Answer{DelayMs: -1, At: -1}, "NO"},
		{Answer{Allowed: true, DelayMs: 0, At: -1}, "OK d=0"},
		{Answer{Allowed: true, DelayMs: 12, Verbose: true, Remaining: 3, ResetMs: 40, At: -1}, "OK d=12 r=3 t=40"},
		{Answer{Verbose: true, RetryMs: 7, Remaining: 0, ResetMs: 99, DelayMs: -1, At: -1}, "NO a=7 r=0 t=99"},
		{Answer{Allowed: true, DelayMs: -1, At: 1700000000000000000}, "OK at=1700000000000000000"},
	}
	for i, c := range cases {
		if got := string(AppendAnswer(nil, c.a)); got != c.line+"\n" {
			t.Errorf("case %d: wrote %q, want %q", i, got, c.line+"\n")
		}
		if got, err := ParseAnswer([]byte(c.line)); err != nil || got != c.a {
			t.Errorf("case %d: read %+v %v, want %+v", i, got, err, c.a)
		}
	}
	var re *RefusedError
	if _, err := ParseAnswer([]byte("ER cost exceeds the burst")); !errors.As(err, &re) || re.Reason != "cost exceeds the burst" {
		t.Errorf("ER: %v", err)
	}
	if _, err := ParseAnswer([]byte("MAYBE")); err == nil {
		t.Error("an unreadable answer was read")
	}
}

// FuzzQueryRoundTrip: every line the daemon accepts reads back the same after the
// client writes it, and every line is answered in a defined way (never a panic).
func FuzzQueryRoundTrip(f *testing.F) {
	for _, s := range []string{"api", "~~x", "~n=5,v a", "~w=100 a", "~p=9 a", "", "\xff", "~", "~~", "~n=99999999999999999999 a", "~T,v,n=0 x y"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if bytes.IndexByte(line, '\n') >= 0 {
			return // a line never holds its newline
		}
		q, ok, err := ParseQuery(line)
		if ok && err != nil {
			t.Fatalf("%q: ok with an error", line)
		}
		if err != nil && (len(line) == 0 || line[0] != EscapeChar) {
			t.Fatalf("%q: a plain line got an error", line)
		}
		if !ok {
			return
		}
		if !ValidTag(q.Tag) || q.N < 0 || q.N > MaxN || q.WaitMs < 0 || q.WaitMs > MaxWaitMs || q.PenaltyMs < 0 || q.PenaltyMs > MaxPenaltyMs {
			t.Fatalf("%q: accepted %+v", line, q)
		}
		out := AppendQuery(nil, q)
		if bytes.IndexByte(out[:len(out)-1], '\n') >= 0 || out[len(out)-1] != '\n' {
			t.Fatalf("%+v written as %q: not one line", q, out)
		}
		q2, ok2, err2 := ParseQuery(out[:len(out)-1])
		if !ok2 || err2 != nil || !bytes.Equal(q2.Tag, q.Tag) || q2.N != q.N || q2.WaitMs != q.WaitMs ||
			q2.PenaltyMs != q.PenaltyMs || q2.Verbose != q.Verbose || q2.Stamp != q.Stamp || q2.Expired != q.Expired {
			t.Fatalf("%q read as %+v, written as %q, read back as %+v (%v %v)", line, q, out, q2, ok2, err2)
		}
	})
}

// FuzzAnswerRoundTrip: every answer the daemon writes reads back the same.
func FuzzAnswerRoundTrip(f *testing.F) {
	f.Add(true, int64(-1), false, int64(0), int64(0), int64(0), int64(-1))
	f.Add(false, int64(5), true, int64(7), int64(3), int64(100), int64(1e18))
	f.Fuzz(func(t *testing.T, allowed bool, delay int64, verbose bool, retry, remaining, reset, at int64) {
		a := Answer{Allowed: allowed, DelayMs: max(delay, -1), Verbose: verbose, RetryMs: max(retry, 0),
			Remaining: max(remaining, 0), ResetMs: max(reset, 0), At: max(at, -1)}
		if !a.Allowed {
			a.DelayMs, a.At = -1, -1 // a denial carries neither
		}
		if !a.Verbose {
			a.RetryMs, a.Remaining, a.ResetMs = 0, 0, 0
		} else if a.Allowed {
			a.RetryMs = 0
		}
		if a.At == math.MinInt64 {
			a.At = -1
		}
		b := AppendAnswer(nil, a)
		got, err := ParseAnswer(b[:len(b)-1])
		if err != nil || got != a {
			t.Fatalf("%+v written as %q read back as %+v %v", a, b, got, err)
		}
	})
}

// TestPriorityOption: c=critical|standard|sheddable reads as the query's class and writes
// back the same; anything else is a bad option.
func TestPriorityOption(t *testing.T) {
	for _, c := range []struct {
		in   string
		prio int8
		err  bool
	}{
		{in: "~c=critical api", prio: 1},
		{in: "~c=sheddable,n=2 api", prio: -1},
		{in: "~c=standard api", prio: 0},
		{in: "~c=urgent api", err: true},
		{in: "~c= api", err: true},
		{in: "~x,c=critical api", err: true},
	} {
		q, ok, err := ParseQuery([]byte(c.in))
		if (err != nil) != c.err || !c.err && (!ok || q.Priority != c.prio || string(q.Tag) != "api") {
			t.Errorf("%q: got %+v ok=%v err=%v", c.in, q, ok, err)
			continue
		}
		if c.err || c.prio == 0 {
			continue
		}
		line := AppendQuery(nil, q)
		back, _, err := ParseQuery(line[:len(line)-1])
		if err != nil || back.Priority != q.Priority || back.N != q.N {
			t.Errorf("%q written as %q, read back as %+v, %v", c.in, line, back, err)
		}
	}
}
