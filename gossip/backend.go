package gossip

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/gossip/hits"
)

// Config is a gossip member's configuration. Use DefaultConfig; Validate checks it.
type Config struct {
	Bind      string        // host:port of the membership's UDP and TCP listeners
	Advertise string        // host:port peers reach this member at; "": Bind
	Name      string        // the member's name in the pool, unique; "": the advertised address
	Peers     []string      // seed list: host:port of members to join (a name resolving to several addresses joins each)
	Key       []byte        // shared key (16, 24 or 32 bytes: AES-128, -192, -256); nil: traffic in clear
	Interval  time.Duration // sync interval: how often hits are reported
	Hold      time.Duration // how long a lost peer keeps its share
	Policy    Policy        // Auto, Owner (the key's owner decides), Shares (by demand), Equal (1/N) or Whole (the DThrottle design as written)
	MaxTags   int           // tags held at once
	// MeshMax is the largest pool that reports all-to-all; a larger one reports over each
	// tag's tree (docs/gossip.md, "Hundreds of daemons"). 0: hits.DefaultConfig's, 32.
	MeshMax int
	// PolicyFor, if set, gives a key a policy of its own (Auto, Owner or Shares) in place
	// of Policy: a daemon rule's `gossip:` (see hits.Config.PolicyFor).
	PolicyFor func(key string) (p Policy, ok bool)
	Logger    *slog.Logger // nil: discard
	Clock     clock.Clock  // nil: clock.Default
	// WrapTransport, when set, wraps memberlist's UDP and TCP transport (tests inject
	// network faults between peers with it); nil: memberlist's own, unwrapped.
	WrapTransport WrapTransport
}

// DefaultConfig returns the defaults, each commented.
func DefaultConfig() Config {
	h := hits.DefaultConfig()
	return Config{
		Bind:     "127.0.0.1:7946", // loopback: other hosts must be allowed explicitly
		Interval: h.Interval,       // 100ms: the excess between syncs scales with it
		Hold:     h.Hold,           // 2s: a partition shorter than this does not multiply the limit
		Policy:   hits.Auto,        // the key's owner decides small limits, shares large ones
		MaxTags:  h.MaxTags,        // about 1M tags
	}
}

// Validate reports the first problem.
func (c Config) Validate() error {
	if _, _, err := splitHostPort(c.Bind); err != nil {
		return fmt.Errorf("sluice: gossip bind %q: %w", c.Bind, err)
	}
	if c.Advertise != "" {
		if _, _, err := splitHostPort(c.Advertise); err != nil {
			return fmt.Errorf("sluice: gossip advertise %q: %w", c.Advertise, err)
		}
	}
	for _, p := range c.Peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return fmt.Errorf("sluice: gossip peer %q: want host:port", p)
		}
	}
	switch len(c.Key) {
	case 0, 16, 24, 32:
	default:
		return fmt.Errorf("sluice: gossip key: %d bytes, want 16, 24 or 32", len(c.Key))
	}
	return c.core().Validate()
}

func (c Config) core() hits.Config {
	h := hits.DefaultConfig()
	h.Interval, h.Hold, h.Policy, h.MaxTags = c.Interval, c.Hold, c.Policy, c.MaxTags
	h.LostAfter = 5 * c.Interval
	h.PolicyFor = c.PolicyFor
	if c.MeshMax > 0 {
		h.MeshMax = c.MeshMax
	}
	return h
}

func splitHostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return h, port, nil
}

// Policy says how much of a tag's limit a member spends between syncs.
type Policy = hits.Policy

const (
	// Auto (the default) decides a tag at its owner when each member would hold less than
	// hits.AutoBurst permits of its burst (a small limit, or a large pool), and by Shares
	// otherwise.
	Auto = hits.Auto
	// Owner: one member decides each tag, exactly: its owner, by rendezvous hashing over
	// the membership. The others forward their requests to it (one datagram each way).
	Owner = hits.Owner
	// Shares: a member spends only its share of the tag's limit, from the demand its peers
	// and it reported.
	Shares = hits.Shares
	// Equal gives each member 1/N of the limit, N the pool size it counts, whatever the
	// demand.
	Equal = hits.Equal
	// Whole is the DThrottle design as written (docs/gossip.md, "The algorithm"). Every
	// member spends from the whole bucket and hears of the others' hits at the next sync.
	// It over-admits by up to the burst and a sync interval's refill per member, and is
	// kept for comparison.
	Whole = hits.Whole
)

