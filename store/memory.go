package store

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
)

// Memory is the in-process Store: several members in one process share limits through
// it (the demo, tests). It is safe for concurrent use; its zero value is not usable: call
// NewMemory.
type Memory struct {
	clock clock.Clock

	mu       sync.Mutex
	records  map[string]memRecord
	lastVer  uint64 // versions never repeat, across deletions and restarts
	since    int64
	down     bool
	restarts int

	loads, swaps atomic.Int64
}

type memRecord struct {
	data    []byte
	version uint64
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store reading time from clk (nil: clock.Default).
func NewMemory(clk clock.Clock) *Memory {
	if clk == nil {
		clk = clock.Default
	}
	return &Memory{clock: clk, records: map[string]memRecord{}, since: Fresh}
}

// Load reads records (see Store).
func (s *Memory) Load(ctx context.Context, ids []string) (Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return Snapshot{}, backend.ErrUnavailable
	}
	s.loads.Add(1)
	snap := Snapshot{Now: s.now(), Since: s.since, Records: make([]Record, len(ids))}
	for i, id := range ids {
		if r, ok := s.records[id]; ok {
			snap.Records[i] = Record{Data: r.data, Version: r.version}
		}
	}
	return snap, nil
}

// Swap writes records (see Store). Memory keeps records until they are deleted (Keep
// is not needed in memory).
func (s *Memory) Swap(ctx context.Context, writes []Write) ([]uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, backend.ErrUnavailable
	}
	s.swaps.Add(1)
	out := make([]uint64, len(writes))
	for i, w := range writes {
		if s.records[w.ID].version != w.Version {
			continue
		}
		s.lastVer++
		out[i] = s.lastVer
		if w.Data == nil {
			delete(s.records, w.ID)
			continue
		}
		s.records[w.ID] = memRecord{data: append([]byte(nil), w.Data...), version: s.lastVer}
	}
	return out, nil
}

func (s *Memory) now() int64 { return s.clock.Now().UnixNano() }

// Restart loses every record, as a store process that restarts empty does, and begins a
// new incarnation: every limit is fenced until the leases granted before have ended.
func (s *Memory) Restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records = map[string]memRecord{}
	s.since = s.now()
	s.restarts++
}

// Rewind puts back an older copy of a record (Data and Version from an earlier Load), as
// a failover to a replica that lost recent writes does: for tests.
func (s *Memory) Rewind(id string, r Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Version == 0 {
		delete(s.records, id)
		return
	}
	s.records[id] = memRecord{data: r.Data, version: r.Version}
}

// SetDown makes the store unreachable (every call fails with backend.ErrUnavailable) or
// reachable again, keeping its records: an outage, for tests.
func (s *Memory) SetDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// Ops returns how many Load and Swap calls reached the store.
func (s *Memory) Ops() (loads, swaps int64) { return s.loads.Load(), s.swaps.Load() }

// Len returns the number of records held.
func (s *Memory) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}
