package etcd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/store"
)

// Store keeps the lease records in etcd: each record under its own key below a prefix,
// read in one transaction and written by compare-and-set on the key's mod revision (a
// record's Version is its mod revision: etcd's revisions only grow, across deletions), one
// nested transaction per batch, so that a batch of renewals is two round trips whatever its
// number of keys.
//
// etcd has no clock to read. The store's time is the members' wall clocks made monotonic
// per record: every record carries the time its writer used, and a reader times the record
// at the later of its own clock and that stamp. Leases are timed on it, so the members'
// clocks must agree to within MemberConfig.Margin (50 ms by default; NTP keeps machines
// within a few milliseconds): docs/lease.md says why, and what a larger skew costs.
//
// A meta key made at the store's first use marks its incarnation: a cluster wiped or
// rebuilt from nothing has lost it, so records made within TTL + Grace of its new one are
// fenced. A cluster restored from an older snapshot goes back in revisions (unless
// restored with --bump-revision): a member that has seen a later version of a record
// fences it. Records are deleted by the allocation once idle; etcd does not expire them.
//
// It is safe for concurrent use: the members of a process share one Store (and the
// caller's client).
type Store struct {
	client *clientv3.Client
	prefix string
	now    func() int64 // the clock read, Unix nanoseconds (tests: a virtual one)
	high   store.Latest // the latest time read or seen in a record: what a write stamps

	loads, swaps atomic.Int64
}

var _ store.Store = (*Store)(nil)

// New returns a store on the caller's etcd client. The caller keeps the client
// and closes it.
func New(client *clientv3.Client, opts ...store.Option) *Store {
	cfg := store.NewConfig(opts...)
	s := &Store{client: client, prefix: DefaultPrefix, now: cfg.Now}
	if cfg.Prefix != "" {
		s.prefix = cfg.Prefix
	}
	if s.now == nil {
		s.now = func() int64 { return time.Now().UnixNano() }
	}
	return s
}

// DefaultPrefix comes before every key the store writes unless store.WithPrefix sets
// another.
const DefaultPrefix = "sluice/lease/"

// etcdMaxOps is how many operations the store puts in one transaction: etcd refuses more
// than its --max-txn-ops (128 by default).
const etcdMaxOps = 100

// Ops returns how many Load and Swap calls the store made.
func (s *Store) Ops() (loads, swaps int64) { return s.loads.Load(), s.swaps.Load() }

// Ping reports whether etcd answers (backend.Pinger, for the daemon's /readyz).
func (s *Store) Ping(ctx context.Context) error {
	if _, err := s.client.Get(ctx, s.prefix+"meta"); err != nil {
		return s.failed(err)
	}
	return nil
}

// clock reads the member's clock, never behind what the store has seen.
func (s *Store) clock() int64 { return s.high.Raise(s.now()) }

// Load reads records (see store.Store): the meta key and every record in one transaction,
// at one revision; a batch above etcdMaxOps reads the rest at that same revision.
func (s *Store) Load(ctx context.Context, ids []string) (store.Snapshot, error) {
	s.loads.Add(1)
	now := s.clock()
	meta := s.prefix + "meta"
	first := ids[:min(len(ids), etcdMaxOps)]
	gets := []clientv3.Op{clientv3.OpGet(meta)}
	for _, id := range first {
		gets = append(gets, clientv3.OpGet(s.prefix+id))
	}
	// A read-only transaction: etcd answers it without a write to its log. The meta key is
	// made in a transaction of its own when missing (the first use, or a wiped cluster).
	var resp *clientv3.TxnResponse
	for attempt := 0; ; attempt++ {
		var err error
		if resp, err = s.client.Txn(ctx).Then(gets...).Commit(); err != nil {
			return store.Snapshot{}, s.failed(err)
		}
		if len(resp.Responses) > 0 && len(resp.Responses[0].GetResponseRange().GetKvs()) > 0 || attempt > 0 {
			break
		}
		_, err = s.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(meta), "=", 0)).
			Then(clientv3.OpPut(meta, strconv.FormatInt(now, 10))).Commit()
		if err != nil {
			return store.Snapshot{}, s.failed(err)
		}
	}
	rs := resp.Responses
	if len(rs) != 1+len(first) {
		return store.Snapshot{}, fmt.Errorf("%w: lease store: etcd answered %d reads of %d", backend.ErrUnavailable, len(rs), 1+len(first))
	}
	snap := store.Snapshot{Now: now, Records: make([]store.Record, 0, len(ids))}
	mkv := rs[0].GetResponseRange().GetKvs()
	if len(mkv) != 1 {
		return store.Snapshot{}, fmt.Errorf("%w: lease store: no meta key %q", backend.ErrUnavailable, meta)
	}
	since, err := strconv.ParseInt(string(mkv[0].Value), 10, 64)
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("%w: lease store: meta key %q holds %q", store.ErrBadRecord, meta, mkv[0].Value)
	}
	snap.Since = min(since, now)
	for _, r := range rs[1:] {
		rec, err := s.record(r.GetResponseRange().GetKvs(), now)
		if err != nil {
			return store.Snapshot{}, err
		}
		snap.Records = append(snap.Records, rec)
	}
	rev := resp.Header.GetRevision()
	for rest := ids[len(first):]; len(rest) > 0; {
		part := rest[:min(len(rest), etcdMaxOps)]
		rest = rest[len(part):]
		ops := make([]clientv3.Op, len(part))
		for i, id := range part {
			ops[i] = clientv3.OpGet(s.prefix+id, clientv3.WithRev(rev))
		}
		more, err := s.client.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return store.Snapshot{}, s.failed(err)
		}
		if len(more.Responses) != len(part) {
			return store.Snapshot{}, fmt.Errorf("%w: lease store: etcd answered %d reads of %d", backend.ErrUnavailable, len(more.Responses), len(part))
		}
		for _, r := range more.Responses {
			rec, err := s.record(r.GetResponseRange().GetKvs(), now)
			if err != nil {
				return store.Snapshot{}, err
			}
			snap.Records = append(snap.Records, rec)
		}
	}
	return snap, nil
}

