// Package store is the contract of the stores that the strict and lease modes share state
// through (Store: records read with the store's time and written by compare-and-set), an
// in-process store (Memory), and Open, which opens a store from a URL. The Redis, etcd and
// ZooKeeper stores live in packages store/redis, store/etcd and store/zk, so that a
// program links only the clients of the stores it imports; store/storetest is the
// conformance suite every store passes.
package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Store keeps small records (a few hundred bytes each) read with the store's time and
// written by compare-and-set. The modes that share state through a store do their
// arithmetic in Go, in every member's process. The lease mode's allocation reads the
// records a batch of requests needs, applies the requests, and writes back every record
// whose version is unchanged, retrying the others. The strict mode's compare-and-set path
// does the same with one GCRA state per key. So a store is only this small contract, the
// same for Memory (in process), the stores of packages store/redis, store/etcd and
// store/zk, and any store a user writes. docs/lease.md states what each store guarantees.
//
// Both methods are safe for concurrent use, may block for a round trip bounded by ctx,
// and return backend.ErrUnavailable (wrapped) when the store cannot be reached. They must
// not retain the slices passed.
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
	// still in use, so it is made fenced. Fresh: the store knows no lease was
	// ever granted from a record it no longer has (a new Memory), and a store that
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

// Fresh is the Since of a store that knows no lease was ever granted from a record it no
// longer has (a new Memory): nothing it makes is fenced.
const Fresh int64 = math.MinInt64

// DefaultTimeout bounds each command of a client that Open makes.
const DefaultTimeout = 500 * time.Millisecond

// Config is what the Options of Open and of each store's constructor set.
type Config struct {
	// Prefix comes before every record's name in the store: a Redis or etcd key prefix,
	// or a ZooKeeper path (its colons made slashes). "" keeps the store's default.
	Prefix string
	// Timeout bounds each command of a client that Open makes (0: DefaultTimeout).
	Timeout time.Duration
	// Now, if not nil, is read instead of the store's own clock (Redis' TIME, ZooKeeper's
	// leader; etcd has none and reads the machine's): Unix nanoseconds, for tests and
	// simulations of members whose clocks disagree.
	Now func() int64
	// AssumeFresh makes a store that can tell (Redis) answer Since as a store that knows
	// no lease was granted from it before (Fresh): nothing it makes is fenced at its
	// first use. For tests, and for a store known to be new: on a store whose records
	// were lost while leases were in use it admits too much for TTL + Grace.
	AssumeFresh bool
}

// Option sets a field of Config.
type Option func(*Config)

// WithPrefix sets Config.Prefix.
func WithPrefix(p string) Option { return func(c *Config) { c.Prefix = p } }

// WithTimeout sets Config.Timeout.
func WithTimeout(d time.Duration) Option { return func(c *Config) { c.Timeout = d } }

// WithNow sets Config.Now.
func WithNow(now func() int64) Option { return func(c *Config) { c.Now = now } }

// WithAssumeFresh sets Config.AssumeFresh.
func WithAssumeFresh() Option { return func(c *Config) { c.AssumeFresh = true } }

