package lease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/clock"
)

// Store keeps the allocation records of the limits members share: one record per key and
// limit, a few hundred bytes, read and written by compare-and-set. The allocation itself
// runs in Go, in every member's process (it reads the records a batch of requests needs
// with the store's time, applies the requests, and writes back every record whose version
// is unchanged, retrying the others), so a store is only this small contract, the same
// for MemStore (in process) and any store a user writes. docs/lease.md states what each
// store guarantees.
//
// Both methods are safe for concurrent use, may block for a round trip bounded by ctx,
// and return ErrUnavailable (wrapped) when the store cannot be reached. They must not
// retain the slices passed.
type Store interface {
	// Load returns the records named by ids, in the order given (a missing record has
	// no Data and Version 0), the store's clock, and when the store's current
	// incarnation began. All of it is read at one instant of the store.
	Load(ctx context.Context, ids []string) (Snapshot, error)
	// Swap writes each record whose version is still the one given (0: the record must
	// not exist), atomically per record, and returns each record's new version, or 0
	// where the version had changed (a conflict: nothing was written). Writing a record
	// with no Data deletes it. A record's versions never decrease while the store keeps
	// its data, even across a deletion and a new record under the same ID.
	Swap(ctx context.Context, writes []Write) ([]uint64, error)
}

// Snapshot is what Load read.
type Snapshot struct {
	// Now is the store's clock, Unix nanoseconds: every lease is timed on it.
	Now int64
	// Since is when the store's current incarnation began, on its clock: the store lost
	// every record then (a restart without persistence, a flush), or first began. A record
	// missing from an incarnation younger than TTL + Grace may have held leases that are
	// still in use, so it is made fenced. math.MinInt64: the store knows no lease was
	// ever granted from a record it no longer has (a new MemStore), and a store that
	// cannot tell (a Redis Cluster) answers Now: every missing record is fenced.
	Since   int64
	Records []Record
}

// Record is one record as read.
type Record struct {
	Data    []byte
	Version uint64 // 0: the record does not exist
	// Now, if not 0, is the clock of the server that holds this record, where a store is
	// several servers (a Redis Cluster): the record's leases are timed on it.
	Now int64
}

// Write is one compare-and-set.
type Write struct {
	ID      string
	Data    []byte // nil deletes the record
	Version uint64 // the version read; 0: the record must not exist
	// Keep is how long the store must keep the record at least, if nothing writes it
	// again: after it, the record is the same as no record (no lease it granted is still
	// counted). A store may forget it then (Redis: the key's expiry), or keep it.
	Keep time.Duration
}

// MemStore is the in-process Store: several members in one process share limits through
// it (the demo, tests). It is safe for concurrent use; its zero value is not usable: call
// NewMemStore.
type MemStore struct {
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

var _ Store = (*MemStore)(nil)

// NewMemStore returns an empty in-memory store reading time from clk (nil: clock.Default).
func NewMemStore(clk clock.Clock) *MemStore {
	if clk == nil {
		clk = clock.Default
	}
	return &MemStore{clock: clk, records: map[string]memRecord{}, since: minTime}
}

// minTime marks an incarnation that knows no earlier one.
const minTime = -1 << 63

// Load reads records (see Store).
func (s *MemStore) Load(ctx context.Context, ids []string) (Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return Snapshot{}, ErrUnavailable
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

// Swap writes records (see Store). MemStore keeps records until they are deleted (Keep
// is not needed in memory).
func (s *MemStore) Swap(ctx context.Context, writes []Write) ([]uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, ErrUnavailable
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

func (s *MemStore) now() int64 { return s.clock.Now().UnixNano() }

// Restart loses every record, as a store process that restarts empty does, and begins a
// new incarnation: every limit is fenced until the leases granted before have ended.
func (s *MemStore) Restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records = map[string]memRecord{}
	s.since = s.now()
	s.restarts++
}

// Rewind puts back an older copy of a record (Data and Version from an earlier Load), as
// a failover to a replica that lost recent writes does: for tests.
func (s *MemStore) Rewind(id string, r Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Version == 0 {
		delete(s.records, id)
		return
	}
	s.records[id] = memRecord{data: r.Data, version: r.Version}
}

// SetDown makes the store unreachable (every call fails with ErrUnavailable) or reachable
// again, keeping its records: an outage, for tests.
func (s *MemStore) SetDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// Ops returns how many Load and Swap calls reached the store.
func (s *MemStore) Ops() (loads, swaps int64) { return s.loads.Load(), s.swaps.Load() }

// Len returns the number of records held.
func (s *MemStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// WaitUnfenced waits until records that store makes are no longer fenced for the youth of
// its incarnation: TTL + Grace (cfg's) after it began, on the store's clock. A store seen
// for the first time (a Redis that was just started, or flushed) cannot tell that no lease
// was granted from it before, so it fences every record it makes for that long; a process
// that starts a workload on a new store can wait here first. It returns at once for a
// store that knows it is fresh (a new MemStore) or whose incarnation is old enough, and
// waits at most TTL + Grace otherwise (a Redis Cluster, which fences every record it
// makes, included). A store that does not answer yet (ErrUnavailable: ZooKeeper's client
// still making its first connection, a Redis restarting) is asked again every 100 ms
// until ctx ends, which returns its last error; any other error returns at once.
func WaitUnfenced(ctx context.Context, store Store, cfg Config) error {
	snap, err := store.Load(ctx, nil)
	for err != nil {
		if !errors.Is(err, ErrUnavailable) || clock.Default.Sleep(ctx, 100*time.Millisecond) != nil {
			return err
		}
		snap, err = store.Load(ctx, nil)
	}
	if snap.Since == minTime {
		return nil
	}
	wait := time.Duration(cfg.FenceAfterRestart(snap.Since) - snap.Now)
	if wait <= 0 {
		return nil
	}
	return clock.Default.Sleep(ctx, wait)
}
