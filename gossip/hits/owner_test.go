package hits

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/gcra"
)

// ownerPool makes n nodes under the Owner policy that know each other and have heard
// each other once (a pool that started together: nothing is fenced).
func ownerPool(t *testing.T, n int) []*Node {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Policy = Owner
	var nodes []*Node
	for i := range n {
		nd, err := New(string(rune('a'+i)), uint64(i+1), cfg, 0)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, nd)
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.Join(b.Name(), 0)
			}
		}
	}
	exchange(nodes, 1)
	return nodes
}

// exchange has every node report at now and every other node receive it at once.
func exchange(nodes []*Node, now int64) {
	var reps []Report
	for _, n := range nodes {
		reps = append(reps, n.Report(now))
	}
	for _, n := range nodes {
		for i := range reps {
			n.Receive(now, &reps[i])
		}
	}
}

func byName(nodes []*Node, name string) *Node {
	for _, n := range nodes {
		if n.Name() == name {
			return n
		}
	}
	return nil
}

// TestOwnerAgreesAndMovesFenced: the nodes agree on a key's owner (rendezvous hashing);
// the others route to it and it decides alone. When it leaves, the next owner grants no
// permit before the bookings the old owner reported (callers wait for them) and no burst
// again.
func TestOwnerAgreesAndMovesFenced(t *testing.T) {
	nodes := ownerPool(t, 3)
	lim := []gcra.Limit{{T: sec, Tau: 5 * sec}} // 1/s burst 5
	owner := ""
	for _, n := range nodes {
		o, _ := n.Route("api", lim)
		if o == "" {
			o = n.Name()
		}
		if owner != "" && o != owner {
			t.Fatalf("%s routes api to %s, another to %s", n.Name(), o, owner)
		}
		owner = o
	}
	old := byName(nodes, owner)
	now := 2 * sec
	// The burst at once, then fifteen more reserved ahead (callers that wait up to 20 s):
	// further than the two bursts of debt a peer's hits are charged up to.
	for i := range 20 {
		res, _, err := old.Decide("api", lim, now, 1, 20*sec)
		if err != nil || !res.Allowed {
			t.Fatalf("grant %d at the owner: %+v %v", i, res, err)
		}
	}
	exchange(nodes, now+sec/10) // the owner's report, with its bookings
	var rest []*Node
	for _, n := range nodes {
		if n != old {
			n.Leave(owner, now+sec/5, true)
			rest = append(rest, n)
		}
	}
	next, _ := rest[0].Route("api", lim)
	if next == "" {
		next = rest[0].Name()
	}
	heir := byName(rest, next)
	// The old owner booked the bucket 15 s ahead: nothing before then, then one a second.
	at := now + sec/5
	res, _, _ := heir.Decide("api", lim, at, 1, 0)
	if res.Allowed {
		t.Fatalf("the next owner granted at once what the old owner had booked: %+v", res)
	}
	granted := 0
	for ; at < now+18*sec; at += sec / 10 {
		if r, _, _ := heir.Decide("api", lim, at, 1, 0); r.Allowed {
			granted++
			if at < now+15*sec-sec/2 {
				t.Fatalf("the next owner granted at %.1f s, within the old owner's bookings (to %.1f s)", float64(at)/1e9, float64(now+15*sec)/1e9)
			}
		}
	}
	if granted < 2 || granted > 4 {
		t.Errorf("the next owner granted %d in the 3 s after the bookings, want about one a second", granted)
	}
}

// TestOwnerOnlyForSmallLimitsUnderAuto: Auto routes a limit whose burst, or refill in a
// sync interval, gives each node less than AutoBurst permits, and decides a large and hot
// one by shares; windows never route.
func TestOwnerOnlyForSmallLimitsUnderAuto(t *testing.T) {
	nodes := ownerPool(t, 3)
	for _, n := range nodes {
		n.cfg.Policy = Auto
	}
	small := []gcra.Limit{{T: sec / 100, Tau: 20 * sec / 100}}    // 100/s burst 20
	large := []gcra.Limit{{T: sec / 1000, Tau: 400 * sec / 1000}} // 1000/s burst 400
	window := []gcra.Limit{{T: sec / 100, Tau: 20 * sec / 100, Window: 20 * sec / 100}}
	slow := []gcra.Limit{{T: sec * 4 / 5, Tau: 4500 * sec * 4 / 5}} // 4,500/h: a large burst, a slow rate
	routed := 0
	for _, n := range nodes {
		if o, _ := n.Route("k", small); o != "" {
			routed++
		}
		if o, routed := n.Route("k", large); o != "" || routed {
			t.Errorf("%s routes a 400-permit burst over 3 nodes to %s, want shares", n.Name(), o)
		}
		if o, routed := n.Route("k", window); o != "" || routed {
			t.Errorf("%s routes a window to %s, want it decided here", n.Name(), o)
		}
		if _, routed := n.Route("k", slow); !routed {
			t.Errorf("%s decides 4,500/h by shares, want it at the owner (each node refills less than AutoBurst a sync interval)", n.Name())
		}
	}
	if routed != 2 {
		t.Errorf("%d of 3 nodes route a small limit elsewhere, want 2 (all but its owner)", routed)
	}
}

