package zk

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	gozk "github.com/go-zookeeper/zk"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/store"
)

// Store keeps the lease records in ZooKeeper: each record a znode below a path, written
// by compare-and-set on the znode's version. A record's Version is the zxid of its last
// change (Mzxid: zxids only grow, across deletions), so that versions never decrease.
//
// ZooKeeper stamps every write with its leader's clock (Stat.Mtime, milliseconds): a read
// begins with a write to a clock znode, whose Mtime is the store's time, and whose Ctime is
// when the store's incarnation began (an ensemble wiped or rebuilt from nothing has lost
// the clock znode, so records made within TTL + Grace of its new one are fenced). Every
// record also carries the time its writer used, and is timed no earlier than that (the
// records are read just after the clock), so the store's time never goes back on a record.
// Records are deleted by the allocation once idle; ZooKeeper does not expire them.
//
// It is safe for concurrent use: the members of a process share one Store (and the
// caller's connection, which pipelines their requests).
type Store struct {
	conn  *gozk.Conn
	root  string
	clock string
	now   func() int64 // tests only: a virtual now, Unix nanoseconds (nil: the leader's clock)
	since atomic.Int64 // tests only, with now: when the clock znode was made
	high  store.Latest // the latest time read or seen in a record: what a write stamps

	mu   sync.Mutex
	vers map[string]zkVersion // the znode version of each record's Mzxid, as last read

	tickMu   sync.Mutex
	ticking  bool    // a write of the clock is on its way
	nextTick *zkTick // the one the loads that came meanwhile wait for

	loads, swaps atomic.Int64
}

// zkVersion pairs a record's Version (Mzxid) with its znode's version, which a
// compare-and-set names.
type zkVersion struct {
	mzxid int64
	znode int32
}

var _ store.Store = (*Store)(nil)

// New returns a store on the caller's ZooKeeper connection. The caller keeps the
// connection and closes it.
func New(conn *gozk.Conn, opts ...store.Option) *Store {
	cfg := store.NewConfig(opts...)
	s := &Store{conn: conn, root: DefaultPath, now: cfg.Now, vers: map[string]zkVersion{}}
	if cfg.Prefix != "" {
		s.root = "/" + strings.Trim(strings.ReplaceAll(cfg.Prefix, ":", "/"), "/")
	}
	s.clock = s.root + "/~clock" // base64url names never hold '~'
	return s
}

// DefaultPath is the znode under which the store keeps its records unless
// store.WithPrefix names another (its colons made slashes); it and its parents are made
// when missing.
const DefaultPath = "/sluice/lease"

// Ops returns how many Load and Swap calls the store made.
func (s *Store) Ops() (loads, swaps int64) { return s.loads.Load(), s.swaps.Load() }

// Ping reports whether ZooKeeper answers (backend.Pinger, for the daemon's /readyz).
func (s *Store) Ping(ctx context.Context) error {
	return s.do(ctx, func() error { _, _, err := s.conn.Exists("/"); return err })
}

func (s *Store) path(id string) string {
	return s.root + "/" + base64.RawURLEncoding.EncodeToString([]byte(id))
}

// do runs f, ZooKeeper's calls (which take no context), bounded by ctx: a call left
// running ends when its answer comes or the connection gives up on it.
func (s *Store) do(ctx context.Context, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			return s.failed(err)
		}
		return nil
	case <-ctx.Done():
		return s.failed(ctx.Err())
	}
}

// failed wraps a failure to get an answer from ZooKeeper in backend.ErrUnavailable. One the
// caller's context caused stays as it is.
func (s *Store) failed(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, store.ErrBadRecord) {
		return err
	}
	return fmt.Errorf("%w: lease store: %w", backend.ErrUnavailable, err)
}

