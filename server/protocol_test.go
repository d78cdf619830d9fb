package server

import (
	"bytes"
	"testing"

	"github.com/sluicehq/sluice/internal/wire"
)

func TestParseLine(t *testing.T) {
	cases := []struct {
		in      string
		tag     string
		n, w, p int64
		v, ok   bool
		err     bool
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
		{in: "~x a", err: true, n: 1},
		{in: "~v", err: true, n: 1},
		{in: "~ a", err: true, n: 1},
		{in: "~p=0 a", err: true, n: 1},
		{in: "\xff", tag: "\xff", n: 1},
		{in: "a\tb", tag: "a\tb", n: 1},
	}
	for i, c := range cases {
		q, ok, err := parseLine([]byte(c.in))
		if (err != nil) != c.err || ok != c.ok || string(q.tag) != c.tag || q.n != c.n || q.wait != c.w || q.penalize != c.p || q.verbose != c.v {
			t.Errorf("case %d %q: got %+v ok=%v err=%v", i, c.in, q, ok, err)
		}
	}
}

func FuzzParseLine(f *testing.F) {
	for _, s := range []string{"api", "~~x", "~n=5,v a", "~w=100 a", "~p=9 a", "", "\xff", "~", "~~", "~n=99999999999999999999 a"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if bytes.IndexByte(line, '\n') >= 0 {
			return // a line never holds its newline
		}
		q, ok, err := parseLine(line)
		if ok && err != nil {
			t.Fatalf("%q: ok with an error", line)
		}
		if ok {
			if !wire.ValidTag(q.tag) || q.n < 0 {
				t.Fatalf("%q: accepted tag %q n=%d", line, q.tag, q.n)
			}
			// What a client writes for a tag, the daemon reads back as that tag.
			var esc []byte
			if q.tag[0] == EscapeChar {
				esc = append(esc, EscapeChar)
			}
			esc = append(esc, q.tag...)
			if q2, ok2, _ := parseLine(esc); !ok2 || !bytes.Equal(q2.tag, q.tag) {
				t.Fatalf("tag %q does not survive escaping", q.tag)
			}
		}
		if err != nil && (len(line) == 0 || line[0] != EscapeChar) {
			t.Fatalf("%q: a plain line got an error", line)
		}
	})
}
