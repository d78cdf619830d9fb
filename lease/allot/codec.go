package allot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/store"
)

// The record a store keeps is a State in a compact binary form: a format byte, then
// unsigned and zig-zag varints. Times are the store's Unix nanoseconds, written as
// differences from the record's PoolAt (small numbers, a few bytes each), with 0 kept for
// "none"; a member's epoch is written as its number when its incarnation is the record's
// (every live one's), in full otherwise. A record of 20 members takes about 25 bytes a
// member.
//
// Format 2 adds a windowed quota's and a ramp's fields (the limit's window and ramp, the
// window's end and the tokens handed out in it, the ramp's start, each member's chunk and
// newest request) after format 1's. A record of a limit with neither is still written in
// format 1, byte for byte as before, so that members of an earlier version and of this one
// share plain limits during a rolling upgrade; UnmarshalState reads both.
//
// Format 3 adds each member's critical demand (Entry.Critical) after format 2's fields
// (which it always has, a window and a ramp possibly zero). A record is written in it only
// while some member reports critical demand, so that members of an earlier version share
// limits without classes during a rolling upgrade; one of them that meets a format 3
// record fails to read it (a store error, answered by its fail mode) until the critical
// callers go or it is upgraded.
//
// Any format may mark a limit decided on its bucket (State.BucketAt): its central flag is
// then 2, followed by BucketAt, BucketInc and BucketBusy. Members of an earlier version fail to read such a record
// (a store error, answered by their fail mode: never a permit the bucket does not count).

const (
	stateFormat        = 2
	stateFormatV1      = 1
	stateFormatClasses = 3
)

// MarshalState encodes s: the record a store keeps.
func MarshalState(s *State) []byte {
	w := writer{b: make([]byte, 0, 64+32*len(s.Members)), base: s.PoolAt}
	v3 := slices.ContainsFunc(s.Members, func(e Entry) bool { return e.Critical != 0 })
	v2 := v3 || s.Limit.Window != 0 || !s.Limit.Ramp.IsZero()
	switch {
	case v3:
		w.b = append(w.b, stateFormatClasses)
	case v2:
		w.b = append(w.b, stateFormat)
	default:
		w.b = append(w.b, stateFormatV1)
	}
	w.u(uint64(s.Limit.T))
	w.u(uint64(s.Limit.Tau))
	w.u(uint64(s.Cfg.TTL))
	w.u(uint64(s.Cfg.Grace))
	w.u(uint64(s.Cfg.Policy))
	w.u(uint64(s.Cfg.JoinWindow))
	w.u(s.Incarnation)
	w.u(s.Seq)
	w.i(s.PoolAt)
	w.t(s.Fence)
	w.i(s.Pool)
	w.t(s.Penalty)
	w.t(s.Open)
	central := uint64(0)
	switch {
	case s.BucketAt != 0:
		central = 2
	case s.Central:
		central = 1
	}
	w.u(central)
	if s.BucketAt != 0 {
		w.t(s.BucketAt)
		w.u(s.BucketInc)
		w.t(s.BucketBusy)
	}
	w.t(s.Booked)
	w.u(uint64(len(s.Queue)))
	for _, q := range s.Queue {
		w.u(uint64(len(q.ID)))
		w.b = append(w.b, q.ID...)
		w.t(q.At)
		w.t(q.Until)
	}
	if v2 {
		w.u(uint64(s.Limit.Window))
		w.u(uint64(s.Limit.Ramp.T0))
		w.u(uint64(s.Limit.Ramp.Over))
		w.t(s.RampStart)
		w.t(s.WindowEnd)
		w.u(uint64(s.Granted))
	}
	w.u(uint64(len(s.Members)))
	for _, e := range s.Members {
		w.u(uint64(len(e.ID)))
		w.b = append(w.b, e.ID...)
		switch e.Epoch.Incarnation {
		case s.Incarnation:
			w.u(e.Epoch.N << 1)
		default:
			w.u(e.Epoch.N<<1 | 1)
			w.u(e.Epoch.Incarnation)
		}
		w.i(e.Demand)
		w.i(e.Size)
		w.t(e.Since)
		w.t(e.Wanted)
		w.u(e.Lease.Seq)
		w.share(e.Lease.Share)
		w.t(e.Lease.Expires)
		w.t(e.Lease.Until)
		w.share(e.Held)
		w.t(e.HeldUntil)
		w.share(e.Retired)
		w.t(e.RetiredUntil)
		w.t(e.AliveUntil)
		if v2 {
			w.u(uint64(e.Chunk))
			w.u(e.Nonce)
		}
		if v3 {
			w.i(e.Critical)
		}
	}
	return w.b
}

