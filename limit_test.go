package sluice

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/limitconv"
)

func TestParseOne(t *testing.T) {
	cases := []struct {
		in   string
		want Limit
		str  string
	}{
		{"100/s", Limit{Rate: 100, Period: time.Second, Burst: 100}, "100/s"},
		{"4500/h", Limit{Rate: 4500, Period: time.Hour, Burst: 4500}, "4500/h"},
		{"1/6s", Limit{Rate: 1, Period: 6 * time.Second, Burst: 1}, "1/6s"},
		{"10/s burst=20", Limit{Rate: 10, Period: time.Second, Burst: 20}, "10/s burst=20"},
		{"2/1500ms", Limit{Rate: 2, Period: 1500 * time.Millisecond, Burst: 2}, "2/1500ms"},
		{"1000000000/s", Limit{Rate: 1e9, Period: time.Second, Burst: 1e9}, "1000000000/s"},
		{"50000/24h", Limit{Rate: 50000, Period: 24 * time.Hour, Burst: 50000}, "50000/24h"},
		{"50000/d", Limit{Rate: 50000, Period: 24 * time.Hour, Burst: 50000}, "50000/24h"},
		{"  5/m   burst=1 ", Limit{Rate: 5, Period: time.Minute, Burst: 1}, "5/m burst=1"},
		{"3/second", Limit{Rate: 3, Period: time.Second, Burst: 3}, "3/s"},
		{"7/90s", Limit{Rate: 7, Period: 90 * time.Second, Burst: 7}, "7/90s"},
		{"1/250us", Limit{Rate: 1, Period: 250 * time.Microsecond, Burst: 1}, "1/250us"},
		{"10000/24h window", Limit{Rate: 10000, Period: 24 * time.Hour, Burst: 10000, Window: true}, "10000/24h window"},
		{"5000/h  window", Limit{Rate: 5000, Period: time.Hour, Burst: 5000, Window: true}, "5000/h window"},
		{"100/s ramp=10/s..60s", Limit{Rate: 100, Period: time.Second, Burst: 100, Ramp: Ramp{Rate: 10, Period: time.Second, Over: time.Minute}}, "100/s ramp=10/s..1m"},
		{"100/s ramp=10/s..1m burst=20", Limit{Rate: 100, Period: time.Second, Burst: 20, Ramp: Ramp{Rate: 10, Period: time.Second, Over: time.Minute}}, "100/s burst=20 ramp=10/s..1m"},
		{"6000/m ramp=1/s..90s", Limit{Rate: 6000, Period: time.Minute, Burst: 6000, Ramp: Ramp{Rate: 1, Period: time.Second, Over: 90 * time.Second}}, "6000/m ramp=1/s..90s"},
		{"100/s ramp=100/s..2h", Limit{Rate: 100, Period: time.Second, Burst: 100, Ramp: Ramp{Rate: 100, Period: time.Second, Over: 2 * time.Hour}}, "100/s ramp=100/s..2h"},
	}
	for i, c := range cases {
		got, err := parseLimit(c.in)
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
		back, err := parseLimit(got.String())
		if err != nil || back != got {
			t.Errorf("case %d: %q does not round-trip: %+v %v", i, got.String(), back, err)
		}
	}
}

func TestParseErrorsNameThePart(t *testing.T) {
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
		{"10/s window burst=5", "has no burst"},
		{"10/s window window", "window given twice"},
		{"10/s ramp=20/s..1m", "no faster than the limit"},
		{"10/s ramp=1/s", "RATE/PERIOD..DURATION"},
		{"10/s ramp=1/s..s", "count and a unit"},
		{"10/s ramp=0/s..1m", "positive whole number"},
		{"10/s ramp=1..1m", "no '/'"},
		{"10/s ramp=1/s..0s", "positive"},
		{"10/s ramp=1/s..1m ramp=2/s..1m", "ramp given twice"},
		{"10/h window ramp=1/h..1h", "cannot ramp"},
		{"3/2ns window", "nanosecond"},
	}
	for i, c := range cases {
		_, err := parseLimit(c.in)
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
	want := Limits{{Rate: 100, Period: time.Second, Burst: 20}, {Rate: 4500, Period: time.Hour, Burst: 4500}, {Rate: 50000, Period: 24 * time.Hour, Burst: 50000}}
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

func FuzzParse(f *testing.F) {
	for _, s := range []string{"100/s", "4500/h", "1/6s", "10/s burst=20", "2/1500ms", "1000000000/s",
		"100/s burst=20; 4500/h; 50000/24h", "ten per sec", "5/d",
		"10000/24h window", "100/s ramp=10/s..60s", "100/s burst=20 ramp=1/m..1h; 5000/h window", "10/s window burst=5",
		"10/s ramp=20/s..1m", "1/9223372036854775807ns ramp=1/9223372036854775807ns..9223372036854775807ns", "9223372036854775807/h", "1/9223372036854775807ns"} {
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
			c := limitconv.Core(ls[i:i+1], 0)[0]
			if c.Validate() != nil {
				t.Fatalf("%q: core limit %+v invalid", s, c)
			}
		}
	})
}

// parseLimit is Parse for one limit.
func parseLimit(s string) (Limit, error) {
	ls, err := Parse(s)
	if err != nil {
		return Limit{}, err
	}
	if len(ls) != 1 {
		return Limit{}, fmt.Errorf("%q: %d limits, want one", s, len(ls))
	}
	return ls[0], nil
}
