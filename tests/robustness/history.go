package robustness

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Op is one call a member made through the public API, as the member recorded it: when it
// was called and when it returned (real Unix nanoseconds, never the member's possibly
// offset clock), and what came of it.
type Op struct {
	Proc         int
	Kind         string // now (ReserveWithin 0), wait (WaitN), reserve (Reserve, then Wait or Cancel), hold (Reserve then Cancel), penalize
	Key          string
	N            int64
	Call, Return int64
	Timeout      time.Duration // the call's context time-out
	Outcome      string        // granted, denied, expired (granted, given up: too late to use), cancelled, error:..., ok
}

// Use is a grant a member used: the permits it spent (after settling), the slot the
// backend gave them (the backend's own time base: Redis' clock in the strict mode), the
// call that got them, and the real time they were used.
type Use struct {
	Proc     int
	Key      string
	N        int64
	Slot     int64
	Call, At int64
}

// Lease is what a lease-mode member held of one limit of one key from From until Until
// (real Unix nanoseconds): its share's rate, as its renewal saw it after a store answer.
type Lease struct {
	Proc        int
	Key         string
	T           int64 // the limit's emission interval, which names the limit
	Rate        float64
	From, Until int64
	// Asked is when the request this record answers was sent: a member that acknowledges
	// a smaller share stops using its bigger one then.
	Asked int64
}

// Pool is the pool size a gossip member counted (itself and every peer alive or still
// held) at a real time.
type Pool struct {
	Proc    int
	At      int64
	Members int
}

// Stall is a span in which a member process was not run (a ticker of its own came that
// much late): a machine too loaded to schedule it, not a call that hung.
type Stall struct {
	Proc     int
	From, To int64
}

// The record lines a member prints, one per event, written at once so that a member
// killed with SIGKILL has reported everything it used:
//
//	O proc kind key n call return timeout outcome
//	U proc key n slot call at
//	L proc key T rate from until asked
//	P proc at members
//	S proc from to
func (o Op) line() string {
	return fmt.Sprintf("O %d %s %s %d %d %d %d %s\n", o.Proc, o.Kind, o.Key, o.N, o.Call, o.Return, int64(o.Timeout), strings.ReplaceAll(o.Outcome, " ", "_"))
}

func (u Use) line() string {
	return fmt.Sprintf("U %d %s %d %d %d %d\n", u.Proc, u.Key, u.N, u.Slot, u.Call, u.At)
}

func (l Lease) line() string {
	return fmt.Sprintf("L %d %s %d %g %d %d %d\n", l.Proc, l.Key, l.T, l.Rate, l.From, l.Until, l.Asked)
}

func (p Pool) line() string { return fmt.Sprintf("P %d %d %d\n", p.Proc, p.At, p.Members) }

func (st Stall) line() string { return fmt.Sprintf("S %d %d %d\n", st.Proc, st.From, st.To) }

// History is everything the members of a run recorded, and the faults the runner injected.
type History struct {
	Ops    []Op
	Uses   []Use
	Leases []Lease
	Pools  []Pool
	Stalls []Stall
	// Losses are the windows in which Redis lost state (restarted empty, old state
	// restored): [start, end] in real Unix nanoseconds.
	Losses [][2]int64
	// Rewinds are the losses that brought old state back (restore_old), not an empty
	// store: the lease mode documents a bound for them (docs/lease.md, failover bound).
	Rewinds [][2]int64
	// Stopped are each member process's SIGSTOP windows, by process number.
	Stopped map[int][][2]int64
	// The gossip mode's network faults: Splits are the windows in which a member was cut
	// from a peer or from all of them (a partition into two sides); LateBy is the longest
	// delay put on the members' datagrams; Lossy tells that some were lost.
	Splits [][2]int64
	LateBy time.Duration
	Lossy  bool
}

// parseLine adds one record line to h; a line that is no record is an error.
func (h *History) parseLine(line string) error {
	f := strings.Fields(line)
	bad := fmt.Errorf("robust: bad record %q", line)
	if len(f) == 0 {
		return bad
	}
	ints := func(fs []string) ([]int64, bool) {
		out := make([]int64, len(fs))
		for i, s := range fs {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return nil, false
			}
			out[i] = v
		}
		return out, true
	}
	switch f[0] {
	case "O":
		if len(f) != 9 {
			return bad
		}
		v, ok := ints([]string{f[1], f[4], f[5], f[6], f[7]})
		if !ok {
			return bad
		}
		h.Ops = append(h.Ops, Op{Proc: int(v[0]), Kind: f[2], Key: f[3], N: v[1], Call: v[2], Return: v[3], Timeout: time.Duration(v[4]), Outcome: f[8]})
	case "U":
		if len(f) != 7 {
			return bad
		}
		v, ok := ints([]string{f[1], f[3], f[4], f[5], f[6]})
		if !ok {
			return bad
		}
		h.Uses = append(h.Uses, Use{Proc: int(v[0]), Key: f[2], N: v[1], Slot: v[2], Call: v[3], At: v[4]})
	case "L":
		if len(f) != 8 {
			return bad
		}
		v, ok := ints([]string{f[1], f[3], f[5], f[6], f[7]})
		rate, err := strconv.ParseFloat(f[4], 64)
		if !ok || err != nil {
			return bad
		}
		h.Leases = append(h.Leases, Lease{Proc: int(v[0]), Key: f[2], T: v[1], Rate: rate, From: v[2], Until: v[3], Asked: v[4]})
	case "P":
		if len(f) != 4 {
			return bad
		}
		v, ok := ints(f[1:])
		if !ok {
			return bad
		}
		h.Pools = append(h.Pools, Pool{Proc: int(v[0]), At: v[1], Members: int(v[2])})
	case "S":
		if len(f) != 4 {
			return bad
		}
		v, ok := ints(f[1:])
		if !ok {
			return bad
		}
		h.Stalls = append(h.Stalls, Stall{Proc: int(v[0]), From: v[1], To: v[2]})
	default:
		return bad
	}
	return nil
}
