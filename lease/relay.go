package lease

// The relay: the members of a crowded limit hand their renewals to one allocator.
//
// Every member of a limit writes its one record by compare-and-set, so their writes
// serialise on it: past a few dozen members most of them lose to each other and are
// retried, and at two hundred nearly all are (BENCHMARKS.md, "Lease mode through a real
// Redis"). Once a limit's replies say it has more than relayAbove live members, a member
// posts its renewals and releases in a mailbox of its own beside the limit's record
// instead, and one member of the pool, the allocator, reads the record and every member's
// mailbox each tick, applies the requests it finds to the record as the members would
// have (allot.State.Apply, in the order they were posted), writes the record once, and
// writes each answer into its mailbox, where its member reads it. So the record takes one
// write a tick whatever the number of members, and nobody's post collides with anyone
// else's. A member posts over the version of its mailbox it last saw (the allocator writes
// it only to answer), without reading it first, and reads it first when its allocator
// lately read posts (relay.expect), not every tick: a thousand members reading at every
// tick kept the store from the allocator's reads.
//
// Nothing of the lease mode's safety rests on the relay: the record still changes only by
// Apply of a member's own request, written by compare-and-set; a member still acts only on
// the answer to its newest request, and times its lease from when it sent it (so an
// answer that comes late is a shorter lease, never a longer one). Two allocators at once
// (an election's overlap) only collide on the record as members do. A request applied
// late is one whose answer was lost, which a member already tolerates; one applied twice
// (an allocator whose answers were lost after its record was written reads it again)
// states again what the member holds, and the permits a request gives back, whose effect
// would add up, are left out of it (postable). The allocator is chosen by a lease of its
// own (the ballot: a holder and an end on the store's clock, claimed by compare-and-set
// once it has ended), so a crashed allocator is replaced within a ballot's time. A request the allocator does
// not answer in time fails as one the store did not answer, and after missesBeforeDirect
// of them, while no allocator holds the ballot, the member's next request goes to the
// record directly (so a pool without an allocator still renews, at the cost of the
// collisions).
//
// Takes, gives and penalties are not relayed, and a member of a crowded limit does not
// borrow (borrowsCrowded). A take is what a caller waits for, and on a limit decided at
// the store every permit is one: relayed, a member's takes went in rounds of a tick or
// more, the members' rounds fell into step, and each tick's takes had only the burst less
// their lateness to share (a relayed take kept its lateness in the pool, so that a
// permit used up to four ticks after it was taken still conformed), so that 24 members
// used 65 permits a second of 100/s burst=20 and 100 members 17, where each taking the
// record directly uses 101 and 59 (BenchmarkLeaseRedisCentral, members asking in step;
// at Poisson times, 48 and 100 members used 83 and 55 relayed, 99 directly).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/lease/allot"
	"github.com/sluicehq/sluice/store"
)

const (
	// relayAbove is the number of live members past which a limit's renewals are relayed.
	relayAbove = allot.CrowdedAbove
	// mailKeep is how long a mailbox is kept without a new post (its member left).
	mailKeep = 30 * time.Second
	// resignAfter is how long an allocator with nothing to apply keeps its ballot.
	resignAfter = 5 * time.Second
	// seenKeep is how long an allocator reads the mailbox of a member its record no longer
	// holds (its lease ended): one that joins again is answered without knocking.
	seenKeep = 10 * time.Second
)

// slot is what a member's mailbox holds: its newest relayed request and, once applied,
// the answer to it.
type slot struct {
	Req allot.Request `json:"q"`
	// Answered is the nonce of the request answered (Req.Nonce once applied).
	Answered uint64       `json:"a,omitempty"`
	Rep      *allot.Reply `json:"p,omitempty"`
	// Err is the request's own failure: "stale" (allot.ErrStaleEpoch), "bad record: ..."
	// (store.ErrBadRecord), or another message (allot.ErrBadRequest).
	Err string `json:"x,omitempty"`
	// Posted is when the request was posted, on the store's clock (as its member
	// reckons it), and Read when the allocator read it, on the store's clock: Read -
	// Posted is how long its member waits for an answer (relay.took).
	Posted int64 `json:"t"`
	Read   int64 `json:"r,omitempty"`
}

// ballot is the allocator's lease: its holder, until an instant of the store's clock.
type ballot struct {
	Holder string `json:"h"`
	Until  int64  `json:"u"`
}

// marshalSlot and unmarshalSlot are the mailboxes' codec; a missing mailbox is a nil slot.
func marshalSlot(s *slot) []byte {
	data, _ := json.Marshal(s) // plain structs: never fails
	return data
}

