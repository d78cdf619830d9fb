package robustness

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/gossip"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/referee"
)

// Violation is one breach of a guarantee beyond its documented bound, with the shortest
// window of the history that shows it.
type Violation struct {
	Check  string // strict, referee, lease, liveness, process
	Detail string
	Window []string // the records of the shortest window that shows it
}

func (v Violation) String() string {
	s := v.Check + ": " + v.Detail
	for _, w := range v.Window {
		s += "\n    " + w
	}
	return s
}

// LivenessSlack is how far past its context's time-out a call may return: a loose bound
// for a loaded machine (the race detector's pauses on two cores), never a speed claim.
const LivenessSlack = time.Second

// PorcupineTimeout bounds the linearizability search of one key's history; past it the
// key is judged in the order of its slots on Redis' clock instead (a total order the
// store's script produced), and the run's line says so.
var PorcupineTimeout = 20 * time.Second

// OnRedisClock reports whether a strict-mode slot is on Redis' clock (Unix nanoseconds)
// rather than a member's local fallback clock (monotonic nanoseconds since the process
// started, far below: anything under 2001 in Unix time).
func OnRedisClock(slot int64) bool { return slot >= 1e18 }

// gcraInput is one operation of the strict model: a grant used (n permits at slot, on
// Redis' clock) or a loss of Redis' state.
type gcraInput struct {
	loss bool
	n    int64
	slot int64
	desc string
}

// tatState is the model's state: each limit's TAT of the judge (a value, so that
// porcupine can compare and cache states).
type tatState [gcra.MaxLimits]int64

// gcraModel is GCRA on the store's clock for one key under core (the limits as the
// members' limiters tightened them by Margin): a used grant must be one the strict GCRA
// admits at its slot without delay; a loss of Redis' state may forget everything granted
// before it (the judge starts over from an empty key, which admits at least what any
// older state would: one burst per key per loss, the documented failover bound).
func gcraModel(core []gcra.Limit) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return tatState{} },
		Step: func(state, input, _ any) (bool, any) {
			in := input.(gcraInput)
			if in.loss {
				return true, tatState{}
			}
			s := state.(tatState)
			res, _, err := gcra.Decide(s[:len(core)], core, in.slot, in.n, 0)
			return err == nil && res.Allowed, s
		},
		DescribeOperation: func(input, _ any) string { return input.(gcraInput).desc },
	}
}