// ensureRoot makes the root znode and its parents, and the clock znode.
func (s *Store) ensureRoot() error {
	p := ""
	for _, part := range strings.Split(strings.Trim(s.root, "/"), "/") {
		p += "/" + part
		if _, err := s.conn.Create(p, nil, 0, gozk.WorldACL(gozk.PermAll)); err != nil && !errors.Is(err, gozk.ErrNodeExists) {
			return err
		}
	}
	_, err := s.conn.Create(s.clock, nil, 0, gozk.WorldACL(gozk.PermAll))
	if err == nil && s.now != nil {
		s.since.Store(s.now())
	}
	if errors.Is(err, gozk.ErrNodeExists) {
		return nil
	}
	return err
}

// zkTick is one write of the clock znode, which several loads may share.
type zkTick struct {
	done chan struct{}
	stat *gozk.Stat
	err  error
}

// tick returns the stat of a write of the clock znode made after it was called: its Mtime
// is the leader's time then or later. Loads made while one write is on its way share the
// next one, so that a process's members add one write per round trip, not one per load.
func (s *Store) tick() (*gozk.Stat, error) {
	s.tickMu.Lock()
	if !s.ticking {
		s.ticking = true
		s.tickMu.Unlock()
		t := &zkTick{done: make(chan struct{})}
		s.runTick(t)
		return t.stat, t.err
	}
	if s.nextTick == nil {
		s.nextTick = &zkTick{done: make(chan struct{})}
	}
	t := s.nextTick
	s.tickMu.Unlock()
	<-t.done
	return t.stat, t.err
}

// runTick makes write t, then the one the loads that came meanwhile wait for, if any.
func (s *Store) runTick(t *zkTick) {
	t.stat, t.err = s.writeClock()
	close(t.done)
	s.tickMu.Lock()
	defer s.tickMu.Unlock()
	if next := s.nextTick; next != nil {
		s.nextTick = nil
		go s.runTick(next)
		return
	}
	s.ticking = false
}

// writeClock writes the clock znode (making it if missing) and returns its stat.
func (s *Store) writeClock() (*gozk.Stat, error) {
	st, err := s.conn.Set(s.clock, nil, -1)
	if errors.Is(err, gozk.ErrNoNode) { // the first use, or a wiped ensemble
		if err := s.ensureRoot(); err != nil {
			return nil, err
		}
		st, err = s.conn.Set(s.clock, nil, -1)
	}
	return st, err
}

// Load reads records (see store.Store): a write of the clock znode (shared with the
// process's other loads), and every record, all at once, pipelined on the connection. The
// records may be read before the clock's write: the time is still no earlier than the
// load's start, which is what the leases need (a member's lease is timed from its
// request, sent before), and a record that changes after it is read fails its
// compare-and-set.
func (s *Store) Load(ctx context.Context, ids []string) (store.Snapshot, error) {
	s.loads.Add(1)
	var snap store.Snapshot
	err := s.do(ctx, func() error {
		type got struct {
			data []byte
			stat *gozk.Stat
			err  error
		}
		gots := make([]got, len(ids))
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g := &gots[i]
				g.data, g.stat, g.err = s.conn.Get(s.path(id))
			}()
		}
		st, err := s.tick()
		wg.Wait()
		if err != nil {
			return err
		}
		now, since := st.Mtime*1e6, st.Ctime*1e6
		if s.now != nil {
			now, since = s.now(), s.since.Load()
			if since == 0 || since > now {
				s.since.Store(now)
				since = now
			}
		}
		snap = store.Snapshot{Now: s.high.Raise(now), Since: min(since, now), Records: make([]store.Record, len(ids))}
		for i, g := range gots {
			if snap.Records[i], err = s.record(ids[i], g.data, g.stat, g.err, snap.Now); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return store.Snapshot{}, err
	}
	return snap, nil
}

// record decodes one record as read: its stamp times it no earlier than its writer did.
func (s *Store) record(id string, data []byte, st *gozk.Stat, err error, now int64) (store.Record, error) {
	if errors.Is(err, gozk.ErrNoNode) {
		return store.Record{}, nil
	}
	if err != nil {
		return store.Record{}, err
	}
	if len(data) < store.StampLen {
		return store.Record{}, fmt.Errorf("%w: lease store: znode %s holds %d bytes", store.ErrBadRecord, s.path(id), len(data))
	}
	s.remember(id, st)
	rec := store.Record{Data: data[store.StampLen:], Version: uint64(st.Mzxid)}
	if stamp := int64(binary.BigEndian.Uint64(data)); stamp > now {
		rec.Now = s.high.Raise(stamp)
	}
	return rec, nil
}