// ParsePolicy reads a policy's name: "auto" (or ""), "owner", "shares", "equal" or "whole".
func ParsePolicy(s string) (Policy, error) { return hits.ParsePolicy(s) }

// ReadKey reads a shared key from a file: 16, 24 or 32 bytes, raw or as base64 or hex
// text (surrounding whitespace ignored).
func ReadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sluice: gossip key file: %w", err)
	}
	return parseKey(b)
}

// Limits on what is sent at once.
const (
	packetMax  = 1200    // a datagram part: memberlist's 1400-byte buffer less its headers and encryption
	udpParts   = 4       // a report of more parts goes over a stream
	streamPart = 4 << 20 // a stream message
)

// Backend is a gossip member: a backend.Backend whose decisions are made here and shared
// with the peers. Make one with New; it is safe for concurrent use. Close leaves the pool
// (peers free its share at once) and stops its goroutines.
type Backend struct {
	cfg   Config
	clock clock.Clock
	log   *slog.Logger

	shards [nShards]shard // tags by hash: decisions on different shards do not share a lock
	seed   maphash.Seed

	ml *memberlist.Memberlist
	// peers are copies of memberlist's nodes, taken in its join, update and leave
	// notifications (which it makes holding its lock): Members returns pointers into its
	// live state, which it rewrites without telling (a peer's new incarnation), so the
	// report loop sends to these copies instead.
	peersMu sync.Mutex
	peers   map[string]memberlist.Node
	self    string // this member's name

	stop    chan struct{}
	wg      sync.WaitGroup
	closed  atomic.Bool
	leaving atomic.Bool // set by Close: the node's meta says so (leavingMeta)
	stats   counters

	asks asks // requests forwarded to their keys' owners, awaiting answers
}

// ForwardTimeout is how long a member waits for the owner's answer to a forwarded request
// (or less, the caller's context) before it answers ErrUnavailable: the request or the
// answer was lost, or the owner is down (peers route to it until it is let go: Hold after
// the membership finds it dead). The request goes again every ForwardResend meanwhile.
const ForwardTimeout = time.Second

// ForwardResend is how long a member waits for the owner's answer before it sends the
// request again (a datagram lost, or a loaded owner late).
const ForwardResend = 200 * time.Millisecond

// asks are the forwarded requests awaiting their owners' answers, by id, and the asks
// waiting to go to each owner.
type asks struct {
	mu   sync.Mutex
	next uint64
	wait map[uint64]chan hits.Answer
	out  map[string]*outbox // by owner
}

// outbox is the asks waiting to go to one owner. The caller that finds it idle sends them,
// with every ask queued while it sends: callers that come while a message is on its way
// out go together in the next (one datagram for many decisions), and a lone caller's ask
// goes at once.
type outbox struct {
	mu      sync.Mutex
	pending []hits.Ask
	sending bool
}

func (a *asks) add() (uint64, chan hits.Answer) {
	ch := make(chan hits.Answer, 1)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.wait == nil {
		a.wait = map[uint64]chan hits.Answer{}
	}
	a.next++
	a.wait[a.next] = ch
	return a.next, ch
}

func (a *asks) done(id uint64) {
	a.mu.Lock()
	delete(a.wait, id)
	a.mu.Unlock()
}

// outbox returns owner's outbox, made if need be.
func (a *asks) outbox(owner string) *outbox {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.out == nil {
		a.out = map[string]*outbox{}
	}
	ob := a.out[owner]
	if ob == nil {
		ob = &outbox{}
		a.out[owner] = ob
	}
	return ob
}

// forget drops a gone peer's outbox (an ask still in it was sent, or is being).
func (a *asks) forget(owner string) {
	a.mu.Lock()
	delete(a.out, owner)
	a.mu.Unlock()
}