// TestAskAnswerRoundTrip: forwarded requests and their answers survive the codec, one or
// several to a message, and bad bytes are refused.
func TestAskAnswerRoundTrip(t *testing.T) {
	asks := []Ask{
		{ID: 7, Tag: "api", N: 2, MaxDelay: 3 * sec, Limits: []gcra.Limit{{T: sec, Tau: 5 * sec}, {T: sec / 10, Tau: sec}}},
		{ID: 8, Tag: "tenant-42", N: 1, Limits: []gcra.Limit{{T: sec / 100, Tau: sec / 5}}},
	}
	for n := 1; n <= len(asks); n++ {
		msg := EncodeAsks("10.0.0.1:7946", asks[:n])
		from, got, err := DecodeAsks(msg)
		if err != nil || from != "10.0.0.1:7946" || !reflect.DeepEqual(got, asks[:n]) {
			t.Errorf("%d asks: got %q %+v, %v; want %+v", n, from, got, err, asks[:n])
		}
		if size := AsksHeader(len(from)); len(msg) > size+len(AppendAsk(AppendAsk(nil, &asks[0]), &asks[1])) {
			t.Errorf("%d asks: %d bytes, more than the header and the asks' forms", n, len(msg))
		}
	}
	answers := []Answer{
		{ID: 7, Outcome: Granted, Result: gcra.Result{Allowed: true, Delay: 12, Remaining: 3, ResetAfter: 99}},
		{ID: 8, Outcome: Denied, Result: gcra.Result{RetryAfter: 5}},
	}
	gotA, err := DecodeAnswers(EncodeAnswers(answers))
	if err != nil || !reflect.DeepEqual(gotA, answers) {
		t.Errorf("answers: got %+v, %v; want %+v", gotA, err, answers)
	}
	if MessageKind(EncodeAsks("a", asks)) != KindAsk || MessageKind(EncodeAnswers(answers)) != KindAnswer {
		t.Error("MessageKind does not tell asks from answers")
	}
	bad := [][]byte{nil, {Version}, {Version, KindAsk}, {Version, KindAsk, 1, 'a', 0}, {Version, KindAsk, 1, 'a', 1, 7, 0},
		{Version, KindAnswer, 1, 9, 9, 0, 0, 0, 0}, {Version, KindAnswer, 0}, append(EncodeAsks("a", asks), 0), append(EncodeAnswers(answers), 0)}
	for _, b := range bad {
		if _, _, err := DecodeAsks(b); err == nil {
			t.Errorf("DecodeAsks(%v): no error", b)
		}
		if _, err := DecodeAnswers(b); err == nil {
			t.Errorf("DecodeAnswers(%v): no error", b)
		}
	}
}