func unmarshalSlot(data []byte) (*slot, error) {
	if len(data) == 0 {
		return nil, nil
	}
	s := &slot{}
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("%w: lease mailbox: %w", store.ErrBadRecord, err)
	}
	return s, nil
}

// marshalJSON and unmarshalJSON are the ballot's and the doors' codec (what names the
// record in an error): plain structs, which never fail to encode; a missing record is the
// zero value.
func marshalJSON[T any](v T) []byte {
	data, _ := json.Marshal(v)
	return data
}

func unmarshalJSON[T any](data []byte, what string) (T, error) {
	var v T
	if len(data) > 0 {
		if err := json.Unmarshal(data, &v); err != nil {
			return v, fmt.Errorf("%w: lease %s: %w", store.ErrBadRecord, what, err)
		}
	}
	return v, nil
}

func marshalBallot(b ballot) []byte { return marshalJSON(b) }

func unmarshalBallot(data []byte) (ballot, error) { return unmarshalJSON[ballot](data, "ballot") }

// door is the names of the members whose joins wait in their mailboxes, each with when
// it knocked (the store's clock): the allocator reads the mailboxes of the record's
// members and of these. A limit has doorStripes doors; a member knocks at one.
type door struct {
	Joining map[string]int64 `json:"j"`
}

const doorStripes = 16

func marshalDoor(d door) []byte { return marshalJSON(d) }

func unmarshalDoor(data []byte) (door, error) {
	d, err := unmarshalJSON[door](data, "door")
	if d.Joining == nil {
		d.Joining = map[string]int64{}
	}
	return d, err
}

func doorID(rec string, k int) string { return rec + "|door" + strconv.Itoa(k) }

func doorOf(member string) int {
	h := fnv.New32a()
	h.Write([]byte(member))
	return int(h.Sum32() % doorStripes)
}

// knock puts the joiners of calls (by index) at their limits' doors.
func (a *applier) knock(ctx context.Context, calls []call, joins []int) error {
	byDoor := map[string][]string{}
	for _, i := range joins {
		id := doorID(RecordID(calls[i].key, calls[i].limit), doorOf(calls[i].req.Member))
		byDoor[id] = append(byDoor[id], calls[i].req.Member)
	}
	ids := slices.Sorted(maps.Keys(byDoor))
	for attempt := 0; len(ids) > 0; attempt++ {
		if attempt == MaxAttempts {
			return fmt.Errorf("%w (%d attempts to knock at a limit's door)", store.ErrConflict, MaxAttempts)
		}
		if attempt > 0 {
			if err := a.sleep(ctx, time.Duration(rand.Int64N(int64(time.Millisecond)<<min(attempt, 4)))); err != nil {
				return err
			}
		}
		snap, err := a.load(ctx, ids)
		if err != nil {
			return err
		}
		var writes []store.Write
		for k, id := range ids {
			d, err := unmarshalDoor(snap.Records[k].Data)
			if err != nil {
				return err
			}
			for _, m := range byDoor[id] {
				d.Joining[m] = snap.Now
			}
			writes = append(writes, store.Write{ID: id, Data: marshalDoor(d), Version: snap.Records[k].Version, Keep: mailKeep})
		}
		vers, err := a.swap(ctx, writes)
		if err != nil {
			return err
		}
		var again []string
		for k, id := range ids {
			if vers[k] == 0 {
				again = append(again, id)
			}
		}
		ids = again
	}
	return nil
}

// mailboxID and ballotID name a member's mailbox and a relayed record's ballot: beside
// the record (its key's hash tag first, so that a Redis Cluster keeps them in its slot).
func mailboxID(rec, member string) string { return rec + "|m|" + member }
func ballotID(rec string) string          { return rec + "|alloc" }

// answerErr turns a slot's Err back into the error the member branches on, and errAnswer
// the error into it.
func answerErr(s string) error {
	switch {
	case s == "":
		return nil
	case s == "stale":
		return allot.ErrStaleEpoch
	case strings.HasPrefix(s, "bad record: "):
		return fmt.Errorf("%w: %s", store.ErrBadRecord, strings.TrimPrefix(s, "bad record: "))
	default:
		return fmt.Errorf("%w: %s", allot.ErrBadRequest, s)
	}
}

func errAnswer(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, allot.ErrStaleEpoch):
		return "stale"
	case errors.Is(err, store.ErrBadRecord):
		return "bad record: " + err.Error()
	default:
		return err.Error()
	}
}