func (a *asks) answer(ans hits.Answer) {
	a.mu.Lock()
	ch := a.wait[ans.ID]
	delete(a.wait, ans.ID)
	a.mu.Unlock()
	if ch != nil {
		ch <- ans
	}
}

// nShards is how many cores a member runs, each with the same peers and its own tags,
// so that parallel decisions rarely wait for one another.
const nShards = 16

type shard struct {
	mu   sync.Mutex // guards node
	node *hits.Node
	_    [48]byte // one cache line each (64 bytes: TestShardIsOneCacheLine)
}

func (b *Backend) shard(key string) *shard {
	return &b.shards[maphash.String(b.seed, key)%nShards]
}

// each runs f on every shard's node, under its lock.
func (b *Backend) each(f func(i int, n *hits.Node)) {
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		f(i, s.node)
		s.mu.Unlock()
	}
}

type counters struct {
	msgsSent, msgsRecv, bytesSent, bytesRecv, sendErrs, streams atomic.Uint64
	forwarded, forwardResent, forwardTimeouts, askMessages      atomic.Uint64
}

var (
	_ backend.Backend    = (*Backend)(nil)
	_ backend.Allower    = (*Backend)(nil)
	_ backend.Resetter   = (*Backend)(nil)
	_ backend.Capable    = (*Backend)(nil)
	_ backend.ClassBoard = (*Backend)(nil)
)

// Capabilities: a key decided at its owner is one line that every process's callers share
// (SharedLine), so a limiter on this backend shares a key by process by default, each
// process holding a few places in the owner's line whatever its number of waiters
// (sluice.FairProcesses). A decision may keep part of the burst for a higher class
// (ByValue: backend.Request.Core), here and at the key's owner, and the members tell
// each other the classes that ask through each key's board of classes (ClassBoard,
// classes.go). Windowed quotas and ramps are not decided here.
func (*Backend) Capabilities() backend.Capabilities {
	return backend.Capabilities{SharedLine: true, ByValue: true}
}

// New starts a member: it binds, joins the peers it can reach (and exchanges state with
// the seed list again every second while it is alone or counts the pool differently from
// the membership: see rejoin), and starts reporting.
func New(cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Backend{cfg: cfg, clock: cfg.Clock, log: cfg.Logger, stop: make(chan struct{}), peers: map[string]memberlist.Node{}}
	if b.clock == nil {
		b.clock = clock.Default
	}
	if b.log == nil {
		b.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	host, port, _ := splitHostPort(cfg.Bind)
	mc := memberlist.DefaultLANConfig()
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertiseAddr, mc.AdvertisePort = host, port
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		mc.AdvertiseAddr = "" // all interfaces: memberlist advertises a private address
	}
	if cfg.Advertise != "" {
		h, p, _ := splitHostPort(cfg.Advertise)
		mc.AdvertiseAddr, mc.AdvertisePort = h, p
	}
	// Failure detection on a LAN: a crashed peer is declared dead in about two seconds
	// (the core holds its share meanwhile and for Hold after).
	mc.ProbeInterval = 500 * time.Millisecond
	mc.ProbeTimeout = 250 * time.Millisecond
	mc.SuspicionMult = 3
	mc.GossipInterval = 100 * time.Millisecond
	mc.PushPullInterval = 15 * time.Second
	mc.SecretKey = cfg.Key
	mc.GossipVerifyIncoming = cfg.Key != nil
	mc.GossipVerifyOutgoing = cfg.Key != nil
	mc.Delegate = delegate{b}
	mc.Events = events{b}
	mc.Logger = log.New(slogWriter{b.log}, "", 0)
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	inc := binary.LittleEndian.Uint64(seed[:]) | 1 // differs at every start: peers tell a restart
	mc.Name = cfg.Name
	if mc.Name == "" {
		h := mc.AdvertiseAddr
		if h == "" {
			h, _ = os.Hostname()
		}
		mc.Name = net.JoinHostPort(h, strconv.Itoa(mc.AdvertisePort))
		if mc.AdvertisePort == 0 { // a port the system picks: a random name instead
			mc.Name = "sluice-" + strconv.FormatUint(inc, 36)
		}
	}
	b.self = mc.Name
	b.seed = maphash.MakeSeed()
	core := cfg.core()
	core.MaxTags = (cfg.MaxTags + nShards - 1) / nShards
	for i := range b.shards {
		node, err := hits.New(mc.Name, inc, core, b.clock.Nanotime())
		if err != nil {
			return nil, err
		}
		b.shards[i].node = node
	}
	tr, err := cfg.transport(mc)
	if err != nil {
		return nil, err
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		if tr != nil {
			_ = tr.Shutdown()
		}
		return nil, fmt.Errorf("sluice: gossip: %w", err)
	}
	b.ml = ml
	if len(cfg.Peers) > 0 {
		if n, err := ml.Join(cfg.Peers); err != nil {
			b.log.Info("gossip: no peer reached yet; retrying", "peers", cfg.Peers, "err", err)
		} else {
			b.log.Info("gossip: joined", "peers", n)
		}
	}
	b.wg.Add(1)
	go b.loop()
	if len(cfg.Peers) > 0 {
		b.wg.Add(1)
		go b.rejoin()
	}
	return b, nil
}