// TestSharesFollowWaitingCallers: two nodes decide a hot limit by shares; their callers
// wait for reservations and ask again once served (a closed loop: what a node asks is what
// it is granted), 16 at one node (up to 1,600/s) and 128 at the other, each busy 10 ms after its
// permit. Shares follow the callers left waiting (the permits booked ahead of a node's
// share), so both get about half of the limit; counted by what was asked alone, the
// shares lock at whatever they started from.
func TestSharesFollowWaitingCallers(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy = Shares
	lim := []gcra.Limit{{T: sec / 2000, Tau: 400 * sec / 2000}} // 2000/s burst 400
	var nodes []*Node
	for i := range 2 {
		nd, err := New(string(rune('a'+i)), uint64(i+1), cfg, 0)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, nd)
	}
	nodes[0].Join("b", 0)
	nodes[1].Join("a", 0)
	callers := [][]int64{make([]int64, 16), make([]int64, 128)} // when each asks next
	var granted [2]int
	const step = sec / 1000
	for now := step; now <= 30*sec; now += step {
		if now%(sec/10) == 0 {
			exchange(nodes, now)
		}
		for i, cs := range callers {
			for c := range cs {
				if cs[c] > now {
					continue
				}
				res, _, err := nodes[i].Decide("api", lim, now, 1, sec)
				if err != nil {
					t.Fatal(err)
				}
				if !res.Allowed {
					cs[c] = now + max(res.RetryAfter, step)
					continue
				}
				cs[c] = now + res.Delay + 10*step
				if now > 10*sec {
					granted[i]++
				}
			}
		}
	}
	ratio := float64(granted[0]) / float64(granted[1])
	t.Logf("over the last 20 s: 16 callers %d, 128 callers %d (ratio %.2f)", granted[0], granted[1], ratio)
	if ratio < 0.8 || ratio > 1.25 {
		t.Errorf("16 callers got %d and 128 callers %d: want about half each", granted[0], granted[1])
	}
}

// TestPolicyForAKey: a key's own policy (PolicyFor, a daemon rule's `gossip:`) chooses
// whether it has an owner in place of the node's: under Auto, a large limit whose key says
// Owner is decided at its owner, and a small one whose key says Shares by shares; keys
// that say nothing follow Auto.
func TestPolicyForAKey(t *testing.T) {
	nodes := ownerPool(t, 3)
	own := map[string]Policy{"exact\x1f": Owner, "loose\x1f": Shares}
	for _, n := range nodes {
		n.cfg.Policy = Auto
		n.cfg.PolicyFor = func(key string) (Policy, bool) {
			p, ok := own[key]
			return p, ok
		}
	}
	small := []gcra.Limit{{T: sec / 100, Tau: 20 * sec / 100}}    // 100/s burst 20: Auto routes it
	large := []gcra.Limit{{T: sec / 1000, Tau: 400 * sec / 1000}} // 1000/s burst 400: Auto shares it
	for _, n := range nodes {
		if _, routed := n.Route("exact\x1f", large); !routed {
			t.Errorf("%s shares a key whose policy is Owner", n.Name())
		}
		if _, routed := n.Route("loose\x1f", small); routed {
			t.Errorf("%s routes a key whose policy is Shares to its owner", n.Name())
		}
		if _, routed := n.Route("other\x1f", small); !routed {
			t.Errorf("%s shares a small limit under Auto", n.Name())
		}
	}
	// Decided where it is asked, as Route says: the owner of "exact" decides it as its
	// owner (its pool's bucket alone, the whole burst), the others forward.
	o, _ := nodes[0].Route("exact\x1f", large)
	owner := nodes[0]
	if o != "" {
		owner = byName(nodes, o)
	}
	granted := 0
	for range 400 {
		res, _, err := owner.Decide("exact\x1f", large, 2, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			granted++
		}
	}
	if granted != 400 {
		t.Errorf("the owner of a key whose policy is Owner granted %d of its 400-permit burst, want all (the pool's bucket, not a share)", granted)
	}
}

// TestOwnerOfAgreesWithRoute: OwnerOf, given the pool's names, names the node every node
// routes a key to (itself for its owner), over pools of 1 to 9 nodes and many keys; a node
// that leaves takes only its own keys with it.
func TestOwnerOfAgreesWithRoute(t *testing.T) {
	lim := []gcra.Limit{{T: sec, Tau: 5 * sec}}
	if got := OwnerOf("k", nil); got != "" {
		t.Errorf("OwnerOf of no nodes: %q, want \"\"", got)
	}
	for size := 1; size <= 9; size++ {
		nodes := ownerPool(t, size)
		var names []string
		for _, n := range nodes {
			names = append(names, n.Name())
		}
		for k := range 200 {
			key := fmt.Sprint("key-", k)
			want := OwnerOf(key, names)
			for _, n := range nodes {
				o, routed := n.Route(key, lim)
				if o == "" {
					o = n.Name()
				}
				if !routed || o != want {
					t.Fatalf("step %d/%s: %s routes to %q (routed %v), OwnerOf says %q", size, key, n.Name(), o, routed, want)
				}
			}
			if size > 1 {
				rest := slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == names[0] })
				if after := OwnerOf(key, rest); want != names[0] && after != want {
					t.Fatalf("step %d/%s: %s left and the key moved from %s to %s", size, key, names[0], want, after)
				}
			}
		}
	}
}