// strictOps are the key's operations for the model: each use, from the call that got its
// permits to their use, and each loss of state.
func strictOps(h *History, key string, t0 int64) []porcupine.Operation {
	var ops []porcupine.Operation
	for _, u := range h.Uses {
		if u.Key != key || !OnRedisClock(u.Slot) {
			continue
		}
		ops = append(ops, porcupine.Operation{ClientId: u.Proc, Call: u.Call, Return: u.At,
			Input: gcraInput{n: u.N, slot: u.Slot, desc: fmt.Sprintf("member %d: %d permits at slot %d, called +%v, used +%v",
				u.Proc, u.N, u.Slot, time.Duration(u.Call-t0), time.Duration(u.At-t0))}})
	}
	for _, l := range h.Losses {
		ops = append(ops, porcupine.Operation{ClientId: -1, Call: l[0], Return: l[1],
			Input: gcraInput{loss: true, desc: fmt.Sprintf("Redis lost its state between +%v and +%v", time.Duration(l[0]-t0), time.Duration(l[1]-t0))}})
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops
}

// CheckStrict judges the strict mode's history key by key with porcupine (see gcraModel):
// the grants Redis decided (those of a local fallback are CheckFallback's). It returns the violations and notes (keys judged by slot order after a time-out).
func CheckStrict(h *History, t0 int64) (vs []Violation, notes []string) {
	for _, g := range Groups {
		core := limitconv.Core(sluice.MustParse(g.Limits), Margin)
		model := gcraModel(core)
		for _, key := range g.Keys {
			ops := strictOps(h, key, t0)
			switch porcupine.CheckOperationsTimeout(model, ops, PorcupineTimeout) {
			case porcupine.Ok:
			case porcupine.Illegal:
				vs = append(vs, Violation{Check: "strict", Detail: fmt.Sprintf("key %s: the grants used are not linearizable to GCRA %s on Redis' clock (%d operations)", key, g.Limits, len(ops)),
					Window: describe(shortestWindow(model, ops), model)})
			default:
				notes = append(notes, fmt.Sprintf("key %s: porcupine timed out after %v, judged in slot order", key, PorcupineTimeout))
				if v, bad := slotOrder(ops, core); bad {
					vs = append(vs, Violation{Check: "strict", Detail: fmt.Sprintf("key %s: the grants used, in slot order, break GCRA %s", key, g.Limits), Window: describe(v, model)})
				}
			}
		}
	}
	return vs, notes
}

// shortestWindow narrows an illegal history to a short window that is still illegal: the
// shortest prefix (by return), then the latest start (by call) of it. A window that starts
// mid-history starts the judge from an empty key, which admits more than any real state:
// an illegal window is a real witness.
func shortestWindow(model porcupine.Model, ops []porcupine.Operation) []porcupine.Operation {
	byRet := slices.Clone(ops)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].Return < byRet[j].Return })
	illegal := func(w []porcupine.Operation) bool {
		return porcupine.CheckOperationsTimeout(model, w, PorcupineTimeout/4) == porcupine.Illegal
	}
	// The shortest prefix whose operations all returned: illegal(prefix) is monotone.
	end := sort.Search(len(byRet), func(k int) bool { return illegal(byRet[:k+1]) })
	if end == len(byRet) {
		return ops
	}
	prefix := byRet[:end+1]
	sort.Slice(prefix, func(i, j int) bool { return prefix[i].Call < prefix[j].Call })
	start := sort.Search(len(prefix), func(k int) bool { return !illegal(prefix[k:]) })
	return prefix[max(start-1, 0):]
}

// slotOrder judges the grants in the order of their slots (losses at their start), as the
// fallback of a porcupine time-out; it returns the grants up to the first that breaks the
// limits (its burst's worth before it) and whether there is one.
func slotOrder(ops []porcupine.Operation, core []gcra.Limit) ([]porcupine.Operation, bool) {
	at := func(o porcupine.Operation) int64 {
		in := o.Input.(gcraInput)
		if in.loss {
			return o.Call
		}
		return in.slot
	}
	sorted := slices.Clone(ops)
	sort.SliceStable(sorted, func(i, j int) bool { return at(sorted[i]) < at(sorted[j]) })
	var s tatState
	for i, o := range sorted {
		in := o.Input.(gcraInput)
		if in.loss {
			s = tatState{}
			continue
		}
		res, _, err := gcra.Decide(s[:len(core)], core, in.slot, in.n, 0)
		if err != nil || !res.Allowed {
			return sorted[max(0, i-int(gcra.MaxCost(core))-1) : i+1], true
		}
	}
	return nil, false
}

func describe(ops []porcupine.Operation, model porcupine.Model) []string {
	out := make([]string, 0, len(ops))
	for _, o := range ops {
		out = append(out, model.DescribeOperation(o.Input, o.Output))
	}
	return out
}