// Addr returns the address peers reach this member at.
func (b *Backend) Addr() string {
	n := b.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Name returns the member's name in the pool.
func (b *Backend) Name() string { return b.ml.LocalNode().Name }

// loop reports every interval.
func (b *Backend) loop() {
	defer b.wg.Done()
	t := b.clock.NewTimer(b.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C():
		}
		t.Reset(b.cfg.Interval)
		now := b.clock.Nanotime()
		var rs []hits.Report
		b.each(func(_ int, n *hits.Node) { rs = merge(rs, n.Sync(now)) })
		b.sendAll(rs)
	}
}

// merge adds the reports of one shard to those of the others: one report for each peer
// (To) and kind.
func merge(into, rs []hits.Report) []hits.Report {
	for _, r := range rs {
		k := slices.IndexFunc(into, func(x hits.Report) bool { return x.To == r.To && x.Tree == r.Tree })
		if k < 0 {
			into = append(into, r)
		} else {
			into[k].Entries = append(into[k].Entries, r.Entries...)
		}
	}
	return into
}

// sendAll sends reports: one for every peer (To "") to each, the others to their peer.
func (b *Backend) sendAll(rs []hits.Report) {
	for i := range rs {
		r := &rs[i]
		if r.To == "" {
			b.send(r)
			continue
		}
		// sendTo sends a part larger than a datagram over a stream.
		parts, _ := encodeReport(r)
		for _, p := range parts {
			b.sendTo(r.To, p)
		}
	}
}

// RejoinEvery is how often a member exchanges the membership's state with its seed list
// while it is alone or its count of the pool and the membership's disagree (rejoin). On a
// network that delivers, a member cut from every peer counts them again within two rounds
// of the heal. Until then it decides as if alone, so the partition's length P in the bound
// of docs/gossip.md, "Partitions", runs until then.
const RejoinEvery = time.Second

// rejoin pushes and pulls the membership's state with the seed list every RejoinEvery
// while this member is alone or its count of the pool and memberlist's disagree, and once
// more after they agree again. The exchange is what revives the peers that memberlist
// holds suspect or dead after a partition. docs/gossip.md, "Partitions", says why being
// alone is not enough to see a partition end.
//
// It runs apart from loop: a join waits for the seeds it cannot reach (memberlist's TCP
// time-out), and reports to the peers it can reach must not wait with it.
func (b *Backend) rejoin() {
	defer b.wg.Done()
	t := b.clock.NewTimer(RejoinEvery)
	defer t.Stop()
	again := false
	for {
		select {
		case <-b.stop:
			return
		case <-t.C():
		}
		t.Reset(RejoinEvery)
		n := b.ml.NumMembers()
		if n > 1 && b.Members() == n {
			if !again {
				continue
			}
			again = false
		} else {
			again = true
		}
		if _, err := b.ml.Join(b.cfg.Peers); err == nil {
			b.log.Info("gossip: joined", "peers", b.cfg.Peers)
		}
	}
}

