package robustness

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Mode is the Sluice mode a run exercises.
type Mode string

// The modes the suite runs.
const (
	ModeStrict Mode = "strict" // package strict: every decision in Redis, fail closed
	ModeLease  Mode = "lease"  // package lease on a Redis store (store/redis)
	// ModeStrictLocal is package strict with the local fail mode (strict.WithFailLocal at
	// a share of 1/members): while Redis is out of reach each member decides at its share.
	ModeStrictLocal Mode = "strict-local"
	// ModeGossip is package gossip (memberlist, no store): its members report over UDP,
	// which toxiproxy cannot carry, so its network faults go through each member's
	// FaultTransport (the peer_* and link_cut faults), beside the process faults and clock
	// offsets.
	ModeGossip Mode = "gossip"
	// ModeDaemon is the daemon (sluice serve, its redis back end, fail closed), one per
	// member slot, each member's limiter on the daemon through package client.
	ModeDaemon Mode = "daemon"
	// ModeLeaseEtcd and ModeLeaseZK are package lease on an etcd store (store/etcd) and
	// a ZooKeeper store (store/zk): a real etcd or ZooKeeper, each member's client through its own
	// proxy to the store's client port.
	ModeLeaseEtcd Mode = "lease-etcd"
	ModeLeaseZK   Mode = "lease-zk"
	// ModeDaemonLease and ModeDaemonGossip are the daemon mode on the lease back end
	// (its store the run's Redis, through the daemon's proxy) and on the gossip back end
	// (the daemons peers of each other over memberlist; no store).
	ModeDaemonLease  Mode = "daemon-lease"
	ModeDaemonGossip Mode = "daemon-gossip"
)

// Modes lists every mode, in the order seeds pick them (seed % len), unless ROBUST_MODE
// names one.
var Modes = []Mode{ModeStrict, ModeLease, ModeStrictLocal, ModeGossip, ModeDaemon, ModeLeaseEtcd, ModeLeaseZK, ModeDaemonLease, ModeDaemonGossip}

// isDaemon reports whether mode runs a daemon per member slot.
func isDaemon(mode Mode) bool {
	return mode == ModeDaemon || mode == ModeDaemonLease || mode == ModeDaemonGossip
}

// ParseMode reads a mode's name.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("robust: unknown mode %q (want one of %v)", s, Modes)
}

// FaultKind names one kind of injected fault.
type FaultKind string