// CheckReferee applies the referee's rule to the times the permits were used, key by key,
// with the real limits (not tightened) and the limiter's margin as the jitter tolerance
// (a permit is used at or after its slot and at most Margin after it, or given up). Each
// loss of Redis' state starts the referee anew (the documented bound: the state lost may
// grant its burst again), and a use whose call and use straddle a loss is left out.
//
// keep chooses the uses judged (nil: all).
func CheckReferee(h *History, t0 int64, keep func(Use) bool) []Violation {
	var vs []Violation
	for _, g := range Groups {
		limits := sluice.MustParse(g.Limits)
		for _, key := range g.Keys {
			var uses []Use
			for _, u := range h.Uses {
				if u.Key == key && !straddles(h.Losses, u.Call, u.At) && (keep == nil || keep(u)) {
					uses = append(uses, u)
				}
			}
			sort.SliceStable(uses, func(i, j int) bool { return uses[i].At < uses[j].At })
			epoch := func(at int64) int {
				e := 0
				for _, l := range h.Losses {
					if at >= l[1] {
						e++
					}
				}
				return e
			}
			var ref *referee.Referee
			cur := -1
			for i, u := range uses {
				if e := epoch(u.At); e != cur {
					cur = e
					ref, _ = referee.New(limits)
				}
				// The permits were used up to Margin after their slot: the referee sees
				// them at the slot's latest, which is the earliest a strict API could judge
				// them by without the tolerance the limiter kept.
				d, err := ref.Judge(key, u.N, u.At)
				if err != nil || !d.Allowed {
					var w []string
					for _, p := range uses[max(0, i-12) : i+1] {
						w = append(w, fmt.Sprintf("member %d: %d permits used at +%v (slot %d, called +%v)", p.Proc, p.N, time.Duration(p.At-t0), p.Slot, time.Duration(p.Call-t0)))
					}
					vs = append(vs, Violation{Check: "referee", Detail: fmt.Sprintf("key %s: the referee refused %d permits used at +%v under %s", key, u.N, time.Duration(u.At-t0), g.Limits), Window: w})
					break
				}
			}
		}
	}
	return vs
}

func straddles(losses [][2]int64, from, to int64) bool {
	for _, l := range losses {
		if from < l[1] && to > l[0] {
			return true
		}
	}
	return false
}

// RewindWindow is how long after old state is restored (a failover that lost writes) the
// lease mode may over-admit, by docs/lease.md's failover bound: one renewal interval (the
// members' 100 ms) plus one lease, used to its grace.
var RewindWindow = 100*time.Millisecond + lease.DefaultConfig().TTL + lease.DefaultConfig().Grace