// encodeReport encodes r as a few datagrams, or, when it needs more (or an entry does not
// fit one), as parts for a stream.
func encodeReport(r *hits.Report) (parts [][]byte, stream bool) {
	parts, skipped := hits.Encode(r, packetMax)
	if stream = skipped > 0 || len(parts) > udpParts; stream {
		parts, _ = hits.Encode(r, streamPart)
	}
	return parts, stream
}

// send sends a report to every other member: as datagrams when it is a few parts, over a
// stream otherwise. Nothing is truncated: an entry too large for a datagram goes by stream.
func (b *Backend) send(r *hits.Report) {
	self := b.self
	b.peersMu.Lock()
	members := make([]memberlist.Node, 0, len(b.peers))
	for _, n := range b.peers {
		if n.Name != self {
			members = append(members, n)
		}
	}
	b.peersMu.Unlock()
	if len(members) == 0 {
		return
	}
	parts, stream := encodeReport(r)
	for i := range members {
		m := &members[i]
		for _, p := range parts {
			var err error
			if stream {
				err = b.ml.SendReliable(m, p)
				b.stats.streams.Add(1)
			} else {
				err = b.ml.SendBestEffort(m, p)
			}
			if err != nil {
				b.stats.sendErrs.Add(1)
				continue
			}
			b.stats.msgsSent.Add(1)
			b.stats.bytesSent.Add(uint64(len(p)))
		}
	}
}

// receive applies a message from a peer: a report, a forwarded request (decided here, as
// the key's owner, and answered) or an owner's answer.
func (b *Backend) receive(msg []byte) {
	b.stats.msgsRecv.Add(1)
	b.stats.bytesRecv.Add(uint64(len(msg)))
	switch hits.MessageKind(msg) {
	case hits.KindAsk, hits.KindAskKept:
		b.answer(msg)
		return
	case hits.KindClasses:
		b.classes(msg)
		return
	case hits.KindAnswer:
		as, err := hits.DecodeAnswers(msg)
		if err != nil {
			b.malformed()
		}
		for _, a := range as {
			b.asks.answer(a)
		}
		return
	}
	rs, err := hits.Decode(msg)
	if err != nil {
		b.malformed()
		return
	}
	now := b.clock.Nanotime()
	for i := range rs {
		// Each shard hears the report (the sender is alive) with its own tags' entries.
		var parts [nShards][]hits.Entry
		for _, e := range rs[i].Entries {
			k := maphash.String(b.seed, e.Tag) % nShards
			parts[k] = append(parts[k], e)
		}
		var relays []hits.Report
		b.each(func(k int, n *hits.Node) {
			r := rs[i]
			r.Entries = parts[k]
			n.Receive(now, &r)
			relays = merge(relays, n.Relays())
		})
		b.sendAll(relays)
	}
}

func (b *Backend) malformed() {
	s := &b.shards[0]
	s.mu.Lock()
	s.node.CountMalformed()
	s.mu.Unlock()
}

// answer decides the requests a peer forwarded here, as their keys' owner, and sends the
// decisions back, as many to a datagram as fit.
func (b *Backend) answer(msg []byte) {
	from, asks, err := hits.DecodeAsks(msg)
	if err != nil {
		b.malformed()
		return
	}
	b.peersMu.Lock()
	_, known := b.peers[from]
	b.peersMu.Unlock()
	if !known {
		// A peer the membership has not told this member of yet: its answer could not be
		// sent, and a member that knows no peer would decide as an owner unfenced, as if
		// alone in a new pool (a member that replaced a killed owner granted the key's
		// burst again so: docs/robustness.md). The asker sends it again (ForwardResend).
		return
	}
	out := make([]hits.Answer, 0, len(asks))
	for i := range asks {
		a := &asks[i]
		ans := hits.Answer{ID: a.ID}
		now := b.clock.Nanotime()
		s := b.shard(a.Tag)
		var tk gcra.Ticket
		kept := a.Limits
		if a.Kept != nil {
			kept = a.Kept
		}
		s.mu.Lock()
		err := s.node.DecideKept(&ans.Result, &tk, a.Tag, a.Limits, kept, now, a.N, a.MaxDelay)
		s.mu.Unlock()
		switch {
		case errors.Is(err, hits.ErrTooManyTags):
			ans.Outcome = hits.TooMany
		case err != nil:
			ans.Outcome = hits.Malformed
		case ans.Result.Allowed:
			ans.Outcome = hits.Granted
		}
		out = append(out, ans)
	}
	for len(out) > 0 {
		k := min(len(out), answersPerMessage)
		b.sendTo(from, hits.EncodeAnswers(out[:k]))
		out = out[k:]
	}
}

