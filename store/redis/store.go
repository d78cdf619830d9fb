package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/store"
)

//go:embed load.lua
var loadSource string

//go:embed swap.lua
var swapSource string

//go:embed bucket.lua
var bucketSource string

//go:embed clock.lua
var clockSource string

var (
	loadScript   = goredis.NewScript(clockSource + loadSource)
	swapScript   = goredis.NewScript(clockSource + swapSource)
	bucketScript = goredis.NewScript(clockSource + bucketSource)
	scripts      = []*goredis.Script{loadScript, swapScript, bucketScript}
)

// Store keeps the lease records in Redis: each record under its own key (a string
// "VERSION DATA"), read with Redis' clock (TIME) by one script and written by
// compare-and-set by another, so that a batch of renewals is two round trips whatever
// its number of keys. It works with a single Redis, a Sentinel failover client and a
// Redis Cluster (a record's key carries its limit's key as a hash tag; a batch becomes
// one script call per record, pipelined, in the same two round trips).
//
// With a single Redis (or Sentinel) the store keeps a meta key that it makes at its
// first use: a Redis that restarted empty or was flushed has lost it, so records made
// within TTL + Grace of that are fenced (leases granted before may still be in use). A
// Redis Cluster cannot read one such key atomically with records on other nodes, so there
// every record made is fenced. Records are kept while they count any lease (Write.Keep),
// then expire. Redis must not evict them: use maxmemory-policy noeviction (the default)
// or a volatile-* policy with room to spare (see docs/lease.md).
//
// It is safe for concurrent use: the members of a process share one Store (and its
// client's connection pool).
type Store struct {
	client  goredis.UniversalClient
	prefix  string
	cluster bool
	now     func() int64 // tests only: a virtual now, Unix nanoseconds (microsecond steps)
	// assumeFresh (tests only) answers Since as a store that knows no lease was granted
	// before, as a new store.Memory does.
	assumeFresh bool

	loads, swaps atomic.Int64
	bytesIn      atomic.Int64
	bytesOut     atomic.Int64
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Buckets = (*Store)(nil)
)

// metaKeepMs is how long the meta key outlives the store's last read (load.lua): a day.
// A store nobody read for a day is marked anew at its next read, and fences its records
// for TTL + Grace as a store seen for the first time does.
const metaKeepMs = 24 * 3600 * 1000

// New returns a store on the caller's go-redis client: a *redis.Client, a
// failover (Sentinel) client or a *redis.ClusterClient. The caller keeps the client and
// closes it. Bound its commands with time-outs (the member's store time-out bounds each
// call too).
func New(client goredis.UniversalClient, opts ...store.Option) *Store {
	cfg := store.NewConfig(opts...)
	s := &Store{client: client, prefix: DefaultPrefix, now: cfg.Now, assumeFresh: cfg.AssumeFresh}
	if cfg.Prefix != "" {
		s.prefix = cfg.Prefix
	}
	_, s.cluster = client.(*goredis.ClusterClient)
	return s
}

// DefaultPrefix comes before every key the store writes unless store.WithPrefix sets
// another.
const DefaultPrefix = "sluice:lease:"

// Ops returns how many Load and Swap calls the store made.
func (s *Store) Ops() (loads, swaps int64) { return s.loads.Load(), s.swaps.Load() }

// Bytes returns how many bytes of records the store read and wrote.
func (s *Store) Bytes() (read, written int64) { return s.bytesIn.Load(), s.bytesOut.Load() }

// Ping reports whether Redis answers (backend.Pinger, for the daemon's /readyz).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%w: lease store: %w", backend.ErrUnavailable, err)
	}
	return nil
}

func (s *Store) nowArg() string {
	if s.now == nil {
		return ""
	}
	us := s.now() / 1000
	return strconv.FormatInt(us/1e6, 10) + " " + strconv.FormatInt(us%1e6, 10)
}