// CheckLeases checks the lease mode's invariant from the members' own records: at every
// moment, the rates of the shares the members may use of each limit sum to at most the
// limit's rate; from a rewind of the store (old state restored) until RewindWindow after
// it, at most twice the limit's rate (the documented failover bound: the excess is at most
// the capacity the lost writes granted, at most the whole limit). A member's record holds from when its renewal saw the store's answer until
// its lease (and grace) ends or its next record takes over: at that record's answer when
// the share grew, at its request when it shrank (the member acknowledged the smaller share
// in that request, and stopped using the bigger one as it sent it).
func CheckLeases(h *History, t0 int64) []Violation {
	type span struct {
		from, until int64
		rate        float64
		proc        int
	}
	type lim struct {
		key string
		t   int64
	}
	byLim := map[lim]map[int][]Lease{}
	for _, l := range h.Leases {
		k := lim{l.Key, l.T}
		if byLim[k] == nil {
			byLim[k] = map[int][]Lease{}
		}
		byLim[k][l.Proc] = append(byLim[k][l.Proc], l)
	}
	var vs []Violation
	keys := slices.SortedFunc(func(yield func(lim) bool) {
		for k := range byLim {
			if !yield(k) {
				return
			}
		}
	}, func(a, b lim) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	for _, k := range keys {
		var spans []span
		for proc, ls := range byLim[k] {
			sort.Slice(ls, func(i, j int) bool { return ls[i].From < ls[j].From })
			for i, l := range ls {
				until := l.Until
				if i+1 < len(ls) {
					next := ls[i+1]
					if next.Rate < l.Rate {
						until = min(until, max(next.Asked, l.From))
					} else {
						until = min(until, next.From)
					}
				}
				if until > l.From && l.Rate > 0 {
					spans = append(spans, span{l.From, until, l.Rate, proc})
				}
			}
		}
		type edge struct {
			at   int64
			rate float64
			s    int
		}
		var edges []edge
		for i, s := range spans {
			edges = append(edges, edge{s.from, s.rate, i}, edge{s.until, -s.rate, i})
		}
		// Ends before starts at the same instant.
		sort.Slice(edges, func(i, j int) bool {
			if edges[i].at != edges[j].at {
				return edges[i].at < edges[j].at
			}
			return edges[i].rate < edges[j].rate
		})
		limit := 1e9 / float64(k.t)
		allowed := func(at int64) float64 {
			for _, w := range h.Rewinds {
				if at >= w[0] && at <= w[1]+int64(RewindWindow) {
					return 2 * limit
				}
			}
			return limit
		}
		sum := 0.0
		for _, e := range edges {
			sum += e.rate
			if e.rate > 0 && sum > allowed(e.at)*(1+1e-6) {
				var w []string
				for _, s := range spans {
					if s.from <= e.at && s.until > e.at {
						w = append(w, fmt.Sprintf("member %d: %.2f/s from +%v until +%v", s.proc, s.rate, time.Duration(s.from-t0), time.Duration(s.until-t0)))
					}
				}
				vs = append(vs, Violation{Check: "lease", Detail: fmt.Sprintf("key %s: shares in use sum to %.2f/s at +%v, past the limit's %.2f/s", k.key, sum, time.Duration(e.at-t0), limit), Window: w})
				break
			}
		}
	}
	return vs
}

// CheckLiveness wants every call to have returned within its time-out (plus
// LivenessSlack, plus the time its process stalled while the call ran: the machine did
// not run it), unless its member was stopped (SIGSTOP) while it ran.
func CheckLiveness(h *History, t0 int64) []Violation {
	stalls := map[int][][2]int64{}
	for _, st := range h.Stalls {
		stalls[st.Proc] = append(stalls[st.Proc], [2]int64{st.From, st.To})
	}
	var vs []Violation
	for _, o := range h.Ops {
		var stalled int64
		for _, w := range stalls[o.Proc] {
			stalled += max(0, min(w[1], o.Return)-max(w[0], o.Call))
		}
		if time.Duration(o.Return-o.Call-stalled) <= o.Timeout+LivenessSlack || straddles(h.Stopped[o.Proc], o.Call, o.Return) {
			continue
		}
		vs = append(vs, Violation{Check: "liveness", Detail: fmt.Sprintf("member %d: %s %s n=%d called at +%v returned after %v (its process stalled %v of it), past its time-out %v",
			o.Proc, o.Kind, o.Key, o.N, time.Duration(o.Call-t0), time.Duration(o.Return-o.Call), time.Duration(stalled), o.Timeout)})
	}
	return vs
}

// CheckFallback judges the grants the strict mode's local fail mode made while Redis was
// out of reach (their slots are on the member's own clock): each member's, key by key in
// the order of their slots, must conform exactly to its share of the limits (tightened by
// the margin, as the member's limiter asked). That is the documented bound of the local
// fail mode: on top of what Redis grants, each member cut off admits at most its share.
func CheckFallback(h *History, t0 int64, share float64) []Violation {
	type pk struct {
		proc int
		key  string
	}
	by := map[pk][]Use{}
	for _, u := range h.Uses {
		if !OnRedisClock(u.Slot) {
			by[pk{u.Proc, u.Key}] = append(by[pk{u.Proc, u.Key}], u)
		}
	}
	var vs []Violation
	for _, g := range Groups {
		core := gcra.ShareOf(limitconv.Core(sluice.MustParse(g.Limits), Margin), share)
		for _, key := range g.Keys {
			for proc := range 64 {
				uses := by[pk{proc, key}]
				sort.SliceStable(uses, func(i, j int) bool { return uses[i].Slot < uses[j].Slot })
				var s tatState
				for i, u := range uses {
					res, _, err := gcra.Decide(s[:len(core)], core, u.Slot, u.N, 0)
					if err == nil && res.Allowed {
						continue
					}
					var w []string
					for _, p := range uses[max(0, i-int(gcra.MaxCost(core))-1) : i+1] {
						w = append(w, fmt.Sprintf("member %d: %d permits at local slot %v, used at +%v", p.Proc, p.N, time.Duration(p.Slot), time.Duration(p.At-t0)))
					}
					vs = append(vs, Violation{Check: "fallback", Detail: fmt.Sprintf("member %d key %s: the local fail mode's grants break %.3g of %s", proc, key, share, g.Limits), Window: w})
					break
				}
			}
		}
	}
	return vs
}

// CheckGossip judges the gossip mode's documented bounds (docs/gossip.md): over every
// window, the permits the pool used of each limit of each key of groups (the run's
// workload) exceed the limit's Burst + Rate × window by at most the bound of the way the
// key is decided.
//
// A key decided at its owner (the pool's policy, auto, sends it there: DecidedAtOwner) is
// decided exactly by one member while the membership agrees, and a member that starts
// owning it is fenced (it takes the pool's bucket as empty, and no sooner than the
// bookings the last owner reported: no burst is granted twice). The check allows one
// interval's rate for those bookings, reported up to an interval late (and during a
// join's spread, within an interval, a second owner may take the key, fenced). A window
// that meets a split (a member cut from a peer or from all of them) may exceed by the
// partition term for two sides, r × max(0, P − hold − 5·I), with no burst: once each
// side has let the other go, each side's owner decides at the full rate.
//
// A key decided by shares may exceed by hits.Bound (one permit per member process that
// took part), plus one interval's rate for a report that comes late (as the gossip
// package's own multi-process test allows), and in a window that meets a split by
// docs/gossip.md's partition bound for two sides, b + r × max(0, P − hold − 5·I).
//
// Both: plus two intervals' rate when a member was paused or datagrams were lost or
// delayed, and the longest delay's worth of rate (the documented caveat: a report later
// than an interval lets shares overlap, or a fence count bookings, an interval or two
// late, and a delayed report is late by its delay). P is the split's length and the
// rejoin after it (two gossip.RejoinEvery), and a window meets a split until its
// aftermath ends. Use times are real; a use lies at most Margin after its slot, and the
// limiters keep Margin's worth of burst in reserve. It returns the violations, the largest
// excess seen over any window (permits), and a note that says it.
func CheckGossip(h *History, t0 int64, nodes int, paused bool, groups []Group) ([]Violation, float64, string) {
	gc := gossip.DefaultConfig()
	interval := gc.Interval
	lostAfter := 5 * interval // gossip's hits.Config.LostAfter
	// A split lasts, for the bound, until its cut member counts its peers again: up to two
	// rejoin rounds after the heal (gossip.RejoinEvery; docs/gossip.md). Its over-admission
	// shows in the windows that meet it, or its aftermath until the peers' reports arrive
	// again (an interval, late by the longest delay).
	rejoin := int64(2 * gossip.RejoinEvery)
	react := int64(2*interval + h.LateBy)
	var vs []Violation
	worst, worstAt := -1e18, ""
	owned := 0
	for _, g := range groups {
		limits := sluice.MustParse(g.Limits)
		atOwner := DecidedAtOwner(limitconv.Core(limits, Margin), nodes)
		for _, key := range g.Keys {
			if atOwner {
				owned++
			}
			var uses []Use
			for _, u := range h.Uses {
				if u.Key == key {
					uses = append(uses, u)
				}
			}
			sort.SliceStable(uses, func(i, j int) bool { return uses[i].At < uses[j].At })
			for _, l := range limits {
				rate := float64(l.Rate) / l.Period.Seconds()
				allowed := rate * interval.Seconds()
				splitBurst := float64(l.Burst) // each side's burst, by shares
				if atOwner {
					splitBurst = 0 // each side's owner fenced: no burst twice
				} else {
					allowed += hits.Bound(hits.BoundParams{Nodes: nodes, Burst: l.Burst, Rate: rate})
				}
				if paused || h.Lossy || h.LateBy > 0 {
					allowed += rate * (2*interval + h.LateBy).Seconds()
				}
				var extra func(from, to int64) float64
				if len(h.Splits) > 0 {
					extra = func(from, to int64) float64 {
						e := 0.0
						for _, s := range h.Splits {
							if s[0] <= to && s[1]+rejoin+react >= from {
								p := time.Duration(s[1] + rejoin - s[0])
								e += splitBurst + rate*max(0, (p-gc.Hold-lostAfter).Seconds())
							}
						}
						return e
					}
				}
				e, from, to, over := excessWithin(uses, l.Burst, rate, extra)
				if e > worst {
					worst, worstAt = e, fmt.Sprintf("key %s %s", key, l)
				}
				if over > allowed+1e-6 {
					var w []string
					for _, u := range uses[from : to+1] {
						w = append(w, fmt.Sprintf("member %d: %d permits used at +%v", u.Proc, u.N, time.Duration(u.At-t0)))
					}
					if len(w) > 30 {
						w = append(w[:15], append([]string{"..."}, w[len(w)-15:]...)...)
					}
					how := "by shares"
					if atOwner {
						how = "at its owner"
					}
					vs = append(vs, Violation{Check: "gossip", Detail: fmt.Sprintf("key %s (decided %s): %.1f permits beyond %s's burst + rate × window from +%v to +%v, past the documented %.1f (%.1f of it for the splits the window meets)",
						key, how, over+extra0(extra, uses, from, to), l, time.Duration(uses[from].At-t0), time.Duration(uses[to].At-t0), allowed+extra0(extra, uses, from, to), extra0(extra, uses, from, to)), Window: w})
				}
			}
		}
	}
	return vs, worst, fmt.Sprintf("gossip: largest excess over any window %.1f permits (%s), %d member processes, %d splits, %d of %d keys decided at their owner",
		worst, worstAt, nodes, len(h.Splits), owned, countKeys(groups))
}

// countKeys is the number of keys of groups.
func countKeys(groups []Group) int {
	n := 0
	for _, g := range groups {
		n += len(g.Keys)
	}
	return n
}

// DecidedAtOwner reports whether a pool of nodes members under the gossip mode's default
// policy (auto, the suite's) decides a key under core (the limits as the limiters tightened
// them) at the key's owner rather than by shares: what hits.Node.Route says, asked of a
// node of such a pool.
func DecidedAtOwner(core []gcra.Limit, nodes int) bool {
	cfg := hits.DefaultConfig()
	cfg.Policy = gossip.DefaultConfig().Policy
	n, err := hits.New("n0", 1, cfg, 0)
	if err != nil {
		panic(err)
	}
	for i := 1; i < max(nodes, 1); i++ {
		n.Join(fmt.Sprint("n", i), 0)
	}
	_, routed := n.Route("k", core)
	return routed
}

// extra0 is extra over the uses from..to, 0 when extra is nil.
func extra0(extra func(from, to int64) float64, uses []Use, from, to int) float64 {
	if extra == nil {
		return 0
	}
	return extra(uses[from].At, uses[to].At)
}

// excessWithin is excessOf when extra is nil; otherwise it weighs each window [t_i, t_j]
// against its own allowance: it returns the largest excess of any window, and the window
// (first and last use) whose excess less extra(t_i, t_j) is largest, and that difference.
func excessWithin(uses []Use, burst int64, rate float64, extra func(from, to int64) float64) (e float64, from, to int, over float64) {
	if extra == nil {
		e, from, to = excessOf(uses, burst, rate)
		return e, from, to, e
	}
	e, over = math.Inf(-1), math.Inf(-1)
	for j := range uses {
		var n float64
		tj := float64(uses[j].At) / 1e9
		for i := j; i >= 0; i-- {
			n += float64(uses[i].N)
			x := n - rate*(tj-float64(uses[i].At)/1e9) - float64(burst)
			e = max(e, x)
			if o := x - extra(uses[i].At, uses[j].At); o > over {
				over, from, to = o, i, j
			}
		}
	}
	return e, from, to, over
}

// excessOf is the most permits used in any window [t_i, t_j] beyond burst + rate × (t_j −
// t_i), and that window's first and last use (uses in time order).
func excessOf(uses []Use, burst int64, rate float64) (float64, int, int) {
	best, from, to := math.Inf(-1), 0, 0
	bestStart, bestStartI := math.Inf(-1), 0 // max over i <= j of rate×t_i − permits before i
	var before float64                       // permits used before j
	for j, u := range uses {
		t := float64(u.At) / 1e9
		if v := rate*t - before; v > bestStart {
			bestStart, bestStartI = v, j
		}
		before += float64(u.N)
		if e := before - rate*t + bestStart - float64(burst); e > best {
			best, from, to = e, bestStartI, j
		}
	}
	return best, from, to
}