// The fault catalogue. Toxics act on one member's proxy to Redis (or every member's, for
// a partition of Redis from all of them); process faults on a member or on Redis.
const (
	FaultLatency    FaultKind = "latency"     // toxic: latency with jitter, both directions
	FaultBandwidth  FaultKind = "bandwidth"   // toxic: a few KB/s
	FaultTimeout    FaultKind = "timeout"     // toxic: data dropped, connection closed after a time-out
	FaultResetPeer  FaultKind = "reset_peer"  // toxic: connections reset (TCP RST)
	FaultBlackHole  FaultKind = "black_hole"  // toxic: data dropped, connection kept open
	FaultProxyDown  FaultKind = "proxy_down"  // the proxy stops listening: connections refused
	FaultPartition  FaultKind = "partition"   // black hole on every member's proxy at once
	FaultMemberKill FaultKind = "member_kill" // SIGKILL of a member, a new member started after
	FaultMemberStop FaultKind = "member_stop" // SIGSTOP of a member, SIGCONT after
	FaultRedisStop  FaultKind = "redis_stop"  // SIGSTOP of Redis, SIGCONT after
	FaultRedisEmpty FaultKind = "redis_empty" // SIGKILL of Redis, restarted empty after
	FaultRestoreOld FaultKind = "restore_old" // DUMP of every key now, RESTORE of it after (etcd, ZooKeeper: their data directory copied, put back)
	FaultClockSkew  FaultKind = "clock_skew"  // a member started with its clock off by seconds
	// The daemon mode's: the daemon of a slot killed (restarted on its ports after) or
	// paused.
	FaultDaemonKill FaultKind = "daemon_kill"
	FaultDaemonStop FaultKind = "daemon_stop"
	// The gossip mode's network faults, on the member's real datagrams and streams to its
	// peers (FaultTransport), both directions: the member cut from every peer (a partition
	// into two sides), from one peer only (the others still hear both), a share of its
	// datagrams lost, or its datagrams and streams delayed.
	FaultPeerPartition FaultKind = "peer_partition"
	FaultLinkCut       FaultKind = "link_cut"
	FaultPeerLoss      FaultKind = "peer_loss"
	FaultPeerDelay     FaultKind = "peer_delay"
	// The etcd and ZooKeeper modes' store faults: the server paused (SIGSTOP, SIGCONT
	// after), killed and restarted with its data after (a crash), or killed, its data
	// deleted, and restarted empty after (a cluster rebuilt from nothing).
	FaultStoreStop FaultKind = "store_stop"
	FaultStoreKill FaultKind = "store_kill"
	FaultStoreWipe FaultKind = "store_wipe"
	// The gossip modes' owner faults: the member (daemon-gossip: the daemon) that owns
	// the fault's Key when it starts, found with the rendezvous the pool uses
	// (hits.OwnerOf) over the names of the processes running then, killed (a new one
	// started in its slot after; a daemon restarts on its ports, under its name) or cut
	// from every peer (as peer_partition). Either way the key moves to a new owner, which
	// must be fenced: a cut lasts long enough for the other side to let the owner go
	// (OwnerCutMin); a kill lasts OwnerKillMin to OwnerFaultMax, shorter than that (the
	// daemon restarted under its name, or a new member that outranks the dead one, owns
	// the key again at once, with none of the state its predecessor decided on) or longer.
	FaultOwnerKill      FaultKind = "owner_kill"
	FaultOwnerPartition FaultKind = "owner_partition"
	// FaultAllocatorKill is a lease run's with its relay on (Schedule.RelayAbove): the
	// member that holds a limit's ballot, its allocator, found when the fault starts (the
	// ballot names it), SIGKILLed and a new member started after.
	FaultAllocatorKill FaultKind = "allocator_kill"
)

// Owner faults' lengths. OwnerCutMin is past the time the pool takes to let a lost
// owner go (the membership's or the reports' loss of contact, then the hold: about 2.5 s
// by default, docs/gossip.md).
const (
	OwnerKillMin  = 500 * time.Millisecond
	OwnerCutMin   = 2600 * time.Millisecond
	OwnerFaultMax = 4000 * time.Millisecond
)

// isOwnerFault reports whether k targets a key's owner, found when it starts.
func isOwnerFault(k FaultKind) bool { return k == FaultOwnerKill || k == FaultOwnerPartition }

// Fault is one scheduled fault: it starts At after the run's start and lasts For (the
// toxic is removed, the process continued or restarted, the old state restored, after
// For). Target is a member slot (-1: Redis or every member).
type Fault struct {
	At, For time.Duration
	Kind    FaultKind
	Target  int
	// Toxic attributes (milliseconds, KB/s), by kind.
	Latency, Jitter, Rate, Timeout int
	// Link is the link a toxic acts on: "m", the member's to its store (or, in the daemon
	// mode, to its daemon); "r", the daemon's to Redis (daemon mode).
	Link string
	// Peer is link_cut's other end (a member slot); Loss peer_loss's share of datagrams
	// lost (percent).
	Peer, Loss int
	// Key is an owner fault's key (one of the workload's): its owner is the target,
	// found when the fault starts (Target is -1 until then).
	Key string
}