// relay is an applier's part in the relays of the limits it serves.
type relay struct {
	self  string        // this member's name in ballots
	tick  time.Duration // how often the allocator reads the mailboxes, and a member its own
	above int           // relayAbove, or a test's
	clock clock.Clock

	mu        sync.Mutex
	misses    map[string]int           // record ID → its relayed requests unanswered in a row
	lat       map[string]time.Duration // record ID → how long its answers took lately (took)
	boxes     map[string]uint64        // mailbox ID → its version as this member last saw it (saw1)
	skew      int64                    // the store's clock less this process's, as last read
	skewKnown bool
	crowd     map[string]int  // record ID → its members when last read, if more than above
	buckets   map[string]bool // record ID → it was on its bucket when last read (joins go directly)
	allocs    map[string]bool // the records this member allocates
	stop      chan struct{}
	stopped   bool
	wg        sync.WaitGroup
}

// newRelay returns the relay of a member named self that renews every renew.
func newRelay(self string, renew time.Duration, c clock.Clock) *relay {
	return &relay{self: self, tick: min(max(renew/10, 5*time.Millisecond), 100*time.Millisecond), above: relayAbove, clock: c,
		misses: map[string]int{}, lat: map[string]time.Duration{}, boxes: map[string]uint64{}, crowd: map[string]int{}, buckets: map[string]bool{}, allocs: map[string]bool{}, stop: make(chan struct{})}
}

// ballotTTL is how long a ballot holds: twenty ticks, at least half a second.
func (r *relay) ballotTTL() int64 { return int64(max(20*r.tick, 500*time.Millisecond)) }

// relayable reports whether a call may be relayed: a join, renewal or release, by a
// member that last heard of more than relayAbove live members (Request.Size) or on a
// record this member last read with more, whose relayed requests have not gone
// unanswered missesBeforeDirect times in a row; not a join or release of a record last
// read on its bucket, which is a read (allot.ReadOnBucket).
func (r *relay) relayable(id string, c call) bool {
	if r == nil || !r.relayableOp(c) {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.req.Size <= int64(r.above) && r.crowd[id] <= r.above || r.buckets[id] && allot.ReadOnBucket(c.req.Op) {
		return false
	}
	if r.misses[id] >= missesBeforeDirect {
		delete(r.misses, id) // this one goes directly, and the next to the relay again
		return false
	}
	return true
}

// saw records how many members a record held when read, and whether it was on its
// bucket: then it is crowded, though its members' entries expire (they confirm by reading
// it).
func (r *relay) saw(id string, members int, onBucket bool) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if onBucket {
		members = max(members, r.above+1)
		if len(r.buckets) >= maxRemembered {
			clear(r.buckets)
		}
		r.buckets[id] = true
	} else {
		delete(r.buckets, id)
	}
	if members > r.above {
		if len(r.crowd) >= maxRemembered {
			clear(r.crowd) // keys gone idle: what they said is relearned at their next read
		}
		r.crowd[id] = members
	} else {
		delete(r.crowd, id)
	}
}

// maxRemembered bounds what a relay remembers per record (its crowd, its misses): a
// process serving more crowded keys than this relearns them.
const maxRemembered = 4096

// relayableOp reports whether a call's operation may be relayed: a join (the joiner
// knocks at the limit's door, so that the allocator reads its mailbox), a renewal or a
// release; not a take (see the package comment), a give or a penalty. A relayed request
// gives no permits back (postable drops Request.Return): that is the one part of a
// request whose effect adds up when it is applied twice, which an allocator whose answers
// were lost after its record was written would do; every other part of a renewal or
// release states what the member holds, and says it again harmlessly.
func (r *relay) relayableOp(c call) bool {
	switch c.req.Op {
	case allot.OpJoin, allot.OpRenew, allot.OpRelease:
		return !c.req.Borrow
	}
	return false
}

// postable returns the request a member posts in its mailbox: without the permits it
// gives back (Request.Return). Those are lost
// to the pool (the store counts them as used until the lease that held them ends, a tenth
// of a share's rate at most): a member that wrote the record directly to give them back
// made the allocator lose its own write to it, at two hundred members one write in two
// (BenchmarkLeaseRedisMembers).
func (r *relay) postable(req allot.Request) allot.Request {
	req.Return = 0
	return req
}

