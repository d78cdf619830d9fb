package allot

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gcra"
)

// Errors of the allocation core.
var (
	// ErrStaleEpoch: the member's registration is unknown to the store (it expired, was
	// replaced, or the store restarted empty); the member must join again.
	ErrStaleEpoch = errors.New("sluice lease: stale epoch")
	// ErrBadRequest: a request the core cannot apply (an unknown operation, no member name).
	ErrBadRequest = errors.New("sluice lease: bad request")
	// ErrInvalidConfig: a Config or MemberConfig that Validate refuses.
	ErrInvalidConfig = errors.New("sluice lease: invalid config")
)

// Policy says how the allocation divides a limit among its live members.
type Policy uint8

const (
	// Fair gives max-min fair shares of the members' reported demands: a member gets what
	// it asks for up to an equal split, and what others leave goes to those who want
	// more, so an idle member does not hold capacity a busy one needs. The default.
	Fair Policy = iota
	// Equal gives each of N live members limit/N, whatever their demand: the members
	// agree on N, and while they disagree the largest N anyone reports wins (conservative).
	Equal
)

func (p Policy) String() string {
	switch p {
	case Fair:
		return "fair"
	case Equal:
		return "equal"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy reads "fair" or "equal".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "fair":
		return Fair, nil
	case "equal":
		return Equal, nil
	}
	return 0, fmt.Errorf("%w: policy %q (want fair or equal)", ErrInvalidConfig, s)
}

// FenceAfterRestart is the end of the fence a store that restarted empty at restartedAt
// puts on every limit: until every lease it may have granted before has ended (TTL) and
// left quarantine (Grace).
func (c Config) FenceAfterRestart(restartedAt int64) int64 {
	return restartedAt + int64(c.TTL) + int64(c.Grace)
}

// Config is the store side's settings for every limit it allocates. Use DefaultConfig
// and change fields; Validate checks them.
type Config struct {
	// TTL is how long a lease lasts after the store receives the request that obtained
	// it; a member that stops renewing is judged dead after it (on the store's clock).
	TTL time.Duration
	// Grace is how long an expired lease stays quarantined (counted against the limit)
	// before its capacity is anyone else's: a member cut off from the store may run on its
	// expired lease that long (fail mode local, docs/concepts.md).
	Grace time.Duration
	// Policy divides the limit among live members.
	Policy Policy
	// JoinWindow: a fresh record (a limit nobody held before) with a burst above one grants
	// nothing for this long after it is made, so that members starting together share its
	// saved burst instead of the first to ask taking it all. Members joining in the window
	// are told when to come back. Zero turns it off.
	JoinWindow time.Duration
}

// DefaultConfig returns the default store settings.
func DefaultConfig() Config {
	return Config{
		TTL:    time.Second,            // four renewals at the members' default interval
		Grace:  500 * time.Millisecond, // two renewal intervals of fail-mode-local running
		Policy: Fair,                   // idle members do not hold capacity busy ones need
		// members that start together (a deploy, a demo) share the first burst
		JoinWindow: 50 * time.Millisecond,
	}
}

// Validate reports whether c can be used.
func (c Config) Validate() error {
	switch {
	case c.TTL <= 0:
		return fmt.Errorf("%w: TTL %v must be positive", ErrInvalidConfig, c.TTL)
	case c.Grace < 0:
		return fmt.Errorf("%w: Grace %v must not be negative", ErrInvalidConfig, c.Grace)
	case c.JoinWindow < 0:
		return fmt.Errorf("%w: JoinWindow %v must not be negative", ErrInvalidConfig, c.JoinWindow)
	case c.Policy > Equal:
		return fmt.Errorf("%w: unknown policy %d", ErrInvalidConfig, c.Policy)
	}
	return nil
}

// Epoch names one registration of a member: the incarnation of the record (drawn anew
// each time a store makes the record, NewIncarnation), and a sequence number within it.
// A renewal must carry its member's current epoch, so a store that lost or forgot a
// record can never mistake an old registration for a live one: epochs never repeat for
// a key.
type Epoch struct {
	Incarnation uint64 `json:"i"`
	N           uint64 `json:"n"`
}

// IsZero reports whether e names no registration.
func (e Epoch) IsZero() bool { return e == Epoch{} }

// Lease is the share a member holds, as the store records it.
type Lease struct {
	// Seq numbers the lease: it changes whenever the share does (a renewal that keeps the
	// share only extends it).
	Seq   uint64 `json:"seq"`
	Share Share  `json:"share"`
	// Expires is when the lease ends on the store's clock: TTL after the request that
	// obtained it arrived. A member whose lease expired is dead.
	Expires int64 `json:"exp"`
	// Until is when the lease stops counting against the limit: Expires + Grace.
	Until int64 `json:"until"`
}

// Entry is one member in a limit's State.
type Entry struct {
	ID    string `json:"id"`
	Epoch Epoch  `json:"epoch"`
	// Demand is the rate the member last reported wanting, in parts of RateScale (fair
	// policy); 0 wants nothing, RateScale wants as much as it can get.
	Demand int64 `json:"demand"`
	// Critical is the part of Demand its callers of the critical class asked, as last
	// reported (Request.Critical): the fair policy gives it first.
	Critical int64 `json:"critical,omitempty"`
	// Size is the pool size the member last reported using (equal policy's agreement).
	Size int64 `json:"size"`
	// Since is when the member last started holding a share, or waiting for one.
	Since int64 `json:"since"`
	// Wanted is when the member last reported wanting capacity.
	Wanted int64 `json:"wanted"`
	Lease  Lease `json:"lease"`
	// Held is the largest of the older leases the member may still be using (it has not
	// yet said it switched to Lease), counted until HeldUntil.
	Held      Share `json:"held"`
	HeldUntil int64 `json:"held_until"`
	// Retired is the share of an earlier registration under the same name (a restarted
	// process, or another one misconfigured with the same name), counted in addition until
	// RetiredUntil: whoever holds it may still be using it.
	Retired      Share `json:"retired"`
	RetiredUntil int64 `json:"retired_until"`
	// AliveUntil: its takes (a limit decided at the store) keep the member alive until
	// then, without a heartbeat; its share, if any, still ends with its lease.
	AliveUntil int64 `json:"alive_until"`
	// Chunk (a windowed quota) is the tokens of the current window handed to the member's
	// current registration and not given back; Nonce the newest request of the
	// registration applied (Request.Nonce): an older one that arrives late is stale.
	Chunk int64  `json:"chunk"`
	Nonce uint64 `json:"nonce"`
}

// own is what the member's current registration holds against the limit at now: it uses
// one lease at a time, so the largest of its current lease and the older ones it may
// still use.
func (e *Entry) own(now int64) Share {
	var c Share
	if now < e.Lease.Until {
		c = e.Lease.Share
	}
	if now < e.HeldUntil {
		c = maxShare(c, e.Held)
	}
	return c
}

// retired is what an earlier registration under the same name holds at now.
func (e *Entry) retired(now int64) Share {
	if now < e.RetiredUntil {
		return e.Retired
	}
	return Share{}
}

// counted is what the entry holds against the limit at now.
func (e *Entry) counted(now int64) Share { return e.own(now).add(e.retired(now)) }

// over reports whether nothing of the entry counts from now on: its lease, held and
// retired shares and liveness have all ended (advance drops it).
func (e *Entry) over(now int64) bool {
	return e.Lease.Until <= now && e.HeldUntil <= now && e.RetiredUntil <= now && e.AliveUntil <= now
}

// live reports whether the member is alive at now: registered, and its lease not expired.
func (e *Entry) live(now int64) bool {
	return !e.Epoch.IsZero() && (now < e.Lease.Expires || now < e.AliveUntil)
}