// answersPerMessage: an answer is at most 2 + 1 + 4×10 bytes; so many fit a datagram.
const answersPerMessage = (packetMax - 8) / 43

// post queues an ask for owner and, if nobody is sending to it, sends the outbox's asks,
// again while more came meanwhile.
func (b *Backend) post(owner string, a hits.Ask) {
	ob := b.asks.outbox(owner)
	ob.mu.Lock()
	ob.pending = append(ob.pending, a)
	if ob.sending {
		ob.mu.Unlock()
		return
	}
	ob.sending = true
	for len(ob.pending) > 0 {
		batch := ob.pending
		ob.pending = nil
		ob.mu.Unlock()
		b.sendAsks(owner, batch)
		ob.mu.Lock()
	}
	ob.sending = false
	ob.mu.Unlock()
}

// sendAsks sends asks to owner, as many to a datagram as fit (an ask too large for one
// goes alone, over a stream).
func (b *Backend) sendAsks(owner string, asks []hits.Ask) {
	head := hits.AsksHeader(len(b.self))
	var buf []byte
	for len(asks) > 0 {
		k, size := 0, head
		for k < len(asks) {
			buf = hits.AppendAsk(buf[:0], &asks[k])
			// A byte a limit more: in a message of asks that keep part of the burst, an
			// ask that keeps none takes one (hits.AppendAsk).
			n := len(buf) + len(asks[k].Limits)
			if k > 0 && size+n > packetMax {
				break
			}
			size += n
			k++
		}
		if !b.sendTo(owner, hits.EncodeAsks(b.self, asks[:k])) {
			return // the callers time out (or are sent again)
		}
		b.stats.askMessages.Add(1)
		asks = asks[k:]
	}
}

// sendTo sends one message to the named peer: as a datagram when it fits one, over a
// stream otherwise. It reports whether it was sent.
func (b *Backend) sendTo(name string, msg []byte) bool {
	b.peersMu.Lock()
	n, ok := b.peers[name]
	b.peersMu.Unlock()
	if !ok {
		b.stats.sendErrs.Add(1)
		return false
	}
	var err error
	if len(msg) <= packetMax {
		err = b.ml.SendBestEffort(&n, msg)
	} else {
		err = b.ml.SendReliable(&n, msg)
		b.stats.streams.Add(1)
	}
	if err != nil {
		b.stats.sendErrs.Add(1)
		return false
	}
	b.stats.msgsSent.Add(1)
	b.stats.bytesSent.Add(uint64(len(msg)))
	return true
}