// UnmarshalState decodes a record written by MarshalState, checking what it can.
func UnmarshalState(b []byte) (*State, error) {
	r := reader{b: b}
	if len(b) == 0 || (b[0] != stateFormat && b[0] != stateFormatV1 && b[0] != stateFormatClasses) {
		return nil, fmt.Errorf("%w: format %v", store.ErrBadRecord, b[:min(len(b), 1)])
	}
	v3 := b[0] == stateFormatClasses
	v2 := v3 || b[0] == stateFormat
	r.b = b[1:]
	s := &State{}
	s.Limit.T = int64(r.u())
	s.Limit.Tau = int64(r.u())
	s.Cfg.TTL = time.Duration(r.u())
	s.Cfg.Grace = time.Duration(r.u())
	s.Cfg.Policy = Policy(r.u())
	s.Cfg.JoinWindow = time.Duration(r.u())
	s.Incarnation = r.u()
	s.Seq = r.u()
	s.PoolAt = r.i()
	r.base = s.PoolAt
	s.Fence = r.t()
	s.Pool = r.i()
	s.Penalty = r.t()
	s.Open = r.t()
	switch r.u() {
	case 0:
	case 1:
		s.Central = true
	case 2:
		s.Central = true
		s.BucketAt = r.t()
		s.BucketInc = r.u()
		s.BucketBusy = r.t()
	default:
		r.err = errors.New("bad central flag")
	}
	s.Booked = r.t()
	nq := r.u()
	if nq > uint64(len(r.b)) {
		return nil, fmt.Errorf("%w: %d waiters in %d bytes", store.ErrBadRecord, nq, len(r.b))
	}
	for range nq {
		l := r.u()
		if l > uint64(len(r.b)) {
			return nil, fmt.Errorf("%w: a waiter name of %d bytes", store.ErrBadRecord, l)
		}
		q := Waiter{ID: string(r.b[:l])}
		r.b = r.b[l:]
		q.At = r.t()
		q.Until = r.t()
		s.Queue = append(s.Queue, q)
	}
	if v2 {
		s.Limit.Window = int64(r.n())
		s.Limit.Ramp.T0 = int64(r.n())
		s.Limit.Ramp.Over = int64(r.n())
		if !v3 && s.Limit.Window == 0 && s.Limit.Ramp.IsZero() && r.err == nil {
			r.err = errors.New("format 2 without a window or a ramp") // written in format 1
		}
		s.RampStart = r.t()
		s.WindowEnd = r.t()
		s.Granted = int64(r.n())
	}
	n := r.u()
	if n > uint64(len(r.b)) { // every member takes bytes
		return nil, fmt.Errorf("%w: %d members in %d bytes", store.ErrBadRecord, n, len(r.b))
	}
	s.Members = make([]Entry, 0, n)
	for range n {
		var e Entry
		l := r.u()
		if l > uint64(len(r.b)) {
			return nil, fmt.Errorf("%w: a member name of %d bytes", store.ErrBadRecord, l)
		}
		e.ID = string(r.b[:l])
		r.b = r.b[l:]
		en := r.u()
		e.Epoch = Epoch{Incarnation: s.Incarnation, N: en >> 1}
		if en&1 == 1 {
			e.Epoch.Incarnation = r.u()
		}
		e.Demand = r.i()
		e.Size = r.i()
		e.Since = r.t()
		e.Wanted = r.t()
		e.Lease.Seq = r.u()
		e.Lease.Share = r.share()
		e.Lease.Expires = r.t()
		e.Lease.Until = r.t()
		e.Held = r.share()
		e.HeldUntil = r.t()
		e.Retired = r.share()
		e.RetiredUntil = r.t()
		e.AliveUntil = r.t()
		if v2 {
			e.Chunk = int64(r.n())
			e.Nonce = r.u()
		}
		if v3 {
			e.Critical = r.i()
			if (e.Critical < 0 || e.Critical > RateScale) && r.err == nil {
				r.err = fmt.Errorf("critical demand %d out of range", e.Critical)
			}
		}
		s.Members = append(s.Members, e)
	}
	if v3 && r.err == nil && !slices.ContainsFunc(s.Members, func(e Entry) bool { return e.Critical != 0 }) {
		r.err = errors.New("format 3 without critical demand") // written in format 1 or 2
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %v", store.ErrBadRecord, r.err)
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes left over", store.ErrBadRecord, len(r.b))
	}
	if err := s.Limit.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", store.ErrBadRecord, err)
	}
	if err := s.Cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", store.ErrBadRecord, err)
	}
	if err := s.checkQuota(); err != nil {
		return nil, fmt.Errorf("%w: %v", store.ErrBadRecord, err)
	}
	if !slices.IsSortedFunc(s.Members, func(a, b Entry) int { return strings.Compare(a.ID, b.ID) }) {
		return nil, fmt.Errorf("%w: members out of order", store.ErrBadRecord)
	}
	return s, nil
}

type writer struct {
	b    []byte
	base int64
}

func (w *writer) u(x uint64) { w.b = binary.AppendUvarint(w.b, x) }
func (w *writer) i(x int64)  { w.b = binary.AppendVarint(w.b, x) }

// t writes a time: 0 for none, else its difference from the base, plus one.
func (w *writer) t(x int64) {
	if x == 0 {
		w.u(0)
		return
	}
	d := uint64(x - w.base)
	w.u((d<<1 ^ uint64(int64(d)>>63)) + 1) // zig-zag, then + 1
}

func (w *writer) share(s Share) { w.u(uint64(s.Rate)); w.u(uint64(s.Burst)) }

type reader struct {
	b    []byte
	base int64
	err  error
}

func (r *reader) u() uint64 {
	if r.err != nil {
		return 0
	}
	x, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("truncated")
		return 0
	}
	r.b = r.b[n:]
	return x
}

// n reads a count that must fit an int64.
func (r *reader) n() uint64 {
	x := r.u()
	if x > math.MaxInt64 {
		r.err = fmt.Errorf("count %d out of range", x)
		return 0
	}
	return x
}

func (r *reader) i() int64 {
	if r.err != nil {
		return 0
	}
	x, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errors.New("truncated")
		return 0
	}
	r.b = r.b[n:]
	return x
}

func (r *reader) t() int64 {
	z := r.u()
	if z == 0 {
		return 0
	}
	z--
	d := int64(z>>1) ^ -int64(z&1)
	return r.base + d
}

func (r *reader) share() Share {
	rate, burst := r.u(), r.u()
	if rate > uint64(RateScale) || burst > uint64(gcra.MaxTau) {
		r.err = fmt.Errorf("share %d/%d out of range", rate, burst)
	}
	return Share{Rate: int64(rate), Burst: int64(burst)}
}