// State is the allocation of one limit: a small record, serializable as JSON, that a store
// keeps per limit and changes only through Apply, so that any store runs the same decision
// atomically. Its methods are not safe for concurrent
// use: the store serializes them.
//
// Invariant: at every instant, the shares counted against the limit (every member's
// lease until its quarantine ends, older leases a member may still use, and the whole
// limit while a restarted store's fence stands) sum to at most RateScale in rate and to
// at most the limit's burst in burst. Check verifies it.
type State struct {
	// Limit is the limit shared, in the GCRA core's units (after any margin).
	Limit gcra.Limit `json:"limit"`
	// Incarnation is drawn anew each time a store makes this record (NewIncarnation).
	Incarnation uint64 `json:"inc"`
	// Seq is the last epoch or lease number issued.
	Seq uint64 `json:"seq"`
	// Fence: the whole limit counts as held until then. A store that restarted empty
	// cannot know the leases it granted before, so it grants nothing until they have all
	// expired and passed quarantine (TTL + Grace).
	Fence int64 `json:"fence"`
	// Pool is the burst the unallocated capacity has saved up, in nanoseconds of the
	// limit's tolerance (permits × Limit.T), as of PoolAt. A fresh record starts with the
	// whole burst, as any new limiter does; freed capacity starts empty (its last holder
	// may have spent its burst at the API) and refills at the free rate. A member whose
	// share grows gets what the pool saved for the burst it gains (Reply.Fill).
	Pool   int64 `json:"pool"`
	PoolAt int64 `json:"pool_at"`
	// Penalty: a 429 asked the whole pool to hold back until then.
	Penalty int64 `json:"penalty"`
	// Open: a fresh record grants nothing before then (Config.JoinWindow).
	Open int64 `json:"open"`
	// Central: the limit is decided at the store (see Reply.Central). Takes draw on the
	// free capacity: at once from the Pool, or booked ahead: Booked is then when the free
	// capacity's rate is spoken for until (the time of the last permit booked), and the
	// Pool refills only after it.
	Central bool  `json:"central"`
	Booked  int64 `json:"booked"`
	// BucketAt, once not zero, is when the limit's permits began to be decided on its
	// bucket (a GCRA bucket in a store record of its own, store.BucketOp, named by
	// BucketID) rather than by takes of this record: a crowded limit decided at the store
	// (toBucket). The bucket is empty then. The record then only keeps its members, and
	// answers a take or a give with Reply.Bucket, which the member does at the bucket.
	BucketAt int64 `json:"bucket_at,omitempty"`
	// BucketInc names the bucket (BucketID): the record's incarnation when it moved to its
	// bucket, drawn anew with the record's when the record is found rewound (its bucket
	// may have lost writes too; the new one starts after the fence). BucketBusy is when
	// the members that last spoke to the record (each request applied) may have stopped
	// taking at the bucket and every permit they booked there has come (now + TTL +
	// Grace): the record is not Idle before it has also had a tolerance to refill, so that
	// a record made again (a fresh pool, no fence) never adds its burst to the bucket's.
	BucketInc  uint64 `json:"bucket_inc,omitempty"`
	BucketBusy int64  `json:"bucket_busy,omitempty"`
	// WindowEnd and Granted are a windowed quota's (Limit.Window > 0): the end of the
	// window the record counts in, on the store's clock (windows fall on whole multiples of
	// Limit.Window of Unix time), and the tokens handed out in it: never more than the
	// count (Limit.Burst()). Each member's part is its Entry.Chunk. A token handed out is
	// counted until the window ends unless its member gives it back: a member that
	// crashes holding tokens loses them for the window.
	WindowEnd int64 `json:"window_end"`
	Granted   int64 `json:"granted"`
	// RampStart is when a ramped limit's ramp (Limit.Ramp) began, on the store's clock:
	// when the record was made. It stays with the record, so members that come and go
	// (a restart) do not restart it.
	RampStart int64 `json:"ramp_start"`
	// Queue holds the members denied a take, in the order they first asked: a take is
	// granted to the first of them only, so that waiting members are served in turn (the
	// order is the store's, whatever their retries). A member that does not come back
	// within a TTL of the time it was told loses its place.
	Queue []Waiter `json:"queue"`
	// Members, sorted by ID.
	Members []Entry `json:"members"`
	// Cfg holds the settings the record was made with: every member's request is applied
	// with them, whatever the settings of the process that applies it, so that members
	// never disagree on TTL, Grace or the policy.
	Cfg Config `json:"cfg"`

	// prunedAt is when take last dropped the waiters that left (not part of the record).
	prunedAt int64
}

// pruneFrom is the length of the store's line from which take drops the waiters that
// left (whose registration ended) once an instant rather than at every take; a release
// leaves the line at once.
const pruneFrom = 32

// NewState returns the record of limit l made at now by a store of the given incarnation.
// fence is zero for a store that knows no lease of l was ever granted before (a new
// in-memory store): the record starts with the whole burst saved up, as any new limiter
// does. Otherwise (a store that restarted empty, a Redis key that vanished) fence is when
// every lease granted before has ended and passed quarantine (the restart + TTL +
// Grace): the whole limit counts as held until then, and its burst refills from then on.
// A windowed quota's record starts with its window's whole count, handed out once the
// fence has ended. A ramp starts at now.
func NewState(l gcra.Limit, incarnation uint64, now, fence int64, cfg Config) (*State, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if l.Window > 0 && l.Origin != 0 {
		return nil, fmt.Errorf("%w: a record's windows fall on the store's Unix time (Origin %d)", gcra.ErrInvalidLimits, l.Origin)
	}
	s := &State{Limit: l, Incarnation: incarnation, PoolAt: now, Cfg: cfg}
	if !l.Ramp.IsZero() {
		s.RampStart = now
	}
	if l.Window > 0 {
		// The count is whole, but a fenced record hands nothing out before the fence
		// ends: a member that drew tokens from the record it replaces says so meanwhile
		// (its renewals present the old record's incarnation and version), and the
		// window is then spent (SpendWindow).
		s.WindowEnd = l.WindowEnd(now)
	}
	if fence == 0 {
		s.Pool = l.Tau
		if !l.Ramp.IsZero() {
			// A ramp's first burst is the part of the burst its start rate is.
			b, _ := mulDiv(l.Burst(), s.rampPart(now), RateScale)
			s.Pool = max(1, b) * l.T
		}
		if l.Burst() > 1 { // a burst of one permit cannot be shared
			s.Open = now + int64(cfg.JoinWindow)
		}
	} else {
		s.Fence = fence
		s.PoolAt = min(now, fence)
	}
	return s, nil
}

// Waiter is a member waiting in a State's Queue, told to come back at At; it keeps its
// place until Until (callers come back late by their back-off's jitter).
type Waiter struct {
	ID    string `json:"id"`
	At    int64  `json:"at"`
	Until int64  `json:"until"`
}

// wait returns a waiter told at now to come back at at: it keeps its place a TTL and half
// its wait longer.
func wait(id string, now, at, ttl int64) Waiter {
	at = max(at, now)
	return Waiter{ID: id, At: at, Until: gcra.After(at, ttl+(at-now)/2)}
}

// Op is what a request asks of the store.
type Op uint8

const (
	// OpJoin registers the member (again): it gets a new epoch and a share from what is
	// free. A registration it had before is retired: its lease stays quarantined. On a
	// limit decided on its bucket it is a read, answered as a confirm (State.confirm).
	OpJoin Op = iota + 1
	// OpRenew renews the member's lease: it heartbeats, reports its demand and which lease
	// it uses, and gets its share as the policy has it now, grown only from what is free.
	OpRenew
	// OpRelease hands the share back: it is free once the member's pending
	// reservations (BusyFor) are done.
	OpRelease
	// OpPenalize holds the whole pool back for Hold (a 429 with Retry-After).
	OpPenalize
	// OpTake takes N permits of a store-decided limit (Reply.Central) from the free
	// capacity, at once or booked up to MaxDelay ahead: one round trip per decision, as
	// the strict mode on Redis'. It renews the member's liveness too.
	OpTake
	// OpGive gives back N permits taken and not used (a decision undone).
	OpGive
	// OpConfirm confirms that a member of a limit decided on its bucket (Reply.Bucket)
	// may go on taking there, and names the bucket the record is on. It is a read: it
	// changes the record only when the record's word on its bucket (State.BucketBusy)
	// runs short, about once every BucketKeep/2, or to drop expired entries, so the
	// members of a crowded limit keep their word on its bucket without writing the record
	// they would all collide on (State.confirm).
	OpConfirm
)

