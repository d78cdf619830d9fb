package sluice

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseLimit(t *testing.T) {
	cases := []struct {
		in   string
		want Limit
		str  string
	}{
		{"100/s", Limit{100, time.Second, 100}, "100/s"},
		{"4500/h", Limit{4500, time.Hour, 4500}, "4500/h"},
		{"1/6s", Limit{1, 6 * time.Second, 1}, "1/6s"},
		{"10/s burst=20", Limit{10, time.Second, 20}, "10/s burst=20"},
		{"2/1500ms", Limit{2, 1500 * time.Millisecond, 2}, "2/1500ms"},
		{"1000000000/s", Limit{1e9, time.Second, 1e9}, "1000000000/s"},
		{"50000/24h", Limit{50000, 24 * time.Hour, 50000}, "50000/24h"},
		{"50000/d", Limit{50000, 24 * time.Hour, 50000}, "50000/24h"},
		{"  5/m   burst=1 ", Limit{5, time.Minute, 1}, "5/m burst=1"},
		{"3/second", Limit{3, time.Second, 3}, "3/s"},
		{"7/90s", Limit{7, 90 * time.Second, 7}, "7/90s"},
		{"1/250us", Limit{1, 250 * time.Microsecond, 1}, "1/250us"},
	}
	for i, c := range cases {
		got, err := ParseLimit(c.in)
		if err != nil {
			t.Errorf("case %d %q: %v", i, c.in, err)
			continue
		}
		if got != c.want {
			t.Errorf("case %d %q: got %+v, want %+v", i, c.in, got, c.want)
		}
		if got.String() != c.str {
			t.Errorf("case %d %q: String() = %q, want %q", i, c.in, got.String(), c.str)
		}
		back, err := ParseLimit(got.String())
		if err != nil || back != got {
			t.Errorf("case %d: %q does not round-trip: %+v %v", i, got.String(), back, err)
		}
	}
}

func TestParseLimitErrorsNameThePart(t *testing.T) {
	cases := []struct{ in, part string }{
		{"ten per sec", `"ten"`},
		{"", "empty"},
		{"100", `"100"`},
		{"0/s", `"0"`},
		{"-5/s", `"-5"`},
		{"5/", "no period"},
		{"5/fortnight", `"fortnight"`},
		{"5/0s", `"0s"`},
		{"5/s burst=0", `"0"`},
		{"5/s burst=x", `"x"`},
		{"5/s rate=3", `"rate=3"`},
		{"5/s burst=2 burst=3", "burst given twice"},
		{"2000000000/s", "nanosecond"},
		{"1.5/s", `"1.5"`},
	}
	for i, c := range cases {
		_, err := ParseLimit(c.in)
		if err == nil {
			t.Errorf("case %d %q: no error", i, c.in)
			continue
		}
		if !errors.Is(err, ErrBadLimit) {
			t.Errorf("case %d %q: error %v does not wrap ErrBadLimit", i, c.in, err)
		}
		if !strings.Contains(err.Error(), c.part) || !strings.Contains(err.Error(), "limit") {
			t.Errorf("case %d %q: error %q does not name %s", i, c.in, err, c.part)
		}
	}
}

func TestParseSeveral(t *testing.T) {
	ls, err := Parse("100/s burst=20; 4500/h; 50000/24h")
	if err != nil {
		t.Fatal(err)
	}
	want := Limits{{100, time.Second, 20}, {4500, time.Hour, 4500}, {50000, 24 * time.Hour, 50000}}
	if len(ls) != 3 || ls[0] != want[0] || ls[1] != want[1] || ls[2] != want[2] {
		t.Fatalf("got %v", ls)
	}
	if ls.String() != "100/s burst=20; 4500/h; 50000/24h" {
		t.Errorf("String() = %q", ls.String())
	}
	if _, err := Parse("1/s; 2/s; 3/s; 4/s; 5/s"); err == nil || !strings.Contains(err.Error(), "more than 4") {
		t.Errorf("five limits: %v", err)
	}
	if _, err := Parse("1/s; oops"); err == nil || !strings.Contains(err.Error(), "oops") {
		t.Errorf("bad second limit: %v", err)
	}
	var tl Limits
	if err := tl.UnmarshalText([]byte("1/6s; 10/m")); err != nil || len(tl) != 2 {
		t.Errorf("UnmarshalText: %v %v", tl, err)
	}
}

