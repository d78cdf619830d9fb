package lease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/lease/allot"
	"github.com/sluicehq/sluice/store"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// side is one store with its applier and its copies of the members.
type side struct {
	name    string
	store   store.Store
	apply   *applier
	members []*allot.Member
	inc     uint64
}

// remote is a real store the differential test runs beside store.Memory.
type remote interface {
	// open makes a store on the test's virtual clock, with nothing in it.
	open(seed uint64, now func() int64) store.Store
	// wipe loses every record, as a restart without its data: the store begins a new
	// incarnation at its next read.
	wipe()
	// save remembers record id's value; rewind puts it back with its old version (a
	// failover that lost the writes since), if the store can.
	save(id string)
	rewind(id string) bool
}

// redisRemote is a real Redis: a record is put back with DUMP and RESTORE.
type redisRemote struct {
	client *goredis.Client
	store  *redisstore.Store
	prefix string
	dump   string
}

func (r *redisRemote) open(seed uint64, now func() int64) store.Store {
	r.client.FlushAll(context.Background())
	r.prefix = fmt.Sprintf("diff%d:", seed)
	r.store = redisstore.New(r.client, store.WithPrefix(r.prefix), store.WithNow(now))
	r.dump = ""
	return r.store
}

func (r *redisRemote) wipe() { r.client.FlushAll(context.Background()) }

func (r *redisRemote) save(id string) {
	r.dump, _ = r.client.Dump(context.Background(), r.prefix+id).Result()
}

func (r *redisRemote) rewind(id string) bool {
	if r.dump == "" {
		return false
	}
	return r.client.RestoreReplace(context.Background(), r.prefix+id, 0, r.dump).Err() == nil
}

// TestDifferentialRedisAndMemStore runs the same random sequences of joins, renewals,
// releases, penalties, crashes, store restarts and rewound records (a failover that lost
// writes) through the allocation on store.Memory and on a real Redis, on the same virtual
// clock, and demands the same replies, the same records, and the allocation's invariant
// after every store operation. The Redis store reads the virtual time the test passes to
// its scripts (microsecond steps).
func TestDifferentialRedisAndMemStore(t *testing.T) {
	srv := redistest.New(t)
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: -1, DisableIdentity: true})
	defer client.Close()
	runDifferential(t, &redisRemote{client: client}, 60)
}

// runDifferential runs seqs sequences (SLUICE_LEASE_DIFF_SEQS: more) against r.
func runDifferential(t *testing.T, r remote, seqs int) {
	if s := os.Getenv("SLUICE_LEASE_DIFF_SEQS"); s != "" {
		seqs, _ = strconv.Atoi(s)
	}
	ops := 0
	for seq := range seqs {
		ops += differentialSequence(t, r, uint64(seq))
	}
	t.Logf("%d sequences, %d store operations, identical", seqs, ops)
}

