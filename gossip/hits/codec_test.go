package hits

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestCodecRoundTripAndSplit(t *testing.T) {
	r := Report{From: "127.0.0.1:7946", Inc: 1 << 40, Seq: 7}
	for i := range 200 {
		r.Entries = append(r.Entries, Entry{Tag: strings.Repeat("t", i%40), Gen: uint64(i), Hits: uint64(i) << 20, Recent: 3, Demand: 150000, Hold: int64(i) * 1e6})
	}
	parts, skipped := Encode(&r, 1200)
	if skipped != 0 || len(parts) < 2 {
		t.Fatalf("got %d parts, %d skipped; want several parts, none skipped", len(parts), skipped)
	}
	var got []Entry
	for i, p := range parts {
		if len(p) > 1200 {
			t.Fatalf("part %d: %d bytes, want at most 1200", i, len(p))
		}
		rs, err := Decode(p)
		if err != nil || len(rs) != 1 {
			t.Fatalf("part %d: %v (%d reports)", i, err, len(rs))
		}
		if rs[0].From != r.From || rs[0].Inc != r.Inc || rs[0].Seq != r.Seq {
			t.Fatalf("part %d: header %+v", i, rs[0])
		}
		got = append(got, rs[0].Entries...)
	}
	if !reflect.DeepEqual(got, r.Entries) {
		t.Fatalf("entries differ after the round trip")
	}
	// The parts back to back (a stream) decode as the same reports.
	rs, err := Decode(bytes.Join(parts, nil))
	if err != nil || len(rs) != len(parts) {
		t.Fatalf("stream: %v, %d reports, want %d", err, len(rs), len(parts))
	}
	// An entry too large for any part is counted, not truncated.
	big := Report{From: "a", Entries: []Entry{{Tag: strings.Repeat("x", 2000)}, {Tag: "ok"}}}
	parts, skipped = Encode(&big, 1200)
	if skipped != 1 || len(parts) != 1 {
		t.Fatalf("big entry: %d parts, %d skipped; want 1 and 1", len(parts), skipped)
	}
	// A heartbeat (no entries) is one part.
	if parts, _ := Encode(&Report{From: "a"}, 1200); len(parts) != 1 {
		t.Fatalf("heartbeat: %d parts", len(parts))
	}
}

func TestDecodeRefusesBadInput(t *testing.T) {
	good, _ := Encode(&Report{From: "a", Entries: []Entry{{Tag: "x", Hits: 1}}}, 1200)
	for i, b := range [][]byte{
		nil,
		{Version},
		{2, kindReport, 1, 'a', 0, 0, 0},         // another version
		{Version, 9, 1, 'a', 0, 0, 0},            // another kind
		{Version, kindReport, 0, 0, 0, 0},        // no sender
		{Version, kindReport, 1, 'a', 0, 0, 100}, // more entries than bytes
		good[0][:len(good[0])-1],                 // cut short
	} {
		if _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("step %d: got %v, want ErrMalformed", i, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	parts, _ := Encode(&Report{From: "n1", Inc: 3, Seq: 9, Entries: []Entry{{Tag: "api", Gen: 1, Hits: 10, Recent: 2, Demand: 5000, Hold: 1e9}}}, 1200)
	f.Add(parts[0])
	f.Add([]byte{Version, kindReport, 1, 'a', 0, 0, 0})
	for _, r := range []Report{
		{From: "n1", Tree: KindUp, Entries: []Entry{{Tag: "api", Gen: 1, Hits: 10, Bins: []Bin{{Idx: 0, Count: 2}, {Idx: 90, Count: 1}}}}},
		{From: "n2", Tree: KindDown, Entries: []Entry{{Tag: "api", Root: 7, Gen: 1, Seq: 3, Hits: 10, Level: 5, Demand: 6, Nodes: 40}}},
	} {
		parts, _ := Encode(&r, 1200)
		f.Add(parts[0])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rs, err := Decode(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to reports that decode the same.
		for _, r := range rs {
			ps, skipped := Encode(&r, 1<<21)
			if skipped != 0 {
				t.Fatalf("re-encoding skipped %d entries", skipped)
			}
			back, err := Decode(bytes.Join(ps, nil))
			if err != nil {
				t.Fatalf("re-encoded report does not decode: %v", err)
			}
			var es []Entry
			for _, x := range back {
				es = append(es, x.Entries...)
			}
			if len(es) != len(r.Entries) || (len(es) > 0 && !reflect.DeepEqual(es, r.Entries)) {
				t.Fatalf("round trip changed the entries")
			}
		}
	})
}

// TestCodecTreeReports: a tree's reports (up, with a histogram; down, with the pool's
// aggregate) come back from the wire as they went, kind and all.
func TestCodecTreeReports(t *testing.T) {
	up := Report{From: "a", Inc: 3, Seq: 9, Tree: KindUp, Entries: []Entry{
		{Tag: "api", Gen: 2, Hits: 1 << 33, Recent: 40, Hold: 5e8, Bins: []Bin{{Idx: 0, Count: 3}, {Idx: 200, Count: 1 << 20}}},
		{Tag: "", Gen: 1},
	}}
	down := Report{From: "b", Inc: 1, Seq: 2, Tree: KindDown, Entries: []Entry{
		{Tag: "api", Root: 1<<64 - 1, Gen: 4, Seq: 77, Hits: 123456, Recent: 9, Hold: 1, Booked: 2e9, Level: 12345, Demand: 99999, Nodes: 1000},
	}}
	for _, r := range []Report{up, down} {
		parts, _ := Encode(&r, 1200)
		rs, err := Decode(bytes.Join(parts, nil))
		if err != nil || len(rs) != 1 {
			t.Fatalf("kind %d: %v, %d reports", r.Tree, err, len(rs))
		}
		if !reflect.DeepEqual(rs[0], r) {
			t.Errorf("kind %d: got %+v, want %+v", r.Tree, rs[0], r)
		}
	}
	// Bins out of order are malformed (a sender keeps them sorted; a receiver adds them).
	bad := up
	bad.Entries = []Entry{{Tag: "x", Bins: []Bin{{Idx: 5, Count: 1}, {Idx: 4, Count: 1}}}}
	parts, _ := Encode(&bad, 1200)
	if _, err := Decode(parts[0]); !errors.Is(err, ErrMalformed) {
		t.Errorf("bins out of order: %v, want ErrMalformed", err)
	}
}