// borrowsCrowded reports whether c is a borrow on a limit that is crowded (as relayable
// judges it): such a borrow is refused at once, without a store call (errCrowdedBorrow).
// A borrow writes the record directly, for the caller waits for it: on a crowded limit
// the members' borrows made its allocator lose its writes of the record. The capacity they
// would have borrowed reaches them through their shares, which the allocator sets. A
// borrow's settlement up is not refused: its permits were used already, and must count
// (at the record, or at its bucket: TestSettlementsAtTheBucket).
func (r *relay) borrowsCrowded(id string, c call) bool {
	if r == nil || !c.req.Borrow || (c.req.Op == allot.OpTake && c.req.MaxDelay < 0) {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return c.req.Size > int64(r.above) || r.crowd[id] > r.above
}

// errCrowdedBorrow answers a borrow on a crowded limit (borrowsCrowded): the member
// decides again on its share, and borrows again once a reply says the pool holds permits.
var errCrowdedBorrow = errors.New("lease: no borrowing on a crowded limit (its members' shares are set by its allocator)")

// missesBeforeDirect is how many relayed requests in a row on a record go unanswered
// before the next goes to the record directly (and the one after to the relay again): a
// member the allocator does not know of (one the record dropped) learns so from the
// record itself. One direct request, not all: a pool whose allocator falls behind must
// not fall back on the colliding writes it is there to spare.
const missesBeforeDirect = 3

// answered records whether a request on id was answered: relayed (ok, or not: missed) or
// directly (ok).
func (r *relay) answered(id string, ok bool) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok {
		delete(r.misses, id)
	} else {
		if len(r.misses) >= maxRemembered {
			clear(r.misses)
		}
		r.misses[id]++
	}
}

// lastSeen returns the versions this member last saw of mailboxes ids (saw1), the store's
// clock less this process's as last read (sawClock), and whether every version is known.
func (r *relay) lastSeen(ids []string) ([]uint64, int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	vs := make([]uint64, len(ids))
	all := r.skewKnown
	for k, id := range ids {
		v, ok := r.boxes[id]
		vs[k], all = v, all && ok
	}
	return vs, r.skew, all
}

// saw1 records the version of a mailbox as read with its answer.
func (r *relay) saw1(id string, v uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.boxes) >= maxRemembered {
		clear(r.boxes)
	}
	r.boxes[id] = v
}

// sawClock records the store's clock less this process's.
func (r *relay) sawClock(skew int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.skew, r.skewKnown = skew, true
}

// forget drops what took learned of id's latency (a request went unanswered).
func (r *relay) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.lat, id)
}

// took records that a relayed request on id was read by its allocator d after it was
// posted (slot.Read: measured on the answer, not by when its member found it, which would
// grow with every later first read).
func (r *relay) took(id string, d time.Duration) {
	d = max(d, 0)
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.lat[id]; ok {
		d = (3*old + d) / 4
	} else if len(r.lat) >= maxRemembered {
		clear(r.lat)
	}
	r.lat[id] = d
}

// expect returns how long after posting on groups' records their member first reads its
// mailboxes: a tick more than the least time their allocator took lately to read a post
// (took: its answer is written a little after), at most eight ticks. Reading every tick from the
// post, a member whose allocator answers after several ticks (a thousand members: a
// tick's requests take it longer) read its mailbox as many times for each answer, and a
// thousand members' reads kept the store from the allocator's.
func (r *relay) expect(groups []*group) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := time.Duration(math.MaxInt64)
	for _, g := range groups {
		l, ok := r.lat[g.id]
		if !ok {
			return 0
		}
		d = min(d, l)
	}
	return min(d+r.tick, 8*r.tick) // one slow answer does not delay every later read long
}

