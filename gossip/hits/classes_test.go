package hits

import (
	"reflect"
	"testing"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/priority"
)

// TestAskKeptRoundTrip: an ask that keeps part of the burst goes as kind 8 with its keeps,
// and comes back with the same kept limits; asks that keep nothing in the same message
// come back without; a batch with none stays kind 3, byte for byte as before; a keep
// that leaves less than a permit is refused.
func TestAskKeptRoundTrip(t *testing.T) {
	core := []gcra.Limit{{T: sec / 10, Tau: sec}, {T: sec, Tau: 5 * sec}}
	kept := []gcra.Limit{{T: sec / 10, Tau: sec - 4*sec/10}, {T: sec, Tau: 5 * sec}}
	asks := []Ask{
		{ID: 1, Tag: "api", N: 1, MaxDelay: sec, Limits: core, Kept: kept},
		{ID: 2, Tag: "api", N: 1, Limits: core},
	}
	msg := EncodeAsks("n1", asks)
	if MessageKind(msg) != KindAskKept {
		t.Fatalf("kind %d, want %d", MessageKind(msg), KindAskKept)
	}
	from, got, err := DecodeAsks(msg)
	if err != nil || from != "n1" || !reflect.DeepEqual(got, asks) {
		t.Fatalf("got %q %+v, %v; want %+v", from, got, err, asks)
	}
	if len(msg) > AsksHeader(2)+len(AppendAsk(nil, &asks[0]))+len(AppendAsk(nil, &asks[1]))+len(core) {
		t.Errorf("%d bytes: more than the header, the asks' forms and a byte a limit", len(msg))
	}
	plain := EncodeAsks("n1", asks[1:])
	if MessageKind(plain) != KindAsk {
		t.Errorf("asks that keep nothing: kind %d, want %d", MessageKind(plain), KindAsk)
	}
	bad := EncodeAsks("n1", []Ask{{ID: 1, Tag: "a", N: 1, Limits: core[:1], Kept: []gcra.Limit{{T: sec / 10, Tau: 0}}}})
	if _, _, err := DecodeAsks(bad); err == nil {
		t.Error("a keep of the whole burst: no error")
	}
}

// TestClassesRoundTrip: posts, reads and an owner's board come back from the wire as they
// went; bad bytes are refused.
func TestClassesRoundTrip(t *testing.T) {
	post, ok := PostEntry("api", priority.Critical, sec)
	if !ok {
		t.Fatal("critical: no post")
	}
	if _, ok := PostEntry("api", priority.Sheddable, sec); ok {
		t.Error("sheddable: a post, want none (the board keeps critical and standard)")
	}
	es := []ClassEntry{
		post,
		{Tag: "tenant-7", Flags: FlagStandard | FlagRead, Lasts: [2]int64{0, 2 * sec}},
		{Tag: "api", Flags: FlagBoard | FlagCritical | FlagStandard, Ago: [2]int64{30e6, 5e6}, Lasts: [2]int64{sec, sec}},
		{Tag: "x", Flags: FlagBoard},
	}
	msg := EncodeClasses("n2", es)
	from, got, err := DecodeClasses(msg)
	if err != nil || from != "n2" || !reflect.DeepEqual(got, es) {
		t.Fatalf("got %q %+v, %v; want %+v", from, got, err, es)
	}
	for i, b := range [][]byte{nil, {Version, KindClasses}, {Version, KindClasses, 1, 'a', 0},
		{Version, KindClasses, 1, 'a', 1, 1, 'x', 0x40}, append(msg, 0), msg[:len(msg)-1], EncodeAsks("a", []Ask{{ID: 1, Tag: "a", Limits: []gcra.Limit{{T: 1, Tau: 1}}}})} {
		if _, _, err := DecodeClasses(b); err == nil {
			t.Errorf("step %d: DecodeClasses(%v): no error", i, b)
		}
	}
	// The report decoder refuses it (a node of an earlier release counts it malformed).
	if _, err := Decode(msg); err == nil {
		t.Error("Decode took a classes message")
	}
}