func (f Fault) String() string {
	s := fmt.Sprintf("%v+%v %s", f.At.Round(time.Millisecond), f.For.Round(time.Millisecond), f.Kind)
	if f.Target >= 0 {
		s += fmt.Sprintf(" member %d", f.Target)
	}
	if isOwnerFault(f.Kind) {
		s += fmt.Sprintf(" of key %s", f.Key)
	}
	if f.Link == "r" {
		s += " (its daemon's link to Redis)"
	}
	switch f.Kind {
	case FaultLatency, FaultPeerDelay:
		s += fmt.Sprintf(" %dms±%dms", f.Latency, f.Jitter)
	case FaultLinkCut:
		s += fmt.Sprintf(" from member %d", f.Peer)
	case FaultPeerLoss:
		s += fmt.Sprintf(" %d%%", f.Loss)
	case FaultBandwidth:
		s += fmt.Sprintf(" %dKB/s", f.Rate)
	case FaultTimeout:
		s += fmt.Sprintf(" %dms", f.Timeout)
	}
	return s
}

// Schedule is a run's plan: its mode, members, workload and faults, all drawn from the
// seed (the same seed gives the same schedule; the interleaving of real processes is the
// machine's).
type Schedule struct {
	Seed       uint64
	Mode       Mode
	Members    int
	Goroutines int
	Duration   time.Duration
	Skews      []time.Duration // each member slot's clock offset (a replacement gets the slot's)
	Faults     []Fault         // in order of At
	// Groups, when set, are the workload's limiters instead of the package's Groups (the
	// gossip modes only: their members, daemons and check read it). NewSchedule never sets
	// it; TestOwnerFaults does.
	Groups []Group
	// RelayAbove, when set, is the lease members' relay threshold (lease.WithRelayAbove):
	// with 1, a limit of two live members or more goes through its allocator, elected
	// among them, and the schedule kills allocators (FaultAllocatorKill). NewSchedule
	// sets it on the lease mode's odd seeds.
	RelayAbove int
	// Calm, when set, makes the workload now-or-never calls and waits only: no penalty,
	// which holds its key back for everyone, and no reservation given back, whose permits
	// a key's owner keeps (a refund of a forwarded grant stays where it was forwarded
	// from). Either keeps a key under demand from draining its bucket as the check counts
	// it, which hides a burst granted twice (TestOwnerFaults). NewSchedule never sets it.
	Calm bool
}

// groups are the schedule's workload limiters: its Groups, else the package's.
func (s Schedule) groups() []Group {
	if s.Groups != nil {
		return s.Groups
	}
	return Groups
}

// Faults counts the faults injected, clock offsets included.
func (s Schedule) FaultCount() int {
	n := len(s.Faults)
	for _, sk := range s.Skews {
		if sk != 0 {
			n++
		}
	}
	return n
}