// close stops the allocators and waits for them to resign.
func (r *relay) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	if !r.stopped {
		r.stopped = true
		close(r.stop)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// relayCalls posts the calls of groups (each call relayable, each member once per group)
// in their members' mailboxes and waits, until ctx ends, for the allocator's answers,
// which it puts in out. A call left unanswered gets backend.ErrUnavailable: its outcome is
// unknown, as a store call's that timed out. It returns an error only if the posts could
// not be made.
func (a *applier) relayCalls(ctx context.Context, calls []call, groups []*group, out []result) error {
	r := a.relay
	var ids []string
	var posts []int             // the call of each mailbox: ids[k] for posts[k]
	ballots := map[string]int{} // record ID → its ballot's index in ids
	limits := map[string]gcra.Limit{}
	recOf := map[int]string{} // call → its record ID
	for _, g := range groups {
		limits[g.id] = g.limit
		for _, i := range g.idx {
			recOf[i] = g.id
			ids = append(ids, mailboxID(g.id, calls[i].req.Member))
			posts = append(posts, i)
		}
	}
	nbox := len(ids)
	for _, g := range groups {
		ballots[g.id] = len(ids)
		ids = append(ids, ballotID(g.id))
	}
	// Post: read each mailbox's version and write the request over what it held. A
	// mailbox the allocator answered meanwhile is read and written again.
	todo := make([]int, nbox)
	for k := range todo {
		todo[k] = k
	}
	posted := make([]uint64, nbox) // the version of each post: until it changes, no answer
	// The first post writes over the versions this member last saw of its mailboxes
	// (relay.boxes: the allocator writes one only to answer what was posted, which the
	// member read), without reading them first; a post that loses reads them.
	known, skew, blind := r.lastSeen(ids[:nbox])
	for attempt := 0; len(todo) > 0; attempt++ {
		if attempt == MaxAttempts {
			for _, k := range todo {
				out[posts[k]] = result{err: fmt.Errorf("%w (%d attempts to post in a mailbox)", store.ErrConflict, MaxAttempts)}
			}
			break
		}
		var snap store.Snapshot
		if blind && attempt == 0 {
			snap = store.Snapshot{Now: a.now() + skew, Records: make([]store.Record, len(ids))}
			for k, v := range known {
				snap.Records[k].Version = v
			}
		} else {
			var err error
			if snap, err = a.load(ctx, ids); err != nil {
				return err
			}
			r.sawClock(snap.Now - a.now())
		}
		var writes []store.Write
		for _, k := range todo {
			writes = append(writes, store.Write{ID: ids[k], Data: marshalSlot(&slot{Req: r.postable(calls[posts[k]].req), Posted: snap.Now}),
				Version: snap.Records[k].Version, Keep: mailKeep})
		}
		var claimed []string
		if !blind || attempt > 0 {
			writes, claimed = a.claims(snap, ids, ballots, writes)
		}
		vers, err := a.swap(ctx, writes)
		if err != nil {
			return err
		}
		a.started(claimed, vers[len(todo):], limits)
		var again []int
		for j, k := range todo {
			if vers[j] == 0 {
				again = append(again, k)
			} else {
				r.saw1(ids[k], vers[j])
			}
			posted[k] = vers[j]
		}
		todo = again
	}
	// Wait for the answers: read the mailboxes every tick, the first time when answers
	// came on the last requests (relay.expect). A joiner that has posted in its mailbox
	// before knocks at its limit's door only if its join is not answered by the second
	// read: the allocator reads the mailboxes of the members it has seen lately
	// (allocate), so a member that joins again is answered without a knock. One that
	// never posted there (a first join) knocks at once: no allocator reads its mailbox
	// before (two reads of waiting were most of a first join's time through the relay).
	knocked, reads := false, 0
	var firstJoins []int
	for k := range nbox {
		if i := posts[k]; known[k] == 0 && calls[i].req.Op == allot.OpJoin && out[i].err == nil {
			firstJoins = append(firstJoins, i)
		}
	}
	atDoor := map[int]bool{} // the joins that knocked
	if len(firstJoins) > 0 && a.knock(ctx, calls, firstJoins) == nil {
		for _, i := range firstJoins {
			atDoor[i] = true // (one that failed knocks again at the second read)
		}
	}
	live := map[int]int64{}      // call → its limit's live members, as its answer says
	onBucket := map[int]bool{}   // call → its limit is on its bucket, as its answer says
	elected := map[string]bool{} // record ID → an allocator held its ballot at the last read
	var waiting []int
	for k := range nbox {
		if out[posts[k]].err == nil {
			waiting = append(waiting, k)
		}
	}
	for first := true; len(waiting) > 0; first = false {
		d := r.tick
		if first {
			d = max(r.tick, r.expect(groups))
			if dl, ok := ctx.Deadline(); ok {
				d = max(r.tick, min(d, time.Until(dl)/2)) // a read before the caller gives up
			}
		}
		if err := a.sleep(ctx, d); err != nil {
			break
		}
		snap, err := a.load(ctx, ids)
		if err != nil {
			continue // the store is unreachable for now: wait on, within ctx
		}
		r.sawClock(snap.Now - a.now())
		for rec, k := range ballots {
			bl, err := unmarshalBallot(snap.Records[k].Data)
			elected[rec] = err == nil && bl.Holder != "" && bl.Until > snap.Now
		}
		waiting = slices.DeleteFunc(waiting, func(k int) bool {
			i := posts[k]
			if snap.Records[k].Version == posted[k] {
				return false
			}
			s, err := unmarshalSlot(snap.Records[k].Data)
			if err != nil || s == nil || s.Req.Nonce != calls[i].req.Nonce || s.Answered != s.Req.Nonce {
				return false
			}
			r.saw1(ids[k], snap.Records[k].Version) // the answer to this post: the next posts over it
			switch {
			case s.Err != "" || s.Rep == nil:
				out[i] = result{err: answerErr(cmp.Or(s.Err, "no answer"))}
			default:
				r.took(recOf[i], time.Duration(s.Read-s.Posted))
				out[i] = result{rep: *s.Rep}
				if s.Rep.Live > 0 || s.Rep.Bucket != 0 {
					live[i] = s.Rep.Live
					onBucket[i] = s.Rep.Bucket != 0
				}
			}
			return true
		})
		if reads++; !knocked && reads >= 2 {
			knocked = true
			var joins []int
			for _, k := range waiting {
				if i := posts[k]; calls[i].req.Op == allot.OpJoin && !atDoor[i] {
					joins = append(joins, i)
				}
			}
			if len(joins) > 0 {
				// A knock that fails leaves the joins waiting: the allocator answers a
				// member it held lately without one, and the other requests have nothing
				// to do with it.
				_ = a.knock(ctx, calls, joins)
			}
		}
		if writes, claimed := a.claims(snap, ids, ballots, nil); len(writes) > 0 {
			if vers, err := a.swap(ctx, writes); err == nil {
				a.started(claimed, vers, limits)
			}
		}
	}
	for _, k := range waiting {
		r.forget(recOf[posts[k]]) // its answers' latency is no guide now
		out[posts[k]] = result{err: fmt.Errorf("%w: lease store: the allocator of the limit did not answer in time", backend.ErrUnavailable)}
	}
	for _, g := range groups {
		for _, i := range g.idx {
			// A request its allocator left unanswered counts towards going directly only
			// while no allocator holds the limit's ballot: a slow one still answers.
			r.answered(g.id, elected[g.id] || !errors.Is(out[i].err, backend.ErrUnavailable))
		}
		for _, i := range g.idx {
			if n, ok := live[i]; ok {
				r.saw(g.id, int(n), onBucket[i]) // a limit no longer crowded goes back to direct requests
				break
			}
		}
	}
	return nil
}

// claims appends to writes a claim of each ballot in snap (ballots: record ID → index in
// ids) that has ended, and returns the record IDs claimed, in order.
func (a *applier) claims(snap store.Snapshot, ids []string, ballots map[string]int, writes []store.Write) ([]store.Write, []string) {
	r := a.relay
	var claimed []string
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return writes, nil
	}
	for _, rec := range slices.Sorted(maps.Keys(ballots)) {
		k := ballots[rec]
		if r.allocs[rec] {
			continue
		}
		bl, err := unmarshalBallot(snap.Records[k].Data)
		if err != nil || (bl.Holder != "" && bl.Until > snap.Now) {
			continue
		}
		writes = append(writes, store.Write{ID: ids[k], Data: marshalBallot(ballot{Holder: r.self, Until: snap.Now + r.ballotTTL()}),
			Version: snap.Records[k].Version, Keep: time.Duration(4 * r.ballotTTL())})
		claimed = append(claimed, rec)
	}
	return writes, claimed
}