// record decodes one record as read: its stamp times it no earlier than its writer did.
func (s *Store) record(kvs []*mvccpb.KeyValue, now int64) (store.Record, error) {
	if len(kvs) == 0 {
		return store.Record{}, nil
	}
	kv := kvs[0]
	if len(kv.Value) < store.StampLen {
		return store.Record{}, fmt.Errorf("%w: lease store: key %q holds %d bytes", store.ErrBadRecord, kv.Key, len(kv.Value))
	}
	stamp := int64(binary.BigEndian.Uint64(kv.Value))
	rec := store.Record{Data: kv.Value[store.StampLen:], Version: uint64(kv.ModRevision)}
	if stamp > now {
		rec.Now = s.high.Raise(stamp)
	}
	return rec, nil
}

// Swap writes records (see store.Store): one nested transaction per batch (per etcdMaxOps
// writes), each record's own compare-and-set on its mod revision inside it.
func (s *Store) Swap(ctx context.Context, writes []store.Write) ([]uint64, error) {
	s.swaps.Add(1)
	stamp := s.high.Load()
	out := make([]uint64, 0, len(writes))
	for rest := writes; len(rest) > 0; {
		part := rest[:min(len(rest), etcdMaxOps)]
		rest = rest[len(part):]
		ops := make([]clientv3.Op, len(part))
		for i, w := range part {
			key := s.prefix + w.ID
			var cmp clientv3.Cmp
			if w.Version == 0 {
				cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
			} else {
				cmp = clientv3.Compare(clientv3.ModRevision(key), "=", int64(w.Version))
			}
			var op clientv3.Op
			if w.Data == nil {
				op = clientv3.OpDelete(key)
			} else {
				v := make([]byte, store.StampLen+len(w.Data))
				binary.BigEndian.PutUint64(v, uint64(stamp))
				copy(v[store.StampLen:], w.Data)
				op = clientv3.OpPut(key, string(v))
			}
			ops[i] = clientv3.OpTxn([]clientv3.Cmp{cmp}, []clientv3.Op{op}, nil)
		}
		resp, err := s.client.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, s.failed(err)
		}
		if len(resp.Responses) != len(part) {
			return nil, fmt.Errorf("%w: lease store: etcd answered %d writes of %d", backend.ErrUnavailable, len(resp.Responses), len(part))
		}
		rev := uint64(resp.Header.GetRevision())
		for _, r := range resp.Responses {
			v := uint64(0)
			if t := r.GetResponseTxn(); t != nil && t.Succeeded {
				v = rev
			}
			out = append(out, v)
		}
	}
	return out, nil
}

// failed wraps a failure to get an answer from etcd in backend.ErrUnavailable: the
// members answer it by their fail mode. One the caller's context caused stays as it is.
func (s *Store) failed(err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w: lease store: %w", backend.ErrUnavailable, err)
}