// NewSchedule draws the schedule of seed for mode: members members for d, a fault every
// 250 to 750 ms, each lasting 100 ms to 1.5 s (an owner fault longer: OwnerKillMin or
// OwnerCutMin to OwnerFaultMax). Faults on Redis never overlap each other, nor do two on one member, nor
// two owner faults; toxics on different members do, and an owner fault may fall on a
// member with a fault of its own (its target is known only when it starts).
func NewSchedule(seed uint64, mode Mode, members int, d time.Duration) Schedule {
	rng := rand.New(rand.NewPCG(seed, 0x5ee1))
	s := Schedule{Seed: seed, Mode: mode, Members: members, Goroutines: 6, Duration: d}
	for range members {
		var sk time.Duration
		if rng.IntN(2) == 0 {
			sk = time.Duration(rng.IntN(8001)-3000) * time.Millisecond // -3 s to +5 s
		}
		s.Skews = append(s.Skews, sk)
	}
	redisFree, ownerFree := time.Duration(0), time.Duration(0)
	memberFree := make([]time.Duration, members)
	kinds := []FaultKind{FaultLatency, FaultBandwidth, FaultTimeout, FaultResetPeer, FaultBlackHole, FaultProxyDown,
		FaultPartition, FaultMemberKill, FaultMemberStop, FaultRedisStop, FaultRedisEmpty, FaultRestoreOld}
	switch mode {
	case ModeGossip:
		kinds = []FaultKind{FaultMemberKill, FaultMemberStop, FaultPeerPartition, FaultLinkCut, FaultPeerLoss, FaultPeerDelay,
			FaultOwnerKill, FaultOwnerPartition}
	case ModeDaemon, ModeDaemonLease:
		kinds = append(kinds, FaultDaemonKill, FaultDaemonStop)
	case ModeDaemonGossip: // no store: the toxics act on the members' links to their daemons, the peer faults between the daemons
		kinds = []FaultKind{FaultLatency, FaultBandwidth, FaultTimeout, FaultResetPeer, FaultBlackHole, FaultProxyDown,
			FaultPartition, FaultMemberKill, FaultMemberStop, FaultDaemonKill, FaultDaemonStop,
			FaultPeerPartition, FaultLinkCut, FaultPeerLoss, FaultPeerDelay, FaultOwnerKill, FaultOwnerPartition}
	case ModeLease:
		if seed%2 == 1 {
			s.RelayAbove = 1
			kinds = append(kinds, FaultAllocatorKill, FaultAllocatorKill)
		}
	case ModeLeaseEtcd, ModeLeaseZK:
		kinds = []FaultKind{FaultLatency, FaultBandwidth, FaultTimeout, FaultResetPeer, FaultBlackHole, FaultProxyDown,
			FaultPartition, FaultMemberKill, FaultMemberStop, FaultStoreStop, FaultStoreKill, FaultStoreWipe, FaultRestoreOld}
	}
	// Leave the first 700 ms and the last second quiet: members start, and finish in peace.
	for at := 700*time.Millisecond + time.Duration(rng.IntN(300))*time.Millisecond; at < d-time.Second; at += time.Duration(250+rng.IntN(500)) * time.Millisecond {
		f := Fault{At: at, For: time.Duration(100+rng.IntN(1400)) * time.Millisecond, Kind: kinds[rng.IntN(len(kinds))], Target: rng.IntN(members), Link: "m"}
		if (mode == ModeDaemon || mode == ModeDaemonLease) && rng.IntN(2) == 0 {
			f.Link = "r"
		}
		f.For = min(f.For, d-time.Second-at)
		switch f.Kind {
		case FaultLatency:
			f.Latency, f.Jitter = 10+rng.IntN(150), rng.IntN(50)
		case FaultBandwidth:
			f.Rate = 1 + rng.IntN(8)
		case FaultTimeout:
			f.Timeout = 20 + rng.IntN(300)
		case FaultPeerDelay:
			f.Latency, f.Jitter = 20+rng.IntN(280), rng.IntN(50)
		case FaultPeerLoss:
			f.Loss = 10 + rng.IntN(51)
		case FaultLinkCut:
			f.Peer = (f.Target + 1 + rng.IntN(members-1)) % members
		case FaultOwnerKill, FaultOwnerPartition:
			g := Groups[rng.IntN(len(Groups))] // NewSchedule's runs use the package's
			f.Key = g.Keys[rng.IntN(len(g.Keys))]
			least := OwnerCutMin
			if f.Kind == FaultOwnerKill {
				least = OwnerKillMin
			}
			f.For = min(least+time.Duration(rng.Int64N(int64(OwnerFaultMax-least))), d-time.Second-at)
		}
		onRedis := f.Kind == FaultRedisStop || f.Kind == FaultRedisEmpty || f.Kind == FaultRestoreOld || f.Kind == FaultPartition ||
			f.Kind == FaultStoreStop || f.Kind == FaultStoreKill || f.Kind == FaultStoreWipe
		switch {
		case onRedis:
			f.Target = -1
			if at < redisFree {
				continue
			}
			redisFree = at + f.For + 200*time.Millisecond
		case isOwnerFault(f.Kind) || f.Kind == FaultAllocatorKill:
			// Its target is found when it starts (the runner skips a fault whose slot is
			// down by then, as a kill of a member killed already): one owner fault at a
			// time, so that each moves the key once.
			f.Target = -1
			if at < ownerFree {
				continue
			}
			ownerFree = at + f.For + 200*time.Millisecond
		default:
			if at < memberFree[f.Target] {
				continue
			}
			memberFree[f.Target] = at + f.For + 200*time.Millisecond
		}
		s.Faults = append(s.Faults, f)
	}
	return s
}