func differentialSequence(t *testing.T, rem remote, seed uint64) int {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	clk := clock.NewVirtual()
	clk.Set(int64(rng.IntN(1000)) * int64(time.Second))
	cfg := DefaultConfig()
	cfg.JoinWindow = time.Duration(rng.IntN(2)) * 50 * time.Millisecond
	if rng.IntN(3) == 0 {
		cfg.Policy = Equal
	}
	mem := store.NewMemory(clk)
	mem.Restart() // as a store seen for the first time: its incarnation begins now
	red := rem.open(seed, func() int64 { return clk.Now().UnixNano() })
	if _, err := red.Load(ctx, nil); err != nil { // its incarnation begins now, when mem's does
		t.Fatal(err)
	}
	sides := []*side{{name: "memory", store: mem}, {name: "remote", store: red}}
	for _, s := range sides {
		s.apply = &applier{store: s.store, cfg: cfg}
		s.apply.newInc = func() uint64 { s.inc++; return s.inc }
	}
	rate := int64(1 + rng.IntN(200))
	l := gcra.Limit{T: int64(time.Second) / rate, Tau: int64(1+rng.IntN(20)) * (int64(time.Second) / rate)}
	// A quarter of the sequences share a windowed quota, a quarter a ramp (format 2's
	// fields), drawn apart so that the other sequences stay as they were.
	kinds := rand.New(rand.NewPCG(seed, 8))
	switch kinds.IntN(4) {
	case 0:
		w := int64(1+kinds.IntN(5)) * int64(200*time.Millisecond)
		count := int64(5 + kinds.IntN(500))
		l = gcra.Limit{T: w / count, Tau: count * (w / count), Window: w}
	case 1:
		l.Ramp = gcra.Ramp{T0: l.T * int64(2+kinds.IntN(8)), Over: int64(1+kinds.IntN(20)) * int64(time.Second)}
	}
	mcfg := allot.MemberConfig{RenewEvery: 100 * time.Millisecond, Margin: 5 * time.Millisecond}
	const members = 4
	for _, s := range sides {
		for i := range members {
			s.members = append(s.members, allot.NewMember(fmt.Sprint("m", i), l, mcfg, clk.Nanotime()))
		}
	}
	id := RecordID("k", l)
	var saved store.Record
	steps, ops := 20+rng.IntN(60), 0
	for step := range steps {
		clk.Advance(time.Duration(rng.IntN(200)) * time.Millisecond / 4) // microsecond-aligned
		now := clk.Nanotime()
		fail := func(format string, a ...any) {
			t.Fatalf("seed %d step %d (limit %+v, %+v): %s", seed, step, l, cfg, fmt.Sprintf(format, a...))
		}
		switch r := rng.IntN(20); {
		case r == 0: // the store restarts empty
			mem.Restart()
			rem.wipe()
			red.Load(ctx, nil) // the remote store begins its new incarnation at its next read: now
			continue
		case r == 1: // remember the record, to put it back later
			snap, err := mem.Load(ctx, []string{id})
			if err != nil {
				fail("%v", err)
			}
			saved = snap.Records[0]
			rem.save(id)
			continue
		case r == 2 && saved.Version != 0: // a failover that lost the writes since
			if rem.rewind(id) {
				mem.Rewind(id, saved)
			}
			continue
		case r == 3: // a member crashes: a new one takes its name
			i := rng.IntN(members)
			for _, s := range sides {
				s.members[i] = allot.NewMember(fmt.Sprint("m", i), l, mcfg, now)
			}
			continue
		}
		i := rng.IntN(members)
		var reqs [2]allot.Request
		sent := false
		for k, s := range sides {
			m := s.members[i]
			rs := rand.New(rand.NewPCG(seed, uint64(step)<<8|1)) // the same choices on both sides
			// Some demand, so that shares move (and windows' tokens are drawn).
			for range rs.IntN(3) {
				if l.Window > 0 {
					allot.Decide([]*allot.Member{m}, now, int64(1+rs.IntN(3)), 0)
				} else {
					m.AllowOne(now)
				}
			}
			switch r := rs.IntN(10); {
			case r == 0:
				reqs[k], sent = m.PenalizeRequest(now, now+int64(rs.IntN(2000))*int64(time.Millisecond)), true
			case r == 1 && !m.Inflight():
				var ok bool
				if reqs[k], ok = m.Release(now); ok {
					sent = true
				}
				s.members[i] = allot.NewMember(fmt.Sprint("m", i), l, mcfg, now)
			default:
				var ok bool
				reqs[k], ok = m.Request(now, int64(50*time.Millisecond))
				sent = sent || ok
			}
		}
		if !sent {
			continue
		}
		if reqs[0] != withSeen(reqs[1], reqs[0].Seen) {
			fail("the members asked differently:\n%+v\n%+v", reqs[0], reqs[1])
		}
		var reps [2]allot.Reply
		var errs [2]error
		for k, s := range sides {
			res, err := s.apply.apply(ctx, []call{{key: "k", limit: l, req: reqs[k]}})
			ops++
			if err != nil {
				fail("%s: %v", s.name, err)
			}
			reps[k], errs[k] = res[0].rep, res[0].err
			if reqs[k].Op != allot.OpRelease && reqs[k].Op != allot.OpPenalize {
				s.members[i].Receive(clk.Nanotime(), reqs[k].Nonce, reps[k], errs[k])
			}
		}
		if (errs[0] == nil) != (errs[1] == nil) || withVersion(reps[0], 0) != withVersion(reps[1], 0) {
			fail("replies differ:\n memory %+v %v\n remote %+v %v", reps[0], errs[0], reps[1], errs[1])
		}
		var states [2]*allot.State
		for k, s := range sides {
			snap, err := s.store.Load(ctx, []string{id})
			if err != nil {
				fail("%v", err)
			}
			if snap.Records[0].Version == 0 {
				continue
			}
			st, err := allot.UnmarshalState(snap.Records[0].Data)
			if err != nil {
				fail("%s: %v", s.name, err)
			}
			if err := st.Check(snap.Now); err != nil {
				fail("%s: invariant: %v", s.name, err)
			}
			states[k] = st
		}
		if !reflect.DeepEqual(states[0], states[1]) {
			fail("records differ:\n memory %+v\n remote %+v", states[0], states[1])
		}
	}
	return ops
}

func withSeen(r allot.Request, seen uint64) allot.Request { r.Seen = seen; return r }
func withVersion(r allot.Reply, v uint64) allot.Reply     { r.Version = v; return r }