// forward asks key's owner to decide req, and waits for its answer: at most
// ForwardTimeout or ctx's deadline. No answer is ErrUnavailable (the server's fail mode
// then answers). A grant's Delay counts from the answer's arrival here, later than the
// owner's decision: a caller that waits it waits no less than the owner booked.
//
// A request that keeps part of the burst for a higher class (req.Core set) goes with its
// kept limits to an owner that reads them (readsClasses); an owner of an earlier release
// decides it under the key's own limits, as it did before classes.
func (b *Backend) forward(ctx context.Context, owner, key string, req backend.Request) (backend.Grant, error) {
	id, ch := b.asks.add()
	defer b.asks.done(id)
	ask := hits.Ask{ID: id, Tag: key, N: req.N, MaxDelay: int64(req.MaxDelay), Limits: req.Limits}
	b.peersMu.Lock()
	n, known := b.peers[owner]
	b.peersMu.Unlock()
	if !known {
		return backend.Grant{}, backend.ErrUnavailable
	}
	if req.Core != nil {
		ask.Limits = req.Core
		if readsClasses(&n) {
			ask.Kept = req.Limits
		}
	}
	b.post(owner, ask)
	b.stats.forwarded.Add(1)
	// A datagram may be lost (a full socket buffer will do it on a loaded host): the ask
	// goes again every ForwardResend until ForwardTimeout. Two may arrive: the owner then
	// decides it twice, and the second grant goes unused (never more admitted).
	t := b.clock.NewTimer(ForwardResend)
	defer t.Stop()
	for left := ForwardTimeout - ForwardResend; ; left -= ForwardResend {
		select {
		case a := <-ch:
			switch a.Outcome {
			case hits.TooMany:
				return backend.Grant{}, backend.ErrTooManyKeys
			case hits.Malformed:
				return backend.Grant{}, fmt.Errorf("sluice: gossip: the owner %s refused the request", owner)
			}
			return backend.Grant{Result: a.Result}, nil
		case <-t.C():
			if left <= 0 {
				b.stats.forwardTimeouts.Add(1)
				return backend.Grant{}, backend.ErrUnavailable
			}
			b.stats.forwardResent.Add(1)
			b.post(owner, ask)
			t.Reset(min(ForwardResend, left))
		case <-ctx.Done():
			return backend.Grant{}, ctx.Err()
		case <-b.stop:
			return backend.Grant{}, backend.ErrClosed
		}
	}
}

type delegate struct{ b *Backend }

// leavingMeta is the node meta of a member that is closing: its peers take the leave that
// follows for a graceful one. memberlist cannot tell them: the Node it hands NotifyLeave
// does not carry the state (left or dead) that it keeps beside it.
var leavingMeta = []byte("sluice-leaving")

func (d delegate) NodeMeta(int) []byte {
	if d.b.leaving.Load() {
		return leavingMeta
	}
	return classesMeta
}
func (d delegate) NotifyMsg(msg []byte)              { d.b.receive(msg) }
func (delegate) GetBroadcasts(int, int) [][]byte     { return nil }
func (delegate) LocalState(bool) []byte              { return nil }
func (delegate) MergeRemoteState(buf []byte, _ bool) {}

type events struct{ b *Backend }

// setPeer keeps a copy of a peer's node (called from memberlist's notifications, under
// its lock: the copy is consistent).
func (b *Backend) setPeer(n *memberlist.Node) {
	b.peersMu.Lock()
	b.peers[n.Name] = *n
	b.peersMu.Unlock()
}

func (e events) NotifyJoin(n *memberlist.Node) {
	// The core first: a peer this member can answer (answer) is one its core counts.
	now := e.b.clock.Nanotime()
	e.b.each(func(_ int, h *hits.Node) { h.Join(n.Name, now) })
	e.b.setPeer(n)
	e.b.log.Info("gossip: peer joined", "peer", n.Name)
}

func (e events) NotifyLeave(n *memberlist.Node) {
	e.b.peersMu.Lock()
	delete(e.b.peers, n.Name)
	e.b.peersMu.Unlock()
	e.b.asks.forget(n.Name)
	graceful := bytes.Equal(n.Meta, leavingMeta)
	now := e.b.clock.Nanotime()
	e.b.each(func(_ int, h *hits.Node) { h.Leave(n.Name, now, graceful) })
	e.b.log.Info("gossip: peer gone", "peer", n.Name, "graceful", graceful)
}

func (e events) NotifyUpdate(n *memberlist.Node) { e.b.setPeer(n) }

// slogWriter turns memberlist's log lines ("[WARN] memberlist: ...") into slog records.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	s := strings.TrimSpace(string(p))
	lvl := slog.LevelDebug
	switch {
	case strings.HasPrefix(s, "[ERR]"):
		lvl = slog.LevelError
	case strings.HasPrefix(s, "[WARN]"):
		lvl = slog.LevelWarn
	}
	w.l.Log(context.Background(), lvl, s)
	return len(p), nil
}