// started starts an allocator for each record whose ballot claim won (vers, in order).
func (a *applier) started(claimed []string, vers []uint64, limits map[string]gcra.Limit) {
	r := a.relay
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, rec := range claimed {
		if k >= len(vers) || vers[k] == 0 || r.stopped || r.allocs[rec] {
			continue
		}
		r.allocs[rec] = true
		r.wg.Add(1)
		go a.allocate(rec, limits[rec])
	}
}

// now is the applier's clock's time.
func (a *applier) now() int64 {
	if a.clock == nil {
		return clock.Default.Nanotime()
	}
	return a.clock.Nanotime()
}

func (a *applier) sleep(ctx context.Context, d time.Duration) error {
	c := a.clock
	if c == nil {
		c = clock.Default
	}
	return c.Sleep(ctx, d)
}

// allocate is the allocator of record rec: every tick it applies what the mailboxes hold,
// while it holds the ballot and until the relay stops or nothing comes for resignAfter.
func (a *applier) allocate(rec string, limit gcra.Limit) {
	r := a.relay
	defer r.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	var members []string            // the record's members, as last read, and those seen lately
	answered := map[string]uint64{} // mailbox → a version of it that holds nothing to apply
	seen := map[string]int64{}      // member → when the record last held it (store's clock)
	quiet := time.Duration(0)
	held := true
	for held && quiet < resignAfter {
		if a.sleep(ctx, r.tick) != nil {
			break
		}
		tctx, tcancel := context.WithTimeout(ctx, max(4*r.tick, 500*time.Millisecond))
		var busy, lost bool
		var err error
		// A write that lost to a member's own (a join, a take) is tried again at once.
		for try := 0; try == 0 || (lost && held && err == nil && try < 4); try++ {
			busy, held, lost, members, err = a.allocateOnce(tctx, rec, limit, members, answered, seen)
		}
		tcancel()
		switch {
		case err != nil:
			// The store is unreachable: the ballot runs out, and whoever reaches the store
			// next claims it.
		case busy:
			quiet = 0
		default:
			quiet += r.tick
		}
	}
	if held {
		a.resign(rec)
	}
	cancel()
	<-stopped
	r.mu.Lock()
	delete(r.allocs, rec)
	r.mu.Unlock()
}