func (o Op) String() string {
	switch o {
	case OpJoin:
		return "join"
	case OpRenew:
		return "renew"
	case OpRelease:
		return "release"
	case OpPenalize:
		return "penalize"
	case OpTake:
		return "take"
	case OpGive:
		return "give"
	case OpConfirm:
		return "confirm"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Request is a member's message to the store about one limit.
type Request struct {
	Op     Op     `json:"op"`
	Member string `json:"member"`
	Epoch  Epoch  `json:"epoch"` // renew, release: the registration
	// InUse is the number of the oldest lease the member may still use: every older one is
	// done with. It lags the member's newest lease while permits it reserved under an
	// older one are still to be used.
	InUse  uint64 `json:"in_use"`
	Demand int64  `json:"demand"` // parts of RateScale wanted; RateScale: as much as it can get
	// Critical is the part of Demand its callers of the critical class ask (parts of
	// RateScale, fair policy): the policy gives the members' critical demand first.
	Critical int64 `json:"critical,omitempty"`
	Size     int64 `json:"size"` // equal policy: the pool size its share is based on
	// BusyFor (release): how long after sending the member may still use its lease (its
	// last reserved permit); the share is free after that.
	BusyFor int64 `json:"busy_for"`
	// Relinquish (renew): the member gave up its share before sending, all of it but Keep
	// permits of burst (a parked share, without rate); the
	// store frees the rest at once.
	Relinquish bool  `json:"relinquish"`
	Keep       int64 `json:"keep"`
	// Return: permits the member saved and gave up unspent with the capacity this request
	// frees (a relinquished share, older leases it says it no longer uses, a release), in
	// nanoseconds of the limit's tolerance (permits × Limit.T). The store adds them to
	// what the free capacity saved up; they are ignored if the request frees nothing.
	Return int64 `json:"return"`
	Hold   int64 `json:"hold"` // penalize: nanoseconds
	// N and MaxDelay (take, give): the permits, and how far ahead they may be booked.
	N        int64 `json:"n"`
	MaxDelay int64 `json:"max_delay"`
	// Seen is the newest version of the record the member has seen (Reply.Version) while
	// it may still use a share leased from it, 0 otherwise: a store whose record is older,
	// or missing, lost what it granted (a failover that lost writes, an old copy restored)
	// and must fence the limit.
	Seen uint64 `json:"seen"`
	// Borrow (take, give): the member borrows N permits from what the free capacity saved
	// up (or gives back permits it borrowed and did not use), for a decision its share
	// refused, on a limit that is shared out (not decided at the store): taken at once or
	// not at all, with no place in a queue, and its demand unchanged (it reports that at
	// its renewals).
	Borrow bool `json:"borrow"`
	// Want, Unused, UnusedOf and Got are a windowed quota's (join, renew, release): the
	// tokens the member asks for; those it gives up unused, with the end of the window
	// they are of (Reply.WindowEnd, the store's clock: tokens of another window are
	// void); and how many tokens of that window it has received under its registration
	// and keeps. The store hands back to the window what it handed the registration
	// beyond Got: tokens whose answer never arrived (lost, or too late: a member reads
	// the answer to its newest request only), which nobody can use.
	Want     int64 `json:"want"`
	Unused   int64 `json:"unused"`
	UnusedOf int64 `json:"unused_of"`
	Got      int64 `json:"got"`
	// Sent and Nonce are the member's own: the store echoes them in the reply.
	Sent  int64  `json:"sent"`
	Nonce uint64 `json:"nonce"`
}

// Reply is the store's answer to a request.
type Reply struct {
	Epoch Epoch `json:"epoch"`
	Lease struct {
		Seq   uint64 `json:"seq"`
		Share Share  `json:"share"`
	} `json:"lease"`
	// TTL and Grace are the store's: the member uses the lease until Sent + TTL - its
	// margin on its own clock, plus Grace if it cannot renew (fail mode local).
	TTL   int64 `json:"ttl"`
	Grace int64 `json:"grace"`
	// Fill is the burst the member's share gains full, in nanoseconds of the limit's
	// tolerance (permits × Limit.T), from what the free capacity saved up. The rest of a
	// new share starts drained.
	Fill int64 `json:"fill"`
	// Target is the share the policy wants the member to hold; it holds less while the
	// capacity is still held by others.
	Target Share `json:"target"`
	// Live is the number of live members; Size the pool size the share is based on (equal
	// policy: the member reports Live next time, so that members come to agree).
	Live int64 `json:"live"`
	Size int64 `json:"size"`
	// Penalty is how long the pool must still hold back (0: not at all).
	Penalty int64 `json:"penalty"`
	// RetryIn is, when the member holds less than its target, how long until capacity
	// that others hold frees (a quarantine or a fence ends); 0 if that is not known.
	RetryIn int64 `json:"retry_in"`
	// Contended says another live member is given less than it asks for (fair policy: the
	// limit cannot meet its demand, or the shares leave the reserve free and it borrows the
	// rest): a member that goes idle should give its share back at once
	// (Request.Relinquish), and permits are booked only a horizon ahead.
	Contended bool `json:"contended"`
	// Central says the limit is too small to share out (more members want it than it has
	// permits of burst, or a share would grant less than a permit per lease): nobody holds
	// a share, and members take each decision's permits at the store (OpTake).
	Central bool `json:"central"`
	// Bucket, if not zero, is the record's BucketAt: the limit is decided on its bucket
	// (named by BucketInc), where the member takes its permits (and gives them back)
	// while it is registered.
	Bucket    int64  `json:"bucket,omitempty"`
	BucketInc uint64 `json:"bucket_inc,omitempty"`
	// Word answers a confirm (OpConfirm): the member may take at the bucket until Sent +
	// Word less its margin (its own clock), where an answer that registers it says
	// Sent + TTL. It is at most TTL, less when the record's word on its bucket
	// (State.BucketBusy) ends sooner.
	Word int64 `json:"word,omitempty"`
	// Taken and Wait answer a take: granted (usable after Wait), or not (ask again after
	// Wait: the same take would be granted then). Borrow says the take was a borrow
	// (Request.Borrow) on a limit that is shared out.
	Taken  bool  `json:"taken"`
	Wait   int64 `json:"wait"`
	Borrow bool  `json:"borrow"`
	// Quota, WindowEnd, WindowLeft and Remaining answer a windowed quota's join or
	// renewal: the tokens handed to the member now, the end of the window they are of
	// (the store's clock) and how long until then, and what the window has left after.
	Quota      int64 `json:"quota"`
	WindowEnd  int64 `json:"window_end"`
	WindowLeft int64 `json:"window_left"`
	Remaining  int64 `json:"remaining"`
	// Pool and Free say what the free capacity (the limit less every share counted) had
	// saved up after this request, in nanoseconds of the limit's tolerance, and its rate and
	// burst: a member borrows (Request.Borrow) only while it expects the pool to hold a
	// permit. While the store keeps a reserve for critical callers, a member without
	// critical demand is told what it may borrow: the pool and burst beyond the floor it
	// must leave, and no rate.
	Pool int64 `json:"pool"`
	Free Share `json:"free"`
	// Version is the record's version after this request (the store fills it in), which
	// the member presents as Request.Seen from then on.
	Version uint64 `json:"version"`
	Sent    int64  `json:"sent"`
	Nonce   uint64 `json:"nonce"`
}

// Apply applies one request at now (the store's clock, nanoseconds) with the store's
// settings, and returns the reply. It is the only way the record changes, and it is
// deterministic: the same record, now, settings and request give the same result. A
// clock that steps back is treated as standing still.
func (s *State) Apply(now int64, cfg Config, req Request) (Reply, error) {
	var a applied
	return s.apply(now, cfg, req, &a)
}

// ApplyChecked is Apply followed by Check at now, whose error it returns as check: for a
// store that checks the invariant after every request (the simulator), without Check's
// pass over every member (Apply knows what they hold).
func (s *State) ApplyChecked(now int64, cfg Config, req Request) (rep Reply, err, check error) {
	var a applied
	rep, err = s.apply(now, cfg, req, &a)
	if now < s.PoolAt { // the clock stepped back: Apply stood still
		return rep, err, s.Check(now)
	}
	c := a.rest
	if i, ok := s.find(a.id); a.id != "" && ok {
		c = c.add(s.Members[i].counted(now))
	}
	return rep, err, s.check(now, c)
}

// applied is what apply tells ApplyChecked: what the members other than id (the one the
// request is about, if any) hold against the limit at now; only id's entry changes after
// they are summed.
type applied struct {
	rest Share
	id   string
}

func (s *State) apply(now int64, cfg Config, req Request, a *applied) (Reply, error) {
	now = max(now, s.PoolAt)
	if req.Op == OpConfirm || s.OnBucket() && ReadOnBucket(req.Op) {
		a.rest = s.counted(now)
		return s.confirm(now, cfg, req)
	}
	if s.BucketAt != 0 {
		s.BucketBusy = max(s.BucketBusy, gcra.After(now, int64(cfg.TTL+cfg.Grace)))
	}
	counted := s.advance(now)
	a.rest = counted
	s.roll(now)
	if s.Limit.Window > 0 && req.Seen > 0 && !req.Epoch.IsZero() && req.Epoch.Incarnation != s.Incarnation {
		// A member holds tokens drawn in this window from a record this one replaced (the
		// store lost it): how many that one handed out is unknown.
		s.SpendWindow(now)
	}
	rep := Reply{Sent: req.Sent, Nonce: req.Nonce, TTL: int64(cfg.TTL), Grace: int64(cfg.Grace)}
	switch req.Op {
	case OpPenalize:
		if req.Hold > 0 {
			s.Penalty = max(s.Penalty, gcra.After(now, req.Hold))
		}
		rep.Penalty = max(0, s.Penalty-now)
		rep.Bucket, rep.BucketInc = s.BucketAt, s.BucketInc // the member holds the bucket back too
		return rep, nil
	case OpJoin, OpRenew, OpRelease, OpTake, OpGive:
	default:
		return Reply{}, fmt.Errorf("%w: operation %d", ErrBadRequest, req.Op)
	}
	if req.Member == "" {
		return Reply{}, fmt.Errorf("%w: no member name", ErrBadRequest)
	}
	i, found := s.find(req.Member)
	// What the members other than i hold against the limit: only entry i changes from
	// here to its grant.
	others := counted
	if found {
		others = others.diff(s.Members[i].counted(now))
	}
	a.rest, a.id = others, req.Member
	switch req.Op {
	case OpJoin:
		if found {
			s.retire(i, now)
		} else {
			s.Members = slices.Insert(s.Members, i, Entry{ID: req.Member})
		}
		e := &s.Members[i]
		s.Seq++
		e.Epoch = Epoch{Incarnation: s.Incarnation, N: s.Seq}
		e.Lease = Lease{}
		e.Since = now
	case OpRenew:
		if !found || s.Members[i].Epoch != req.Epoch {
			return Reply{}, fmt.Errorf("%w: member %q epoch %d/%d", ErrStaleEpoch, req.Member, req.Epoch.Incarnation, req.Epoch.N)
		}
		e := &s.Members[i]
		freed := false
		switch {
		case req.Relinquish:
			// It keeps Keep permits of the lease it uses, which may be an older one than
			// the newest (whose answer it has not had): what it owns counts them.
			own := e.own(now)
			freed = !own.IsZero()
			e.Held, e.HeldUntil = Share{}, 0
			e.Lease.Share = Share{Burst: min(max(req.Keep, 0), own.Burst)}
		case req.InUse >= e.Lease.Seq:
			// It uses the newest lease: the older ones are done.
			freed = now < e.HeldUntil && !e.Held.IsZero()
			e.Held, e.HeldUntil = Share{}, 0
		}
		if freed {
			s.giveBack(now, req.Return)
		}
	case OpRelease:
		if found && s.Members[i].Epoch == req.Epoch {
			// It leaves the store's line too, at once (take drops the waiters that
			// left once an instant).
			s.Queue = slices.DeleteFunc(s.Queue, func(w Waiter) bool { return w.ID == req.Member })
			s.unused(i, req)
			if s.release(i, now, max(0, req.BusyFor)) {
				s.giveBack(now, req.Return)
			}
		}
		return rep, nil
	case OpTake, OpGive:
		if s.Limit.Window > 0 {
			return Reply{}, fmt.Errorf("%w: %v on a windowed quota (its members draw tokens)", ErrBadRequest, req.Op)
		}
		if !found || s.Members[i].Epoch != req.Epoch {
			return Reply{}, fmt.Errorf("%w: member %q epoch %d/%d", ErrStaleEpoch, req.Member, req.Epoch.Incarnation, req.Epoch.N)
		}
		if err := s.badCount(req); err != nil {
			return Reply{}, err
		}
		if req.Borrow && !s.Central {
			rep.Borrow = true
			committed := counted // no entry changed since advance: what it counted at now
			if now < s.Fence {
				committed = s.capacity(now)
			}
			floor := s.criticalFloor(now, cfg, i, committed)
			switch {
			case req.Op == OpGive:
				s.giveBack(now, gcra.MulSat(req.N, s.Limit.T))
			case req.MaxDelay < 0:
				s.charge(now, req.N) // a settlement up: the permits were used already
				rep.Taken = true
			default:
				s.borrow(now, req.N, floor, &rep)
			}
			s.hintWith(now, committed, floor, &rep)
			return rep, nil
		}
		e := &s.Members[i]
		e.Demand, e.Wanted = RateScale, now // it asks: it wants as much as it can get
		s.updateCentral(now, cfg)           // is the limit still too small to share out?
		rep.Central = s.Central
		if s.BucketAt != 0 {
			// Moved to its bucket just now (a record on it names it: confirm).
			rep.Bucket, rep.BucketInc = s.BucketAt, s.BucketInc // the member does it at the bucket
			e.AliveUntil = max(e.AliveUntil, now+int64(cfg.TTL))
			return rep, nil
		}
		if req.Op == OpGive {
			s.giveBack(now, req.N*s.Limit.T)
			return rep, nil
		}
		// A take is booked at most TTL + Grace ahead, as long as a lease may be used: a
		// store that loses the record meanwhile fences the limit that long, so the permits
		// it grants after never crowd one booked before.
		if req.MaxDelay < 0 {
			s.charge(now, req.N) // a settlement up: the permits were used already
			rep.Taken = true
			return rep, nil
		}
		e.AliveUntil = max(e.AliveUntil, now+int64(cfg.TTL))
		s.take(now, req.Member, req.N, min(req.MaxDelay, int64(cfg.TTL+cfg.Grace)), int64(cfg.TTL), &rep)
		// A take keeps its member alive until it comes back (after the wait it was told)
		// and a TTL more: members of a limit decided at the store need no heartbeat.
		e.AliveUntil = max(e.AliveUntil, gcra.After(now+int64(cfg.TTL), rep.Wait))
		return rep, nil
	}
	if s.Limit.Window > 0 {
		s.quota(i, now, cfg, req, &rep)
		return rep, nil
	}
	e := &s.Members[i]
	e.Demand = min(max(req.Demand, 0), RateScale)
	e.Critical = min(max(req.Critical, 0), e.Demand)
	e.Size = max(req.Size, 0)
	if cfg.Policy == Equal || e.Demand > 0 {
		if e.Lease.Share.Rate == 0 && now-e.Wanted > int64(cfg.TTL) {
			e.Since = now // a new wait: it wanted nothing for a while (short gaps keep its place)
		}
		e.Wanted = now
	}
	e.Lease.Expires = now + int64(cfg.TTL) // alive: it just spoke (grant sets Until to match)
	s.grant(i, now, cfg, others, &rep)
	return rep, nil
}

// badCount refuses a take or give of a negative count, or of more permits than the burst
// that is not a settlement (MaxDelay < 0: permits used already).
func (s *State) badCount(req Request) error {
	if req.N < 0 || (req.N > s.Limit.Burst() && req.MaxDelay >= 0) {
		return fmt.Errorf("%w: %d permits of a burst of %d", ErrBadRequest, req.N, s.Limit.Burst())
	}
	return nil
}

// find returns the index of member id, or where it would be inserted.
func (s *State) find(id string) (int, bool) {
	return slices.BinarySearchFunc(s.Members, id, func(e Entry, id string) int { return strings.Compare(e.ID, id) })
}

// retire ends entry i's registration before a new one under the same name: what it holds
// stays counted, beside whatever the new registration gets, until its quarantine ends
// (whoever holds it may still be using it).
func (s *State) retire(i int, now int64) {
	e := &s.Members[i]
	if c := e.counted(now); !c.IsZero() {
		e.Retired = c
		e.RetiredUntil = max(e.Lease.Until, e.HeldUntil, e.RetiredUntil)
	}
	e.Held, e.HeldUntil = Share{}, 0
}

// giveBack adds permits a member gave up unspent to what the free capacity saved up, as
// far as the free burst goes.
//
// While takes are booked ahead (Booked is in the future), nothing is given back: permits
// given back would let the next take in ahead of those booked, crowding them, as a refund
// by any but the newest grant does in GCRA (see gcra.Adjust). They are lost instead,
// which is safe.
func (s *State) giveBack(now, ret int64) {
	if ret <= 0 || s.Booked > now {
		return
	}
	free := s.capacity(now).sub(s.Committed(now))
	s.Pool = min(s.Pool+min(ret, gcra.MaxTau), free.Burst*s.Limit.T)
}

// release frees entry i's share once its pending reservations are done (busy), and
// removes it when nothing of it counts any more. It reports whether the share was freed
// at once.
func (s *State) release(i int, now, busy int64) bool {
	e := &s.Members[i]
	end := min(now+busy, max(e.Lease.Until, e.HeldUntil))
	c := e.own(now)
	if !c.IsZero() && end > now {
		e.Held, e.HeldUntil = c, end
	} else {
		e.Held, e.HeldUntil = Share{}, 0
	}
	e.Epoch = Epoch{}
	e.Lease = Lease{Seq: e.Lease.Seq, Expires: now, Until: now}
	freed := !c.IsZero() && e.HeldUntil <= now
	if freed && e.RetiredUntil <= now {
		s.Members = slices.Delete(s.Members, i, i+1)
	}
	return freed
}

// capacity is the whole limit as a share at now: all of it, or while a ramp runs, the part
// of its rate the ramp has reached (rounded down) and the whole burst. The burst is not
// ramped (each member that holds a share needs a permit of it, and members too many for
// the burst are decided at the store): a ramp's first burst is, from the fresh record's
// saved burst (NewState). It never shrinks as now grows, so shares granted within it stay
// within it.
func (s *State) capacity(now int64) Share {
	return Share{Rate: s.rampPart(now), Burst: s.Limit.Burst()}
}

// rampPart is the part of RateScale the limit's rate has reached at now (Limit.Ramp):
// from T/T0 at RampStart, rising linearly to all of it over Ramp.Over.
func (s *State) rampPart(now int64) int64 {
	r := s.Limit.Ramp
	if r.IsZero() || now-s.RampStart >= r.Over {
		return RateScale
	}
	start, _ := mulDiv(RateScale, s.Limit.T, r.T0)
	rise, _ := mulDiv(RateScale-start, max(now-s.RampStart, 0), r.Over)
	return min(start+rise, RateScale)
}

// Committed returns the sum of the shares counted against the limit at now (the whole
// limit while a fence stands).
func (s *State) Committed(now int64) Share {
	if now < s.Fence {
		return s.capacity(now)
	}
	return s.counted(now)
}

// counted is the sum of the members' shares counted against the limit at now.
func (s *State) counted(now int64) Share {
	var c Share
	for i := range s.Members {
		c = c.add(s.Members[i].counted(now))
	}
	return c
}

// Check verifies the invariant at now: the counted shares sum to at most the limit in rate
// and in burst, and the pool holds no more than the free burst.
func (s *State) Check(now int64) error { return s.check(now, s.counted(now)) }

// check is Check with the shares counted at now.
func (s *State) check(now int64, c Share) error {
	capa := s.capacity(now)
	if !c.Fits(capa) {
		return fmt.Errorf("sluice lease: leases sum to rate %d/%d burst %d/%d", c.Rate, RateScale, c.Burst, capa.Burst)
	}
	if now >= s.PoolAt {
		committed := c
		if now < s.Fence {
			committed = capa
		}
		free := capa.sub(committed)
		if s.Pool > free.Burst*s.Limit.T {
			return fmt.Errorf("sluice lease: pool %d above the free burst %d", s.Pool, free.Burst*s.Limit.T)
		}
	}
	return s.checkQuota()
}

// advance brings the pool up to now: the free capacity refills it, piece by piece between
// the instants at which held capacity is freed (a quarantine ends, an older lease stops
// counting, a fence falls), and entries with nothing left counting are removed. It returns
// the shares counted against the limit at now.
//
// One pass over the members finds the instants in (PoolAt, now] and what each entry
// stops counting at each, and removes the entries done with: refill changes neither the
// instants nor what counts, so the sums between them follow from those steps (a pass per
// instant cost a large pool a pass over every member per renewal that ended since the
// last request).
func (s *State) advance(now int64) Share {
	from := s.PoolAt
	sc := scratchPool.Get().(*scratch)
	steps := sc.steps[:0]
	if s.Fence > from && s.Fence <= now {
		steps = append(steps, freeing{at: s.Fence})
	}
	var counted Share // at from
	kept := 0
	for i := range s.Members {
		e := &s.Members[i]
		prev := e.counted(from)
		counted = counted.add(prev)
		lu, hu, ru := e.Lease.Until, e.HeldUntil, e.RetiredUntil
		if lu > from && lu <= now || hu > from && hu <= now || ru > from && ru <= now {
			// The entry's instants in (from, now], in order, and what it stops counting
			// at each.
			ts := [3]int64{lu, hu, ru}
			slices.Sort(ts[:])
			for _, t := range ts {
				if t > from && t <= now {
					c := e.counted(t)
					steps = append(steps, freeing{at: t, d: prev.diff(c)})
					prev = c
				}
			}
		}
		// Ended older and retired leases are cleared (a later merge must not revive them),
		// and entries with nothing left counting removed.
		if hu <= now && (hu != 0 || !e.Held.IsZero()) {
			e.Held, e.HeldUntil = Share{}, 0
		}
		if ru <= now && (ru != 0 || !e.Retired.IsZero()) {
			e.Retired, e.RetiredUntil = Share{}, 0
		}
		if e.over(now) {
			continue
		}
		if kept != i {
			s.Members[kept] = *e
		}
		kept++
	}
	clear(s.Members[kept:]) // as slices.DeleteFunc leaves the tail
	s.Members = s.Members[:kept]
	slices.SortFunc(steps, func(a, b freeing) int { return cmp.Compare(a.at, b.at) })
	for k := 0; k < len(steps); {
		t := steps[k].at
		s.refill(t, counted) // what counts at PoolAt
		for ; k < len(steps) && steps[k].at == t; k++ {
			counted = counted.diff(steps[k].d)
		}
	}
	s.refill(now, counted)
	sc.steps = steps
	scratchPool.Put(sc)
	if s.Penalty <= now {
		s.Penalty = 0
	}
	return counted
}

// freeing is what the members stop counting against the limit at an instant.
type freeing struct {
	at int64
	d  Share
}

// refill moves PoolAt to t, adding what the free capacity saved up: the limit less what
// is committed at PoolAt, counted (the members' shares counted then; the whole limit
// while a fence stands).
func (s *State) refill(t int64, counted Share) {
	if t <= s.PoolAt {
		return
	}
	committed := counted
	if s.PoolAt < s.Fence {
		committed = s.capacity(s.PoolAt)
	}
	free := s.capacity(s.PoolAt).sub(committed)
	dt := min(t-max(s.PoolAt, s.Booked), 1<<42) // about 73 minutes: more can only fill the pool
	if free.Rate > 0 && dt > 0 {                // the rate booked ahead refills nothing until then
		gain, _ := mulDiv(dt, free.Rate, RateScale)
		s.Pool = min(s.Pool+gain, gcra.MaxTau)
	}
	s.Pool = min(s.Pool, free.Burst*s.Limit.T)
	s.PoolAt = t
}

// grant gives entry i its share for now: the policy's target, grown only from what is
// free. The lease it had before keeps counting until the member says it switched (or it
// ends), so a share that shrinks frees nothing before the member has stopped using it.
//
// rest is what the members other than i hold against the limit at now.
func (s *State) grant(i int, now int64, cfg Config, rest Share, rep *Reply) {
	targets, live, size, short := s.targets(now, cfg)
	defer putTargets(targets)
	e := &s.Members[i]
	// Whether another live member is given less than it asks for: member i's own lease,
	// the only one that changes here, does not count.
	if e.live(now) && targets[i].Rate < e.Demand {
		short--
	}
	isContended := func() bool { return short > 0 }
	target := targets[i]
	others := e.retired(now).add(rest)
	if now < s.Fence {
		others = s.capacity(now)
	}
	avail := s.capacity(now).sub(others)
	if now < s.Open {
		avail = Share{} // the join window: members starting together share the first burst
	}
	if now < s.Booked {
		avail = Share{} // the free capacity's rate is spoken for by takes booked until then
	}
	before := e.own(now)
	n := minShare(target, avail).normalize(s.Limit)
	if c := e.Lease.Share; cfg.Policy == Fair && !s.Central && c.Rate > 0 && n.Rate > 0 && c.Burst == n.Burst &&
		c.Rate*8 >= n.Rate*7 && c.Rate*8 <= n.Rate*9 && c.Fits(avail) && now < e.Lease.Until && !isContended() {
		// Within an eighth of the target while every demand is met: the lease stays as it
		// is. Demand measured over a few renewals moves by a few percent each time, and a
		// share that changed at every renewal would cost an acknowledgement each time.
		n = c
	}
	holding := e.Lease.Share.Rate > 0
	if n != e.Lease.Share || e.Lease.Seq == 0 {
		if e.Lease.Until > now && !e.Lease.Share.IsZero() {
			e.Held = maxShare(e.Held, e.Lease.Share)
			e.HeldUntil = max(e.HeldUntil, e.Lease.Until)
		}
		s.Seq++
		e.Lease.Seq = s.Seq
		e.Lease.Share = n
	}
	if holding != (n.Rate > 0) {
		e.Since = now
	}
	e.Lease.Expires = now + int64(cfg.TTL)
	e.Lease.Until = e.Lease.Expires + int64(cfg.Grace)
	after := e.own(now)
	if gained := after.Burst - before.Burst; gained > 0 {
		rep.Fill = min(s.Pool, gained*s.Limit.T)
		s.Pool -= rep.Fill
	}
	s.Pool = min(s.Pool, s.capacity(now).sub(others.add(after)).Burst*s.Limit.T)

	committed := others.add(after) // every member's, i's as it is now
	if now < s.Fence {
		committed = s.capacity(now)
	}
	s.hintWith(now, committed, s.criticalFloor(now, cfg, i, committed), rep)
	rep.Epoch = e.Epoch
	rep.Lease.Seq = e.Lease.Seq
	rep.Lease.Share = n
	rep.Target = target
	rep.Live, rep.Size = live, size
	rep.Penalty = max(0, s.Penalty-now)
	rep.Central, rep.Bucket, rep.BucketInc = s.Central, s.BucketAt, s.BucketInc
	if cfg.Policy == Fair {
		rep.Contended = isContended()
	}
	switch {
	case !target.Fits(n):
		rep.RetryIn = s.nextFree(i, now)
	}
}

// borrow takes n permits at once from what the free capacity saved up, for a member whose
// share refused them (Request.Borrow), or none: a borrow is never booked ahead, and waits
// in no queue. The pool is the free capacity's bucket, so taking from it is as safe as any
// take: tokens move from the pool to the member, which uses them at once. The pool keeps
// floor (nanoseconds of the limit's tolerance) for critical callers (criticalFloor).
func (s *State) borrow(now, n, floor int64, rep *Reply) {
	need := gcra.MulSat(n, s.Limit.T)
	if now < s.Open || s.Booked > now || s.Penalty > now || s.Pool < gcra.AddSat(need, floor) {
		return
	}
	s.Pool -= need
	rep.Taken = true
}

// hintWith tells a member what the free capacity saved up and at what rate it refills
// (committed is what the shares hold at now), so that it borrows only when a permit is
// likely there. A member that must leave floor in the pool (criticalFloor) is told what
// the pool holds beyond it, and no rate: the reserve's rate is the critical callers'.
func (s *State) hintWith(now int64, committed Share, floor int64, rep *Reply) {
	rep.Free = s.capacity(now).sub(committed)
	rep.Pool = s.Pool
	if floor > 0 {
		rep.Pool = max(0, rep.Pool-floor)
		rep.Free = Share{Burst: max(0, rep.Free.Burst-floor/s.Limit.T)}
	}
	if now < s.Open || s.Booked > now || s.Penalty > now || s.Central {
		// Nothing to borrow: the join window, takes booked ahead, a penalty.
		rep.Pool, rep.Free = 0, Share{}
	}
}

// nextFree returns how long until capacity held by a member other than i (a quarantine,
// an older lease) or by the fence frees, or 0 if none will by itself.
func (s *State) nextFree(i int, now int64) int64 {
	next := int64(0)
	consider := func(t int64) {
		if t > now && (next == 0 || t < next) {
			next = t
		}
	}
	consider(s.Fence)
	consider(s.Open)
	if i >= 0 {
		consider(s.Members[i].RetiredUntil)
	}
	for j := range s.Members {
		if j == i {
			continue
		}
		e := &s.Members[j]
		consider(e.HeldUntil)
		consider(e.RetiredUntil)
		if !e.live(now) {
			consider(e.Lease.Until)
		}
	}
	if next == 0 {
		return 0
	}
	return next - now
}

// Clone returns a deep copy of s.
func (s *State) Clone() *State {
	c := *s
	c.Members = slices.Clone(s.Members)
	return &c
}

// Idle reports whether the record, at now, is the same as no record: no member, no
// penalty or fence in force, and its pool full. A store may then forget it: a record made
// again starts the same (with a new incarnation, so no old registration is taken for a
// new one).
func (s *State) Idle(now int64) bool {
	return len(s.Members) == 0 && s.Penalty <= now && now >= s.Fence && s.Pool >= s.Limit.Tau && now >= s.Open && s.Booked <= now && len(s.Queue) == 0 &&
		now >= gcra.After(s.BucketBusy, s.Limit.Tau) &&
		(s.Granted == 0 || now >= s.WindowEnd)
}

// QuietAt is when the record becomes Idle at the latest if no request comes: every lease
// and quarantine it counts has ended, every penalty and fence too, and its pool has had
// the time to refill at the whole limit's rate.
func (s *State) QuietAt() int64 {
	t := max(s.Fence, s.Penalty, s.Open, s.PoolAt, s.Booked, s.BucketBusy)
	if !s.Limit.Ramp.IsZero() {
		t = max(t, gcra.AddSat(s.RampStart, s.Limit.Ramp.Over)) // the pool refills at the full rate only then
	}
	if s.Granted > 0 {
		t = max(t, s.WindowEnd) // tokens handed out count until their window ends
	}
	for _, e := range s.Members {
		t = max(t, e.Lease.Until, e.Lease.Expires+int64(s.Cfg.Grace), e.HeldUntil, e.RetiredUntil, e.AliveUntil)
	}
	return gcra.After(t, s.Limit.Tau)
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

// take takes n permits from the free capacity (a store-decided limit): at once if the pool
// holds them, else booked for when the free rate will have refilled it, if that is within
// maxDelay and after any penalty.
//
// atOnce: a take that may not wait (maxDelay 0: Allow's) and is refused takes no place in
// the store's line. A place is a waiter expected back at its turn, and the permits free
// then are kept for it; a caller that does not wait comes back at its own pace, if at all,
// and with more of them in line than the burst holds permits, every take behind them was
// refused while the pool refilled and overflowed (TestTakesAtOnceUseTheRate: 24 members of
// 10/s burst=5 asking 150% of it through Allow, 8.25 permits a second). Such takes compete
// as they come, as in the strict mode; the callers that wait keep their places.
func (s *State) take(now int64, id string, n, maxDelay, ttl int64, rep *Reply) {
	free := s.capacity(now).sub(s.Committed(now))
	need := n * s.Limit.T
	if n > free.Burst || (need > s.Pool && free.Rate == 0) {
		// Shares still counted hold the burst or the rate: ask again when they free.
		rep.Wait = max(s.nextFree(-1, now), int64(time.Millisecond))
		return
	}
	// Waiters that left, or did not come back in time, lose their place: once an instant
	// (a look-up of every waiter among the members, the take's whole cost on a line of a
	// thousand; a waiter that leaves within an instant of takes keeps its place until the
	// next, which only holds the takes behind it back).
	if s.prunedAt != now || len(s.Queue) < pruneFrom {
		s.prunedAt = now
		s.Queue = slices.DeleteFunc(s.Queue, func(w Waiter) bool {
			i, ok := s.find(w.ID)
			return !ok || !s.Members[i].live(now) || now > w.Until
		})
	}
	pos := slices.IndexFunc(s.Queue, func(w Waiter) bool { return w.ID == id })
	free0 := s.Booked <= now && s.Penalty <= now && s.Pool >= need
	if len(s.Queue) > 0 && pos != 0 && free0 && s.Pool >= gcra.MulSat(s.expected(now, pos)+1, need) {
		// The pool holds more than the waiters before this one that are still expected
		// will take (a waiter is late by its back-off's jitter, or gone; or they were told
		// turns at a rate that has grown since): the permit free now goes to whoever asks,
		// rather than waste, in the line's order (one behind waiters still expected does
		// not pass them); the waiters keep their places.
		if pos > 0 {
			s.Queue = slices.Delete(s.Queue, pos, pos+1)
		}
		s.Pool -= need
		rep.Taken = true
		return
	}
	if len(s.Queue) > 0 && pos < 0 && maxDelay == 0 {
		// Others wait before it, and it does not wait (Allow's): it is refused, and takes no
		// place in line (atOnce), told when a slot after theirs comes.
		at := s.turn(now, need, int64(len(s.Queue)), free)
		rep.Wait = max((at-now)*3/4, int64(time.Millisecond))
		return
	}
	if len(s.Queue) > 0 && pos != 0 {
		// Others wait before it: it comes after them, one slot each.
		if pos < 0 {
			pos = len(s.Queue)
			s.Queue = append(s.Queue, Waiter{ID: id})
		}
		at := s.turn(now, need, int64(pos), free)
		// It is told to come back a little before its turn (callers come back late by their
		// back-off's jitter, in proportion to the wait), and told again then.
		back := now + (at-maxDelay-now)*3/4
		s.Queue[pos] = wait(id, now, back, ttl+(at-back))
		rep.Wait = max(back-now, int64(time.Millisecond))
		return
	}
	if pos == 0 {
		s.Queue = s.Queue[1:] // its turn
	}
	if s.Booked <= now && s.Penalty <= now && s.Pool >= need {
		s.Pool -= need
		rep.Taken = true
		return
	}
	// Booked after the permits booked before (at the free rate of now: a rate that grows
	// later speeds up only the bookings after), and after any penalty, as gcra.Penalize
	// holds a bucket back.
	at := s.nextSlot(now, need, free)
	if at-now > maxDelay {
		// Denied: the same take would be granted (booked) from at - maxDelay on, or
		// sooner if shares still counted free. It waits first in line, and is told to
		// come back then.
		back := min(at, s.turn(now, need, 0, free)) - maxDelay
		if maxDelay > 0 || pos == 0 {
			s.Queue = slices.Insert(s.Queue, 0, wait(id, now, back, ttl)) // atOnce: not a take at once
		}
		rep.Wait = max(back-now, int64(time.Millisecond))
		return
	}
	if at > now {
		s.Pool, s.Booked = 0, at
	} else {
		s.Pool -= need
	}
	rep.Taken, rep.Wait = true, at-now
}

// expected returns how many of the waiters before pos in the store's line (all of them if
// pos < 0) are still expected: not later than they were told to come back.
func (s *State) expected(now int64, pos int) int64 {
	if pos < 0 {
		pos = len(s.Queue)
	}
	var n int64
	for _, w := range s.Queue[:pos] {
		if now <= w.At {
			n++
		}
	}
	return n
}

// turn returns when the waiter at pos in the store's line (0 first) may expect its n
// permits (need, in the limit's units): one slot each after the first, at the free rate.
// While shares are still counted (a limit just switched to being decided at the store, its
// members giving their shares up at their next renewals), the free rate is only what they
// let go so far, a sliver at first: a turn at its pace would lie hours ahead, and the
// waiter told to come back then would keep the head of the line that long. The turn is
// then no later than when every counted share has ended by itself, followed by a slot of
// the whole capacity for each waiter.
func (s *State) turn(now, need, pos int64, free Share) int64 {
	slot, _ := mulDivUp(need, RateScale, max(free.Rate, 1))
	at := gcra.After(s.nextSlot(now, need, free), gcra.MulSat(pos, slot))
	capa := s.capacity(now)
	if free.Rate >= capa.Rate {
		return at
	}
	full, _ := mulDivUp(need, RateScale, max(capa.Rate, 1))
	return min(at, gcra.After(max(s.heldUntil(now), s.Booked, s.Penalty, s.Fence), gcra.MulSat(pos+1, full)))
}

// heldUntil returns when every share counted at now will have ended by itself (a lease, an
// older lease the member may still use, a retired registration), if none is given up
// before.
func (s *State) heldUntil(now int64) int64 {
	t := now
	for i := range s.Members {
		e := &s.Members[i]
		if now < e.Lease.Until && !e.Lease.Share.IsZero() {
			t = max(t, e.Lease.Until)
		}
		if now < e.HeldUntil && !e.Held.IsZero() {
			t = max(t, e.HeldUntil)
		}
		if now < e.RetiredUntil && !e.Retired.IsZero() {
			t = max(t, e.RetiredUntil)
		}
	}
	return t
}

// updateCentral sets Central as targets does, without the shares: one pass over the
// members and nothing allocated, where targets sorts them (each take asks).
func (s *State) updateCentral(now int64, cfg Config) {
	var wanting, live int64
	for i := range s.Members {
		if e := &s.Members[i]; e.live(now) {
			live++
			if cfg.Policy == Equal || e.Demand > 0 {
				wanting++
			}
		}
	}
	s.Central = s.centralWanted(now, cfg, wanting, live, func() (est int64) {
		for i := range s.Members {
			if e := &s.Members[i]; e.live(now) && e.Demand > 0 {
				est += e.estimate()
			}
		}
		return est
	})
	s.toBucket(now, live, cfg)
}

// BucketAbove is the number of live members past which a limit decided at the store is
// decided on its bucket (toBucket). Up to it, takes of the record keep the store's line,
// which serves waiting callers in turn: a bucket books each take at most TTL + Grace
// ahead, and callers told to come back then compete as they come (24 members of
// one-every-6s at 85% of it, Poisson: p99 wait 34 s over the ideal throttle's on the
// bucket, within 18 s in the line). Takes of a record of a hundred members use the limit
// (BenchmarkLeaseRedisCentral, 99 of 100/s).
const BucketAbove = 100

// toBucket moves a crowded limit (more than BucketAbove live members) that is decided at
// the store to its bucket: from then on every permit is a round trip to a record of a few
// bytes decided at the store (one script call on Redis), not a read and a write of this
// record, which lists every member: a thousand members' takes (2,000 a second and more)
// on a record of a thousand entries kept the store from answering anyone
// (BenchmarkLeaseRedisMembers, members=1000: 0 admitted a second). The bucket starts empty
// when every share still counted has ended by itself, and after the takes booked and any
// penalty or fence: its permits never add to what was granted before. A limit stays on
// its bucket until its record is made again (every member gone, or the store lost it):
// going back would need the bucket closed before the record hands its capacity out again,
// and a pool that was that crowded is decided well at the store. Windowed quotas and
// ramps stay on their records.
func (s *State) toBucket(now, live int64, cfg Config) {
	if s.BucketAt != 0 || !s.Central || live <= BucketAbove || s.Limit.Window > 0 || !s.Limit.Ramp.IsZero() {
		return
	}
	s.BucketAt = max(now, s.heldUntil(now), s.Booked, s.Penalty, s.Fence)
	s.BucketInc = s.Incarnation
	// The members it answers now may take at the bucket until then (carried BucketKeep
	// ahead, as a confirm would: else every member's first confirm on the bucket found
	// it short and wrote the record, all at once); its waiters come back to the bucket.
	s.BucketBusy = max(s.BucketBusy, gcra.After(now, bucketKeep(cfg)))
	s.Queue = nil
}

// Rewound makes a record found older than a version a member has seen (a failover that
// lost writes, an old copy restored) a new incarnation, fenced from now (the store's
// clock) for TTL + Grace, its burst refilled only after; a limit on its bucket moves to a
// new bucket that starts after the fence (the old one may have lost writes too, and its
// members stop taking there within a TTL).
func (s *State) Rewound(now int64, incarnation uint64) {
	s.Incarnation = incarnation
	s.Fence = max(s.Fence, s.Cfg.FenceAfterRestart(now))
	s.Pool, s.PoolAt = 0, max(s.PoolAt, now) // its burst refills after the fence
	s.SpendWindow(s.PoolAt)                  // a windowed quota: what it handed out since is unknown
	if s.BucketAt != 0 {
		s.BucketInc, s.BucketAt = incarnation, max(s.BucketAt, s.Fence)
	}
}

// BucketKeep is how far ahead a record on its bucket carries its word on it
// (State.BucketBusy) when it moves there and when a confirm finds it running short (a
// quarter to a half of it left), at least four times the record's TTL + Grace: its members confirm by reading the record,
// and one confirm in about BucketKeep/2 writes it. A record on its bucket is kept that
// long after its last member has gone.
const BucketKeep = 30 * time.Second

// bucketKeep is BucketKeep for the record's settings.
func bucketKeep(cfg Config) int64 {
	return max(int64(BucketKeep), 4*int64(cfg.TTL+cfg.Grace))
}

// confirm answers a confirm (OpConfirm): the member may go on taking at the record's
// bucket, the one the answer names (BucketInc): a record found rewound has moved to a
// new bucket, which starts after its fence, and the member moves with it (its word on
// the old one ends: Member.learnBucket); a record made again is on no bucket, and the
// member is stale and joins again. Neither the member's entry nor its epoch's incarnation
// is needed: the entries of members that only confirm expire, the limit stays on its
// bucket until the record is made again, and a rewind that moves a thousand members to a
// new bucket does not make them all join again. A join of a record on its bucket is
// answered so too (State.apply): the thousand members of a limit starting at once join
// by reading its record, not by writing it in turn.
//
// Its word (Reply.Word) is at most TTL and ends Grace before BucketBusy at the latest,
// as an answer that registers a member ends (Sent + TTL) that long before the BucketBusy
// it raises (now + TTL + Grace): so the record is not Idle (deleted, or dropped by the
// store, and made again with a fresh burst and no fence) before every member's word on
// the bucket, and every permit booked there, has ended. When a quarter to a half of
// BucketKeep is left of BucketBusy, or most entries have nothing left counting
// (mostlyGone: they are dropped), it carries BucketBusy BucketKeep ahead: the only
// changes a confirm makes, which the store then writes (the applier writes a group of
// confirms only if BucketBusy moved, which it always does then).
func (s *State) confirm(now int64, cfg Config, req Request) (Reply, error) {
	if req.Member == "" {
		return Reply{}, fmt.Errorf("%w: no member name", ErrBadRequest)
	}
	if req.Op == OpTake || req.Op == OpGive {
		if err := s.badCount(req); err != nil {
			return Reply{}, err
		}
	}
	if !s.OnBucket() {
		return Reply{}, fmt.Errorf("%w: member %q epoch %d/%d (the record is not on a bucket)", ErrStaleEpoch, req.Member, req.Epoch.Incarnation, req.Epoch.N)
	}
	keep, life := bucketKeep(cfg), int64(cfg.TTL+cfg.Grace)
	epoch := req.Epoch
	if req.Op == OpJoin {
		// A join registers the member without an entry, as its confirms keep it: epoch
		// number 0, which no entry has (a renewal of it is stale). Its word is a whole
		// TTL, as a join's written answer: left unwritten, BucketBusy is more than a
		// quarter of BucketKeep (at least TTL + Grace) ahead.
		epoch = Epoch{Incarnation: s.Incarnation}
	}
	// Which of the members writes is spread by their names (a fraction f of 1024), so
	// that the first to cross its threshold writes alone, where every member's confirm of
	// the same version wrote at once (members of a thousand processes, 1,196 writes in a
	// second, most of them lost). Each threshold is a predicate that, while nobody
	// writes, turns true at one instant and stays so (BucketBusy draws near; entries
	// expire), which each member judges that much later than the first (judged at now,
	// every member wrote at the instant most entries had expired: 107 in a second).
	f := int64(confirmSpread(req.Member))
	late := now - 4*life*f/1024
	if s.BucketBusy-now < keep/2-keep/4*f/1024 ||
		(late >= s.PoolAt && s.mostlyGone(late)) {
		// Written: its word carried on, and the entries of members that have gone (or
		// only confirm) dropped once they are most of it (every write drops them too),
		// so that the record every member reads stays small (a thousand joins left it
		// at 25 KB, read four times a second by each member, until its next write).
		s.advance(now)
		s.BucketBusy = max(s.BucketBusy, gcra.After(now, keep))
	}
	ttl := int64(cfg.TTL)
	return Reply{
		Epoch: epoch, TTL: ttl, Grace: int64(cfg.Grace),
		Word:    min(ttl, s.BucketBusy-int64(cfg.Grace)-now),
		Central: true, Bucket: s.BucketAt, BucketInc: s.BucketInc,
		Penalty: max(0, s.Penalty-now),
		Sent:    req.Sent, Nonce: req.Nonce,
	}, nil
}

// confirmSpread draws a number in [0, 1024) from a member's name (FNV-1a): where, between
// its thresholds, its confirms write the record (State.confirm).
func confirmSpread(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	x := h.Sum64()
	return (x ^ x>>32) % 1024
}

// mostlyGone reports whether most of the record's entries (and at least CrowdedAbove)
// have nothing left counting at now: advance drops them.
func (s *State) mostlyGone(now int64) bool {
	gone := 0
	for i := range s.Members {
		if s.Members[i].over(now) {
			gone++
		}
	}
	return gone >= CrowdedAbove && 2*gone >= len(s.Members)
}

// OnBucket reports whether the record's limit is decided on its bucket (toBucket).
func (s *State) OnBucket() bool { return s.BucketAt != 0 && s.Limit.Window == 0 }

// ReadOnBucket reports whether a request of operation op is a read of a record on its
// bucket (OnBucket), answered as a confirm is (State.confirm): the record only names the
// bucket, where the member takes and gives back, and holds no entry for it (a join
// registers its member without one; a release has nothing to hand back: every share the
// record granted ended before the bucket started). So a thousand members start, take,
// leave and stay without writing the record they would all collide on.
func ReadOnBucket(op Op) bool {
	switch op {
	case OpConfirm, OpJoin, OpTake, OpGive, OpRelease:
		return true
	}
	return false
}

// BucketID names the bucket of the record recordID made in incarnation inc (a record made
// again, after its store lost it, has a bucket of its own).
func BucketID(recordID string, inc uint64) string {
	return recordID + ":b" + strconv.FormatUint(inc, 16)
}

// estimate is what the member's demand is known to be when the store judges whether a
// pool's demand is under its limit (centralWanted): the rate it reported or, for one that
// asks for as much as it can get, half as much again as the share it holds (held back by
// the share it spends: as much as it would probe for, Member.measure). One that holds no
// share yet (it just joined, or the limit was decided at the store) is not known to want
// anything in particular, and counts for nothing.
func (e *Entry) estimate() int64 {
	if e.Demand < RateScale {
		return e.Demand
	}
	return e.Lease.Share.Rate * probeNum / probeDen // a share's rate is at most RateScale
}

// centralWanted says whether the limit is too small to share out among the members that
// want it: more of them than it has permits of burst (each share needs one), or shares
// that would grant less than a permit each per lease; or, while their demand is under the
// limit (est, the sum of their estimates in parts of RateScale, computed only then, is
// less than the capacity's rate; fair policy), shares that would grant fewer than
// pooledPermitsPerLease permits each per lease. Demand under the limit is what small shares serve worst: the
// first arrivals of a Poisson member spend its few permits and the rest wait for its
// renewal while the others' shares stand unused, where one line at the store pools them
// (10/s among four unequal Poisson members at 85% of it, 2.5 permits a lease each: p99 wait
// 3.9 s over the ideal throttle's in shares). Members that each want more than they hold
// keep their shares: they spend them, and one line at the store serves callers that come
// and go less evenly than shares (sluice demo's eight on/off workers on 20/s burst=10, 2.5
// permits a lease each: Jain's index 0.89 to 0.99 over 8 s in the store's line, 0.97 to 0.99
// in shares).
//
// A limit that is decided at the store goes back to shares only when it has room to spare
// for the members that want it (twice as many would still get pooledPermitsPerLease each),
// or when one member is left; never while takes are booked ahead of the pool, nor while
// members that want it come and go among live ones that may want it again (Poisson callers
// idle between requests): each return to shares hands the whole limit to the few that want
// it, and the next member to want it waits for their shares to end (a lease and its
// quarantine) before the store decides again.
func (s *State) centralWanted(now int64, cfg Config, wanting, live int64, est func() int64) bool {
	if s.BucketAt != 0 {
		return true // decided on its bucket until the record is made again
	}
	capa, t, ttl := s.capacity(now), s.Limit.T, int64(cfg.TTL)
	fits := func(n, per int64) bool { return n <= capa.Burst && gcra.MulSat(gcra.MulSat(n, per), t) <= ttl }
	if !s.Central {
		if wanting < 2 || !fits(wanting, 1) {
			return wanting >= 2
		}
		return !fits(wanting, pooledPermitsPerLease) && cfg.Policy != Equal && est() < capa.Rate // under the limit
	}
	return s.Booked > now || (live >= 2 && (wanting == 0 || !fits(2*wanting, pooledPermitsPerLease)))
}

// pooledPermitsPerLease: while the demand of the members that want a limit is under it, the
// limit is shared out only while each would get at least this many permits per lease
// (centralWanted).
const pooledPermitsPerLease = 3

// charge counts n permits already used against the free capacity (a settlement up of a
// take): from the pool, else booked ahead of any later take, at the free rate (the whole
// limit's, if none is free: conservative either way).
func (s *State) charge(now, n int64) {
	need := gcra.MulSat(n, s.Limit.T)
	if s.Booked <= now && s.Pool >= need {
		s.Pool -= need
		return
	}
	pool := s.Pool
	if s.Booked > now {
		pool = 0
	}
	free := s.capacity(now).sub(s.Committed(now))
	s.Pool, s.Booked = 0, s.accrued(now, max(now, s.Booked), need-pool, free)
}

// accrued returns when the free capacity, whose rate is free's at now, will have accrued
// d more (in the limit's units) after start: at the free rate, but no later than when the
// shares still counted (and a fence) have ended by themselves and the whole capacity's
// rate has accrued d. While a limit switches to being decided at the store, the free rate
// is for a while the sliver of rate its members' shares leave (they give them up at their
// next renewals): at that pace a permit lay hours ahead.
func (s *State) accrued(now, start, d int64, free Share) int64 {
	if d <= 0 {
		return start
	}
	w, _ := mulDivUp(d, RateScale, max(free.Rate, 1))
	at := gcra.After(start, w)
	if capa := s.capacity(now); free.Rate < capa.Rate {
		full, _ := mulDivUp(d, RateScale, max(capa.Rate, 1))
		at = min(at, gcra.After(max(start, s.heldUntil(now), s.Fence), full))
	}
	return at
}

// nextSlot is when the free capacity will next hold need, after the takes booked before and
// any penalty.
func (s *State) nextSlot(now, need int64, free Share) int64 {
	start, pool := max(now, s.Booked), s.Pool
	if s.Booked > now {
		pool = 0
	}
	return max(s.accrued(now, start, need-pool, free), s.Penalty)
}