// Load reads records (see store.Store).
func (s *Store) Load(ctx context.Context, ids []string) (store.Snapshot, error) {
	s.loads.Add(1)
	now := s.nowArg()
	var cmds []*goredis.Cmd
	keysOf := func(ids []string, meta bool) []string {
		keys := make([]string, 0, len(ids)+1)
		for _, id := range ids {
			keys = append(keys, s.prefix+id)
		}
		if meta {
			keys = append(keys, s.prefix+"meta")
		}
		return keys
	}
	err := s.run(ctx, loadScript, func(p goredis.Pipeliner) {
		cmds = cmds[:0]
		if !s.cluster {
			cmds = append(cmds, loadScript.EvalSha(ctx, p, keysOf(ids, true), now, "m", metaKeepMs))
			return
		}
		for _, id := range ids {
			cmds = append(cmds, loadScript.EvalSha(ctx, p, keysOf([]string{id}, false), now, "c"))
		}
	})
	if err != nil {
		return store.Snapshot{}, err
	}
	snap := store.Snapshot{Records: make([]store.Record, 0, len(ids))}
	for k, c := range cmds {
		arr, err := c.Slice()
		if err != nil {
			return store.Snapshot{}, s.failed(err)
		}
		want := 4 + 2*len(ids)
		if s.cluster {
			want = 6
		}
		if len(arr) != want {
			return store.Snapshot{}, fmt.Errorf("%w: lease store: a read of %d values", backend.ErrUnavailable, len(arr))
		}
		recNow, ok1 := usTime(arr[0], arr[1])
		since, ok2 := usTime(arr[2], arr[3])
		if !ok1 || !ok2 {
			return store.Snapshot{}, fmt.Errorf("%w: lease store: unreadable time %v", backend.ErrUnavailable, arr[:4])
		}
		if k == 0 || recNow < snap.Now {
			snap.Now = recNow // a cluster's nodes: the earliest clock
		}
		snap.Since = since
		for i := 4; i < len(arr); i += 2 {
			vs, _ := arr[i].(string)
			data, _ := arr[i+1].(string)
			v, err := strconv.ParseUint(vs, 10, 64)
			if err != nil {
				return store.Snapshot{}, fmt.Errorf("%w: lease store: version %q", store.ErrBadRecord, vs)
			}
			r := store.Record{Version: v}
			if v != 0 {
				r.Data = []byte(data)
				s.bytesIn.Add(int64(len(data)))
			}
			if s.cluster {
				r.Now = recNow
			}
			snap.Records = append(snap.Records, r)
		}
	}
	if s.cluster {
		snap.Since = snap.Now
	}
	if s.assumeFresh {
		snap.Since = store.Fresh
	}
	return snap, nil
}

// Swap writes records (see store.Store).
func (s *Store) Swap(ctx context.Context, writes []store.Write) ([]uint64, error) {
	s.swaps.Add(1)
	now := s.nowArg()
	var cmds []*goredis.Cmd
	args := func(ws []store.Write) []any {
		a := make([]any, 0, 1+3*len(ws))
		a = append(a, now)
		for _, w := range ws {
			// A TTL (PX) runs from Redis' clock truncated to the millisecond: Keep rounded
			// up, and a millisecond more, so that the record outlives Keep after the write.
			keep := max((int64(w.Keep)+999_999)/1_000_000+1, 1000)
			a = append(a, strconv.FormatUint(w.Version, 10), w.Data, keep)
			s.bytesOut.Add(int64(len(w.Data)))
		}
		return a
	}
	err := s.run(ctx, swapScript, func(p goredis.Pipeliner) {
		cmds = cmds[:0]
		if !s.cluster {
			keys := make([]string, len(writes))
			for i, w := range writes {
				keys[i] = s.prefix + w.ID
			}
			cmds = append(cmds, swapScript.EvalSha(ctx, p, keys, args(writes)...))
			return
		}
		for i := range writes {
			cmds = append(cmds, swapScript.EvalSha(ctx, p, []string{s.prefix + writes[i].ID}, args(writes[i:i+1])...))
		}
	})
	if err != nil {
		return nil, err
	}
	out := make([]uint64, 0, len(writes))
	for _, c := range cmds {
		arr, err := c.StringSlice()
		if err != nil {
			return nil, s.failed(err)
		}
		for _, vs := range arr {
			v, err := strconv.ParseUint(vs, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: lease store: version %q", backend.ErrUnavailable, vs)
			}
			out = append(out, v)
		}
	}
	if len(out) != len(writes) {
		return nil, fmt.Errorf("%w: lease store: %d versions for %d writes", backend.ErrUnavailable, len(out), len(writes))
	}
	return out, nil
}