// Decide decides a request locally, on the pool's bucket as this member knows it and on
// its share, or forwards it to the key's owner. Under req.Core's limits it keeps what
// req.Limits keep of the burst for a higher class (backend.Request).
func (b *Backend) Decide(ctx context.Context, key string, req backend.Request) (backend.Grant, error) {
	if b.closed.Load() {
		return backend.Grant{}, backend.ErrClosed
	}
	var g backend.Grant
	core := req.Limits
	if req.Core != nil {
		core = req.Core // req.Limits keep part of the burst for a higher class
	}
	now := b.clock.Nanotime() // outside the lock: reading the clock is a fair part of a decision
	s := b.shard(key)
	s.mu.Lock()
	if owner, _ := s.node.Route(key, core); owner != "" {
		s.mu.Unlock()
		return b.forward(ctx, owner, key, req)
	}
	err := s.node.DecideKept(&g.Result, &g.Ticket, key, core, req.Limits, now, req.N, int64(req.MaxDelay))
	s.mu.Unlock()
	if errors.Is(err, hits.ErrTooManyTags) {
		err = backend.ErrTooManyKeys
	}
	return g, err
}

// AllowOne is Decide for one permit under one limit, now or not at all: the limiter's
// fast path for Allow.
func (b *Backend) AllowOne(ctx context.Context, key string, l gcra.Limit) (bool, error) {
	if b.closed.Load() {
		return false, backend.ErrClosed
	}
	ls := [1]gcra.Limit{l}
	var res gcra.Result
	var tk gcra.Ticket
	now := b.clock.Nanotime()
	s := b.shard(key)
	s.mu.Lock()
	if owner, _ := s.node.Route(key, ls[:]); owner != "" {
		s.mu.Unlock()
		g, err := b.forward(ctx, owner, key, backend.Request{Limits: ls[:], N: 1})
		return g.Allowed, err
	}
	err := s.node.DecideTo(&res, &tk, key, ls[:], now, 1, 0)
	s.mu.Unlock()
	if errors.Is(err, hits.ErrTooManyTags) {
		err = backend.ErrTooManyKeys
	}
	return res.Allowed, err
}

// Adjust settles a grant: more is charged and reported; less is given back to this
// member's share (peers keep what they were told).
func (b *Backend) Adjust(_ context.Context, key string, limits []gcra.Limit, t gcra.Ticket, newN int64) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	s := b.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.node.Adjust(key, limits, b.clock.Nanotime(), t, newN)
	return err
}

// Penalize holds key back for d here, and at the peers from the next report.
func (b *Backend) Penalize(_ context.Context, key string, limits []gcra.Limit, d time.Duration) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	s := b.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := b.clock.Nanotime()
	return s.node.Penalize(key, limits, now, gcra.After(now, int64(d)))
}

// Reset forgets key at this member (peers keep what they were told).
func (b *Backend) Reset(_ context.Context, key string) error {
	if b.closed.Load() {
		return backend.ErrClosed
	}
	s := b.shard(key)
	s.mu.Lock()
	s.node.Reset(key)
	s.mu.Unlock()
	return nil
}

// Members returns the pool size this member counts on: itself and every peer live or
// still held after it was lost (the largest recently known membership).
func (b *Backend) Members() int {
	s := &b.shards[0]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.node.Members()
}

// Close leaves the pool gracefully (peers free this member's share at once) and stops.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	close(b.stop)
	b.wg.Wait()
	if b.ml.NumMembers() > 1 {
		// First say it is leaving (an update of its meta that its peers apply before the
		// leave, which memberlist sends after it), so they free its share at once.
		b.leaving.Store(true)
		_ = b.ml.UpdateNode(time.Second)
	}
	err := b.ml.Leave(time.Second)
	if serr := b.ml.Shutdown(); err == nil {
		err = serr
	}
	return err
}

// Sent returns the bytes of gossip this member has sent (report parts, before memberlist's
// own framing and encryption).
func (b *Backend) Sent() float64 { return float64(b.stats.bytesSent.Load()) }