func FuzzDecodeClasses(f *testing.F) {
	f.Add(EncodeClasses("n1", []ClassEntry{{Tag: "api", Flags: FlagCritical | FlagRead, Lasts: [2]int64{sec}}}))
	f.Add(EncodeClasses("n1", []ClassEntry{{Tag: "api", Flags: FlagBoard | FlagStandard, Ago: [2]int64{0, 9}, Lasts: [2]int64{0, sec}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		from, es, err := DecodeClasses(b)
		if err != nil {
			return
		}
		from2, back, err := DecodeClasses(EncodeClasses(from, es))
		if err != nil || from2 != from || !reflect.DeepEqual(back, es) {
			t.Fatalf("round trip: %q %+v, %v; want %q %+v", from2, back, err, from, es)
		}
	})
}

// TestBoard: a class posted reads back as posted a moment ago, within the time it was
// posted for, and not after; a class not posted reads as not posted; another key's posts
// are its own; a peer's read is answered with the board, which the peer then reads as
// its own.
func TestBoard(t *testing.T) {
	owner, _ := New("owner", 1, DefaultConfig(), 0)
	peer, _ := New("peer", 2, DefaultConfig(), 0)
	steps := []struct {
		at         int64
		key        string
		post       priority.Class
		c, s       int64 // Posted: want
		peerC      int64 // the peer's, after a read answered at at
		postLasts  int64
		doPost     bool
		doPeerRead bool
	}{
		{at: 0, key: "api", c: -1, s: -1},
		{at: sec / 10, key: "api", post: priority.Critical, doPost: true, postLasts: sec, c: 0, s: -1, doPeerRead: true, peerC: 0},
		{at: sec / 10, key: "api", post: priority.Sheddable, doPost: true, postLasts: sec, c: 0, s: -1},
		{at: sec / 2, key: "api", c: 4 * sec / 10, s: -1, doPeerRead: true, peerC: 4 * sec / 10},
		{at: sec / 2, key: "other", c: -1, s: -1},
		{at: sec/2 + 1, key: "api", post: priority.Standard, doPost: true, postLasts: sec, c: 4*sec/10 + 1, s: 0},
		{at: sec + sec/10, key: "api", c: -1, s: 6*sec/10 - 1, doPeerRead: true, peerC: -1},
	}
	for i, st := range steps {
		if st.doPost {
			if err := owner.Post(st.key, st.post, st.postLasts, st.at); err != nil {
				t.Fatal(err)
			}
		}
		if c, s := owner.Posted(st.key, st.at); c != st.c || s != st.s {
			t.Errorf("step %d: Posted(%q) = %d, %d; want %d, %d", i, st.key, c, s, st.c, st.s)
		}
		if st.doPeerRead {
			read := []ClassEntry{{Tag: st.key, Flags: FlagRead}}
			replies := owner.Classes(read, st.at)
			peer.Classes(replies, st.at)
			if c, _ := peer.Posted(st.key, st.at); c != st.peerC {
				t.Errorf("step %d: the peer's Posted(%q) critical = %d; want %d", i, st.key, c, st.peerC)
			}
		}
	}
	// A post that comes in a message is recorded, for the time it lasts from then.
	post, _ := PostEntry("k", priority.Standard, sec)
	owner.Classes([]ClassEntry{post}, 0)
	if _, s := owner.Posted("k", sec-1); s != sec-1 {
		t.Errorf("a post by message: standard %d ago at %d, want %d", s, sec-1, sec-1)
	}
	if _, s := owner.Posted("k", sec); s != -1 {
		t.Errorf("a post by message: still posted %d ago after the second it lasts", s)
	}
}

// TestDecideKept: at a key's owner, decisions under limits that keep 40% of the burst
// leave it to a decision under the whole limits: a flood that keeps it takes 6 of a burst
// of 10, a critical decision then takes the rest. By shares the headroom is not kept: the
// flood takes the whole burst. Kept limits that are not the core's, kept, are refused.
func TestDecideKept(t *testing.T) {
	core := []gcra.Limit{{T: sec / 10, Tau: sec}} // 10/s burst=10
	kept, ok := core[0].Keeping(0.4)
	if !ok {
		t.Fatal("keeping 40% of 10")
	}
	ks := []gcra.Limit{kept}
	for _, c := range []struct {
		policy Policy
		flood  int // of the burst, to the flood that keeps 40%
	}{{Owner, 6}, {Shares, 10}} {
		cfg := DefaultConfig()
		cfg.Policy = c.policy
		n, _ := New("n", 1, cfg, 0)
		var res gcra.Result
		var tk gcra.Ticket
		granted := 0
		for range 20 {
			res, tk = gcra.Result{}, gcra.Ticket{}
			if err := n.DecideKept(&res, &tk, "api", core, ks, 0, 1, 0); err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				granted++
			}
		}
		if granted != c.flood {
			t.Errorf("%v: the flood keeping 40%%: %d of a burst of 10 granted, want %d", c.policy, granted, c.flood)
		}
		for i := range 10 - c.flood {
			res = gcra.Result{}
			if err := n.DecideTo(&res, &tk, "api", core, 0, 1, 0); err != nil || !res.Allowed {
				t.Errorf("%v: critical decision %d: %+v, %v; want granted (the headroom kept)", c.policy, i, res, err)
			}
		}
		res = gcra.Result{}
		if err := n.DecideTo(&res, &tk, "api", core, 0, 1, 0); err != nil || res.Allowed {
			t.Errorf("%v: the eleventh permit of a burst of 10: %+v, %v; want denied", c.policy, res, err)
		}
	}
	n, _ := New("n", 1, DefaultConfig(), 0)
	var res gcra.Result
	var tk gcra.Ticket
	other := []gcra.Limit{{T: sec / 5, Tau: sec / 2}}
	if err := n.DecideKept(&res, &tk, "api", core, other, 0, 1, 0); err == nil {
		t.Error("kept limits of another rate: no error")
	}
}