// Bucket applies op to the bucket id in one script call (store.Buckets): no
// compare-and-set, so the members of a crowded limit never collide on it.
func (s *Store) Bucket(ctx context.Context, id string, op store.BucketOp) (store.BucketResult, error) {
	s.swaps.Add(1)
	charge := "0"
	if op.Charge {
		charge = "1"
	}
	keys, fence := []string{s.prefix + id}, op.Fence
	if !s.cluster {
		keys = append(keys, s.prefix+"meta")
	}
	if s.assumeFresh {
		fence = 0
	}
	var cmd *goredis.Cmd
	err := s.run(ctx, bucketScript, func(p goredis.Pipeliner) {
		cmd = bucketScript.EvalSha(ctx, p, keys, s.nowArg(), op.Start, op.T, op.Tau, op.N, op.MaxDelay, charge, op.Hold,
			store.BucketKeep.Milliseconds(), fence, metaKeepMs)
	})
	if err != nil {
		if cmd != nil && cmd.Err() != nil && strings.Contains(cmd.Err().Error(), "bad record") {
			return store.BucketResult{}, fmt.Errorf("%w: lease store: %s", store.ErrBadRecord, s.prefix+id)
		}
		if cmd != nil && cmd.Err() != nil && strings.Contains(cmd.Err().Error(), "bad bucket operation") {
			return store.BucketResult{}, fmt.Errorf("%w: %+v", store.ErrBadBucketOp, op)
		}
		return store.BucketResult{}, err
	}
	arr, err := cmd.Int64Slice()
	if err != nil {
		return store.BucketResult{}, s.failed(err)
	}
	if len(arr) != 4 {
		return store.BucketResult{}, fmt.Errorf("%w: lease store: a bucket's answer of %d values", backend.ErrUnavailable, len(arr))
	}
	return store.BucketResult{Taken: arr[0] == 1, Wait: arr[1], Now: arr[2]*1e6 + arr[3]}, nil
}

// run sends the commands fill adds to a pipeline, loading the script first if Redis does
// not know it (a restarted Redis, a new node) and sending them again.
func (s *Store) run(ctx context.Context, script *goredis.Script, fill func(goredis.Pipeliner)) error {
	for attempt := 0; ; attempt++ {
		p := s.client.Pipeline()
		fill(p)
		_, err := p.Exec(ctx)
		if err == nil {
			return nil
		}
		if attempt == 0 && isNoScript(err) {
			if lerr := s.loadScripts(ctx); lerr != nil {
				return s.failed(lerr)
			}
			continue
		}
		return s.failed(err)
	}
}

// loadScripts loads the scripts, on every master of a cluster.
func (s *Store) loadScripts(ctx context.Context) error {
	load := func(ctx context.Context, c *goredis.Client) error {
		for _, sc := range scripts {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		return c.ForEachMaster(ctx, load)
	default:
		for _, sc := range scripts {
			if err := sc.Load(ctx, s.client).Err(); err != nil {
				return err
			}
		}
		return nil
	}
}

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// failed wraps a failure to get an answer from Redis in backend.ErrUnavailable: a
// connection error, a time-out, a Redis loading or without a master, a reply it could not
// give. The members answer it by their fail mode. One the caller's context caused stays as
// it is.
func (s *Store) failed(err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w: lease store: %w", backend.ErrUnavailable, err)
}

// usTime reads a time from Redis' seconds and microseconds, as Unix nanoseconds; -1 -1
// is the earliest time.
func usTime(a, b any) (int64, bool) {
	s, ok1 := a.(int64)
	us, ok2 := b.(int64)
	if !ok1 || !ok2 {
		return 0, false
	}
	if s < 0 {
		return store.Fresh, true
	}
	return s*1e9 + us*1e3, true
}