func TestConstructors(t *testing.T) {
	cases := []struct {
		l    Limit
		str  string
		tNs  time.Duration
		core [2]int64
	}{
		{PerSecond(100), "100/s", 10 * time.Millisecond, [2]int64{1e7, 1e9}},
		{PerMinute(6), "6/m", 10 * time.Second, [2]int64{1e10, 6e10}},
		{PerHour(4500), "4500/h", 800 * time.Millisecond, [2]int64{8e8, 4500 * 8e8}},
		{Every(6 * time.Second), "1/6s", 6 * time.Second, [2]int64{6e9, 6e9}},
		{PerSecond(10).WithBurst(20), "10/s burst=20", 100 * time.Millisecond, [2]int64{1e8, 2e9}},
		{Limit{3, time.Second, 0}, "3/s", 333333334, [2]int64{333333334, 1000000002}},
	}
	for i, c := range cases {
		if c.l.String() != c.str || c.l.Interval() != c.tNs {
			t.Errorf("case %d: %q interval %v, want %q %v", i, c.l.String(), c.l.Interval(), c.str, c.tNs)
		}
		if core := c.l.Core(0); core.T != c.core[0] || core.Tau != c.core[1] {
			t.Errorf("case %d: core %+v, want %v", i, core, c.core)
		}
	}
}

func TestMargin(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		l      Limit
		margin time.Duration
		t, tau int64
	}{
		{PerSecond(20).WithBurst(10), 10 * ms, 50e6, 9 * 50e6},       // one permit of the burst held back
		{PerSecond(20).WithBurst(10), 120 * ms, 50e6, 7 * 50e6},      // ceil(120/50) = 3
		{Every(6 * time.Second), 10 * ms, 6010e6, 6010e6},            // burst 1: spaced T + J
		{PerSecond(100).WithBurst(2), 25 * ms, 10e6 + 15e6, 25e6},    // the reserve would take the burst
		{PerSecond(20).WithBurst(10), 0, 50e6, 10 * 50e6},            // exact
		{PerSecond(20).WithBurst(10), -time.Second, 50e6, 10 * 50e6}, // negative is zero
	}
	for i, c := range cases {
		got := c.l.Core(c.margin)
		if got.T != c.t || got.Tau != c.tau {
			t.Errorf("case %d: %v with margin %v: got T=%d Tau=%d, want %d %d", i, c.l, c.margin, got.T, got.Tau, c.t, c.tau)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"100/s", "4500/h", "1/6s", "10/s burst=20", "2/1500ms", "1000000000/s",
		"100/s burst=20; 4500/h; 50000/24h", "ten per sec", "5/d", "9223372036854775807/h", "1/9223372036854775807ns"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ls, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrBadLimit) {
				t.Fatalf("%q: error %v does not wrap ErrBadLimit", s, err)
			}
			return
		}
		if err := ls.Validate(); err != nil {
			t.Fatalf("%q parsed but does not validate: %v", s, err)
		}
		back, err := Parse(ls.String())
		if err != nil {
			t.Fatalf("%q -> %q does not parse back: %v", s, ls.String(), err)
		}
		if len(back) != len(ls) {
			t.Fatalf("%q -> %q: %d limits, want %d", s, ls.String(), len(back), len(ls))
		}
		for i := range ls {
			if back[i] != ls[i] {
				t.Fatalf("%q -> %q: limit %d is %+v, want %+v", s, ls.String(), i, back[i], ls[i])
			}
			c := ls[i].Core(0)
			if c.Validate() != nil {
				t.Fatalf("%q: core limit %+v invalid", s, c)
			}
		}
	})
}