// resign gives rec's ballot up, if this member still holds it.
func (a *applier) resign(rec string) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	snap, err := a.load(ctx, []string{ballotID(rec)})
	if err != nil {
		return
	}
	if bl, err := unmarshalBallot(snap.Records[0].Data); err != nil || bl.Holder != a.relay.self {
		return
	}
	_, _ = a.store.Swap(ctx, []store.Write{{ID: ballotID(rec), Version: snap.Records[0].Version}})
}

// allocateOnce reads rec, its ballot and the mailboxes of members (the record's members as
// last read), applies the requests not yet answered in the order they were posted, writes
// the record and the ballot, then the answers. busy says it applied something; held that
// it still holds the ballot; lost that its write of the record lost to another; it
// returns the record's members now.
func (a *applier) allocateOnce(ctx context.Context, rec string, limit gcra.Limit, members []string, answered map[string]uint64, seen map[string]int64) (busy, held, lost bool, _ []string, _ error) {
	r := a.relay
	const first = 2 + doorStripes // the first mailbox's index in ids
	ids := make([]string, 2, first+len(members))
	ids[0], ids[1] = rec, ballotID(rec)
	for k := range doorStripes {
		ids = append(ids, doorID(rec, k))
	}
	for _, m := range members {
		ids = append(ids, mailboxID(rec, m))
	}
	snap, err := a.load(ctx, ids)
	if err != nil {
		return false, true, false, members, err
	}
	now := snap.Now
	if n := snap.Records[0].Now; n != 0 {
		now = n
	}
	bl, err := unmarshalBallot(snap.Records[1].Data)
	if err != nil || bl.Holder != r.self {
		return false, false, false, members, err
	}
	renewBallot := store.Write{ID: ids[1], Data: marshalBallot(ballot{Holder: r.self, Until: now + r.ballotTTL()}),
		Version: snap.Records[1].Version, Keep: time.Duration(4 * r.ballotTTL())}
	// The joiners at its doors whose mailboxes it did not read: read them now, so that a
	// join is applied in the tick its knock is seen, not the next.
	var joiners []string
	var in map[string]bool
	for k := range doorStripes {
		if d, err := unmarshalDoor(snap.Records[2+k].Data); err == nil {
			for m := range d.Joining {
				if in == nil {
					in = make(map[string]bool, len(members))
					for _, m := range members {
						in[m] = true
					}
				}
				if !in[m] {
					in[m] = true
					joiners = append(joiners, m)
				}
			}
		}
	}
	if len(joiners) > 0 {
		members = slices.Clone(members)
		slices.Sort(joiners)
		boxes := make([]string, len(joiners))
		for k, m := range joiners {
			boxes[k] = mailboxID(rec, m)
		}
		if more, err := a.load(ctx, boxes); err == nil {
			ids = append(ids, boxes...)
			snap.Records = append(snap.Records, more.Records...)
			members = append(members, joiners...)
		}
	}
	// The requests not yet answered, oldest post first.
	type pend struct {
		k int // in ids
		s *slot
	}
	var pending []pend
	for k := first; k < len(ids); k++ {
		v := snap.Records[k].Version
		if v == 0 || answered[ids[k]] == v {
			continue // nothing new (a mailbox holds nothing to apply until its member posts)
		}
		s, err := unmarshalSlot(snap.Records[k].Data)
		if err == nil && s != nil && s.Answered != s.Req.Nonce && s.Req.Member == members[k-first] {
			pending = append(pending, pend{k, s})
		} else {
			answered[ids[k]] = v
		}
	}
	if len(answered) > 2*len(ids) {
		clear(answered) // members gone: read afresh
	}
	// next is the mailboxes to read at the next tick: the record's members', those it
	// held within seenKeep (one that joins again is answered without knocking), and the
	// joiners' at its doors, whom a door keeps until the record has them (or mailKeep);
	// and the writes of the doors that changed.
	next := func(st *allot.State) ([]string, []store.Write) {
		var ms []string
		in := map[string]bool{}
		if st != nil {
			for _, e := range st.Members {
				ms = append(ms, e.ID)
				in[e.ID] = true
				seen[e.ID] = now
			}
			for m, at := range seen {
				switch {
				case now-at > int64(seenKeep):
					delete(seen, m)
				case !in[m]:
					ms = append(ms, m)
				}
			}
		} else {
			ms = slices.Clone(members)
		}
		var ws []store.Write
		for k := range doorStripes {
			d, err := unmarshalDoor(snap.Records[2+k].Data)
			if err != nil {
				continue
			}
			changed := false
			for m, at := range d.Joining {
				if in[m] || now-at > int64(mailKeep) {
					delete(d.Joining, m)
					changed = true
				} else if _, lately := seen[m]; !lately || st == nil {
					if !slices.Contains(ms, m) {
						ms = append(ms, m)
					}
				}
			}
			if changed && st != nil {
				w := store.Write{ID: ids[2+k], Version: snap.Records[2+k].Version, Keep: mailKeep}
				if len(d.Joining) > 0 {
					w.Data = marshalDoor(d)
				}
				ws = append(ws, w)
			}
		}
		return ms, ws
	}
	slices.SortFunc(pending, func(x, y pend) int {
		return cmp.Or(cmp.Compare(x.s.Posted, y.s.Posted), strings.Compare(x.s.Req.Member, y.s.Req.Member))
	})
	calls := make([]call, len(pending))
	g := &group{id: rec, limit: limit, idx: make([]int, len(pending))}
	for i, p := range pending {
		calls[i] = call{limit: limit, req: p.s.Req}
		g.idx[i] = i
		g.seen = max(g.seen, p.s.Req.Seen)
	}
	st, serr := a.state(g, snap.Records[0], now, snap.Since)
	if len(pending) == 0 {
		members, _ = next(st)
		if bl.Until-now >= r.ballotTTL()/2 {
			return false, true, false, members, nil
		}
		vers, err := a.swap(ctx, []store.Write{renewBallot})
		if err != nil {
			return false, true, false, members, err
		}
		return false, vers[0] != 0, false, members, nil
	}
	staged := make([]result, len(calls))
	writes := []store.Write{renewBallot}
	if serr != nil {
		for i := range staged {
			staged[i] = result{err: serr}
		}
	} else {
		for i := range calls {
			rep, err := st.Apply(now, st.Cfg, calls[i].req)
			staged[i] = result{rep: rep, err: err}
		}
		w := store.Write{ID: rec, Version: snap.Records[0].Version}
		if !st.Idle(now) {
			w.Data = allot.MarshalState(st)
			w.Keep = time.Duration(max(st.QuietAt()-now, int64(time.Second)))
		}
		if !st.Idle(now) || snap.Records[0].Version != 0 {
			writes = append(writes, w)
		}
	}
	vers, err := a.swap(ctx, writes)
	if err != nil {
		return true, true, false, members, err
	}
	held = vers[0] != 0
	if len(vers) > 1 {
		if vers[1] == 0 {
			a.conflicts.Add(1)
			return true, held, true, members, nil // the record changed meanwhile (a member wrote it directly): next tick
		}
		for i := range staged {
			staged[i].rep.Version = vers[1]
		}
	}
	if serr != nil {
		st = nil
	}
	members, doors := next(st)
	// The answers, each in its mailbox unless the member posted a newer request meanwhile
	// (then its write loses, and the answer is of no use: the member reads only the newest).
	var answers []store.Write
	for i, p := range pending {
		s := *p.s
		s.Answered, s.Err, s.Read = s.Req.Nonce, errAnswer(staged[i].err), now
		if staged[i].err == nil {
			rep := staged[i].rep
			s.Rep = &rep
		}
		answers = append(answers, store.Write{ID: ids[p.k], Data: marshalSlot(&s), Version: snap.Records[p.k].Version, Keep: mailKeep})
	}
	answers = append(answers, doors...)
	avers, err := a.swap(ctx, answers)
	if err != nil {
		return true, held, false, members, err
	}
	for j := range pending {
		if avers[j] != 0 {
			answered[answers[j].ID] = avers[j]
		}
	}
	return true, held, false, members, nil
}