func (s *Store) remember(id string, st *gozk.Stat) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.vers) > 100_000 { // ids a process no longer uses: read again when needed
		clear(s.vers)
	}
	s.vers[id] = zkVersion{st.Mzxid, st.Version}
}

// znodeVersion returns the znode version of record id at Mzxid v, or ok false if the
// record has changed since (or is gone).
func (s *Store) znodeVersion(id string, v uint64) (int32, bool, error) {
	s.mu.Lock()
	zv, ok := s.vers[id]
	s.mu.Unlock()
	if ok && zv.mzxid == int64(v) {
		return zv.znode, true, nil
	}
	exists, st, err := s.conn.Exists(s.path(id))
	if err != nil || !exists {
		return 0, false, err
	}
	return st.Version, st.Mzxid == int64(v), nil
}

// Swap writes records (see store.Store): each its own compare-and-set on the znode's
// version, pipelined on the connection.
func (s *Store) Swap(ctx context.Context, writes []store.Write) ([]uint64, error) {
	s.swaps.Add(1)
	stamp := s.high.Load()
	out := make([]uint64, len(writes))
	err := s.do(ctx, func() error {
		errs := make([]error, len(writes))
		var wg sync.WaitGroup
		for i, w := range writes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i], errs[i] = s.swap(w, stamp)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// swap writes one record and returns its new version, or 0 on a conflict.
func (s *Store) swap(w store.Write, stamp int64) (uint64, error) {
	path := s.path(w.ID)
	var data []byte
	if w.Data != nil {
		data = make([]byte, store.StampLen+len(w.Data))
		binary.BigEndian.PutUint64(data, uint64(stamp))
		copy(data[store.StampLen:], w.Data)
	}
	conflict := func(err error) bool {
		return errors.Is(err, gozk.ErrNodeExists) || errors.Is(err, gozk.ErrBadVersion) || errors.Is(err, gozk.ErrNoNode)
	}
	if w.Version == 0 {
		if w.Data == nil {
			return 0, nil // nothing to delete: the record exists or not, either way not as read
		}
		// Made and set at once: the set's stat is the new record's (one zxid for both).
		create := func() ([]gozk.MultiResponse, error) {
			return s.conn.Multi(&gozk.CreateRequest{Path: path, Data: data, Acl: gozk.WorldACL(gozk.PermAll)},
				&gozk.SetDataRequest{Path: path, Data: data, Version: 0})
		}
		rs, err := create()
		if errors.Is(err, gozk.ErrNoNode) { // the root is gone (a wiped ensemble): make it
			if err := s.ensureRoot(); err != nil {
				return 0, err
			}
			rs, err = create()
		}
		if conflict(err) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if len(rs) != 2 || rs[1].Stat == nil {
			return 0, fmt.Errorf("zk: a create answered %d results", len(rs))
		}
		s.remember(w.ID, rs[1].Stat)
		return uint64(rs[1].Stat.Mzxid), nil
	}
	zv, ok, err := s.znodeVersion(w.ID, w.Version)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, nil
	}
	if w.Data == nil {
		// Deleted with a write of the clock in the same transaction, whose zxid is the
		// deletion's: the version returned.
		rs, err := s.conn.Multi(&gozk.DeleteRequest{Path: path, Version: zv}, &gozk.SetDataRequest{Path: s.clock, Version: -1})
		if conflict(err) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if len(rs) != 2 || rs[1].Stat == nil {
			return 0, fmt.Errorf("zk: a delete answered %d results", len(rs))
		}
		return uint64(rs[1].Stat.Mzxid), nil
	}
	st, err := s.conn.Set(path, data, zv)
	if conflict(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	s.remember(w.ID, st)
	return uint64(st.Mzxid), nil
}
