package lease

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
)

// Store keeps one allocation record (a State) per key and limit, and applies members'
// requests to them atomically on its own clock. MemStore keeps them in memory.
type Store interface {
	// Apply applies each call, in order, to the record of its key and limit (creating it
	// if needed), and returns one result per call. It is safe for concurrent use and may
	// block for a round trip, bounded by ctx. A non-nil error means the outcome of every
	// call is unknown (the store was not reached or did not answer in time); a call's own
	// failure (such as ErrStaleEpoch) is in its Result. The calls slice is the caller's
	// and is not retained.
	Apply(ctx context.Context, calls []Call) ([]Result, error)
}

// Call is one request about the record of Key under Limit.
type Call struct {
	Key   string
	Limit gcra.Limit
	Req   Request
}

// Result is the outcome of one Call.
type Result struct {
	Reply Reply
	Err   error
}

type recordKey struct {
	key   string
	limit gcra.Limit
}

// MemStore is the in-memory Store: several members in one process share limits through
// it (the demo, tests), and the simulator models the same. It is safe for concurrent use;
// its zero value is not usable: call NewMemStore.
type MemStore struct {
	cfg   Config
	clock clock.Clock

	mu        sync.Mutex
	records   map[recordKey]*State
	fresh     bool  // no lease was ever granted before this incarnation
	restarted int64 // when the current incarnation began (store clock)
	down      bool

	calls      atomic.Int64
	roundTrips atomic.Int64
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns an empty in-memory store with the given settings, reading time from
// clk (nil: clock.Default).
func NewMemStore(cfg Config, clk clock.Clock) (*MemStore, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clk == nil {
		clk = clock.Default
	}
	return &MemStore{cfg: cfg, clock: clk, records: map[recordKey]*State{}, fresh: true}, nil
}

// NewIncarnation draws the incarnation of a record being made: a random non-zero number,
// so that the epochs of a record made again after the store forgot or lost it (an idle
// record deleted, a restart, an eviction) never repeat those of an earlier one, and a
// member from an earlier registration cannot renew under a later member's epoch. Two
// records of one key share an incarnation with probability 2⁻⁶⁴.
func NewIncarnation() uint64 {
	for {
		if v := rand.Uint64(); v != 0 {
			return v
		}
	}
}

// Config returns the store's settings.
func (s *MemStore) Config() Config { return s.cfg }

// Apply applies calls (see Store).
func (s *MemStore) Apply(ctx context.Context, calls []Call) ([]Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, ErrUnavailable
	}
	s.roundTrips.Add(1)
	s.calls.Add(int64(len(calls)))
	now := s.clock.Nanotime()
	out := make([]Result, len(calls))
	for i, c := range calls {
		k := recordKey{c.Key, c.Limit}
		st := s.records[k]
		if st == nil {
			fence := int64(0)
			if !s.fresh {
				fence = s.cfg.FenceAfterRestart(s.restarted)
			}
			var err error
			if st, err = NewState(c.Limit, NewIncarnation(), now, fence, s.cfg); err != nil {
				out[i].Err = err
				continue
			}
			s.records[k] = st
		}
		out[i].Reply, out[i].Err = st.Apply(now, s.cfg, c.Req)
		// A record with no member, no penalty and a full pool is indistinguishable from a
		// fresh one: forget it.
		if len(st.Members) == 0 && st.Penalty == 0 && st.Pool >= st.Limit.Tau && now >= st.Fence {
			delete(s.records, k)
		}
	}
	return out, nil
}

// Restart loses every record, as a store process that restarts empty does, and starts a
// fence: every registration is stale (each record is made again with a new incarnation),
// and each limit is fenced off until the leases granted before have ended (TTL + Grace).
func (s *MemStore) Restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records = map[recordKey]*State{}
	s.fresh = false
	s.restarted = s.clock.Nanotime()
}

// SetDown makes the store unreachable (Apply fails with ErrUnavailable) or reachable again,
// keeping its records: an outage, for tests.
func (s *MemStore) SetDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// RoundTrips returns how many Apply calls reached the store; Calls how many requests they
// carried.
func (s *MemStore) RoundTrips() int64 { return s.roundTrips.Load() }

// Calls returns how many requests the store applied.
func (s *MemStore) Calls() int64 { return s.calls.Load() }

// Snapshot returns a copy of the record of key under l, or nil.
func (s *MemStore) Snapshot(key string, l gcra.Limit) *State {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.records[recordKey{key, l}]; st != nil {
		return st.Clone()
	}
	return nil
}