// NewConfig applies opts to the zero Config, with Timeout defaulted.
func NewConfig(opts ...Option) Config {
	var c Config
	for _, o := range opts {
		o(&c)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	return c
}

// Handle is a store that Open made: it owns the client it connected with.
type Handle interface {
	Store
	// Ping reports whether the store answers now.
	Ping(ctx context.Context) error
	// Close closes the client. The Handle is not usable after.
	Close() error
}

// Opener opens a store from a URL of the schemes it was registered for.
type Opener func(ctx context.Context, url string, cfg Config) (Handle, error)

// Parser reads a URL of the schemes it was registered for as its Opener would, without a
// client: Check's answer for them.
type Parser func(url string) error

var (
	openersMu sync.RWMutex
	openers   = map[string]Opener{}
	parsers   = map[string]Parser{}
)

// RegisterParser makes Check (and so Open, first) read URLs of the given schemes with
// parse. A store's package registers it beside its Opener.
func RegisterParser(parse Parser, schemes ...string) {
	openersMu.Lock()
	defer openersMu.Unlock()
	for _, s := range schemes {
		parsers[s] = parse
	}
}

// Register makes Open use open for URLs of the given schemes. The packages of the stores
// register themselves when imported (store/redis for redis, rediss, redis-cluster and
// redis-sentinel; store/etcd for etcd; store/zk for zk), so that a program links only
// the clients of the stores it imports. It panics if a scheme is registered twice.
func Register(open Opener, schemes ...string) {
	openersMu.Lock()
	defer openersMu.Unlock()
	for _, s := range schemes {
		if _, dup := openers[s]; dup {
			panic("store: scheme " + s + " registered twice")
		}
		openers[s] = open
	}
}

// ErrBadRecord is wrapped by the errors about a record that does not decode: another
// program's data under the store's prefix, or corruption.
var ErrBadRecord = errors.New("sluice: bad record")

// ErrConflict is wrapped by the errors of a call that kept losing the compare-and-set on
// its records to other processes' writes, as many times as its mode tries: the lease
// mode's allocation and the strict mode's compare-and-set path return it.
var ErrConflict = errors.New("sluice: too many conflicting writes")

// ErrBadURL is wrapped by Open's errors about a URL it cannot use.
var ErrBadURL = errors.New("sluice: bad store url")

// storePackages names the package that registers each scheme, for the error of a URL
// whose store is not linked.
var storePackages = map[string]string{
	"redis": "store/redis", "rediss": "store/redis", "redis-cluster": "store/redis",
	"redis-sentinel": "store/redis", "etcd": "store/etcd", "zk": "store/zk",
}

// Schemes lists the URL schemes Open knows: memory and the registered ones, sorted.
func Schemes() []string {
	openersMu.RLock()
	defer openersMu.RUnlock()
	s := []string{"memory"}
	for k := range openers {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

// Open opens the store rawURL names:
//
//	memory://                             a new Memory (this process only)
//	redis://[user:pass@]host:port[/db]    one Redis (rediss:// with TLS)
//	redis-cluster://host:port,host:port   a Redis Cluster (any of its nodes)
//	redis-sentinel://host:port,.../MASTER[/DB]  a master found through Sentinel
//	etcd://host:port,host:port            an etcd cluster (any of its members)
//	zk://host:port,host:port[/path]       a ZooKeeper ensemble (records under path)
//
// A scheme works when its store's package is linked (imported, if only as _): Open's
// error names the package otherwise. Open fails on a bad URL; a store that does not
// answer yet is not an error (ask Ping).
func Open(ctx context.Context, rawURL string, opts ...Option) (Handle, error) {
	cfg := NewConfig(opts...)
	if err := Check(rawURL); err != nil {
		return nil, err
	}
	scheme, _, _ := strings.Cut(rawURL, "://")
	if scheme == "memory" {
		return memoryHandle{NewMemory(nil)}, nil
	}
	openersMu.RLock()
	open := openers[scheme]
	openersMu.RUnlock()
	return open(ctx, rawURL, cfg)
}

// Check reports whether Open would take rawURL: a scheme it knows, whose store is linked,
// and a URL that store reads (its hosts, ports, names: each store's package registers its
// reading with RegisterParser). It makes no client and reaches nothing, so a daemon's
// configuration check gives the answer its start would.
func Check(rawURL string) error {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		if host, port, err := net.SplitHostPort(rawURL); err == nil && host != "" && port != "" {
			return fmt.Errorf("%w %q: no scheme (write redis://%s for a Redis)", ErrBadURL, rawURL, rawURL)
		}
		return fmt.Errorf("%w %q: want SCHEME://... (%s)", ErrBadURL, rawURL, strings.Join(Schemes(), ", "))
	}
	if scheme == "memory" {
		return nil
	}
	openersMu.RLock()
	open, parse := openers[scheme], parsers[scheme]
	openersMu.RUnlock()
	if open == nil {
		if pkg, known := storePackages[scheme]; known {
			return fmt.Errorf("%w %q: the %s store is not linked into this program (import _ \"github.com/sluicehq/sluice/%s\")",
				ErrBadURL, rawURL, scheme, pkg)
		}
		return fmt.Errorf("%w %q: unknown scheme %q (known: %s)", ErrBadURL, rawURL, scheme, strings.Join(Schemes(), ", "))
	}
	if parse != nil {
		if err := parse(rawURL); err != nil {
			if errors.Is(err, ErrBadURL) {
				return err
			}
			// The store's own words, under ErrBadURL, with one "sluice: " before them.
			return fmt.Errorf("%w: %s", ErrBadURL, strings.TrimPrefix(err.Error(), "sluice: "))
		}
	}
	return nil
}

type memoryHandle struct{ *Memory }

func (memoryHandle) Ping(context.Context) error { return nil }
func (memoryHandle) Close() error               { return nil }

// Latest keeps the latest time a store read or saw stamped in a record, so that the
// store's time never goes back (etcd's and ZooKeeper's stores time records on it). Its
// zero value is ready; it is safe for concurrent use.
type Latest struct{ v atomic.Int64 }

// Raise makes the latest time at least t and returns it.
func (l *Latest) Raise(t int64) int64 {
	for {
		cur := l.v.Load()
		if cur >= t {
			return cur
		}
		if l.v.CompareAndSwap(cur, t) {
			return t
		}
	}
}

// Load returns the latest time.
func (l *Latest) Load() int64 { return l.v.Load() }

// StampLen is the size of the time stamp (big-endian Unix nanoseconds) that the etcd and
// ZooKeeper stores put before each record's data.
const StampLen = 8

// Hosts is the host list of a URL's part after "SCHEME://", before any path or query and
// after any user information: what the etcd, ZooKeeper and Redis Cluster stores dial.
func Hosts(rest string) string {
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	return rest
}

// CheckHosts checks the hosts of a URL (rest: what follows its scheme's "://"): at least
// one, each HOST:PORT with a numeric port; want shows the form in the error.
func CheckHosts(rawURL, rest, want string) error {
	hosts := Hosts(rest)
	if hosts == "" {
		return fmt.Errorf("%w %q: no host (want %s)", ErrBadURL, rawURL, want)
	}
	for _, h := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" {
			return fmt.Errorf("%w %q: %q is not HOST:PORT (want %s)", ErrBadURL, rawURL, h, want)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%w %q: port %q of %q is not a number from 1 to 65535 (want %s)", ErrBadURL, rawURL, port, h, want)
		}
	}
	return nil
}
