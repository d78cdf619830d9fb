package sim

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/internal/limitconv"
	"github.com/sluicehq/sluice/internal/yamlx"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/priority"
	"github.com/sluicehq/sluice/referee"
)

// Scenario is one simulated situation, read from a YAML file (see docs/simulator.md).
type Scenario struct {
	Name        string   `yaml:"name"`
	Description string   `yaml:"description"`
	Duration    Duration `yaml:"duration"`
	Seed        uint64   `yaml:"seed"`
	Limit       Limits   `yaml:"limit"`
	Modes       []string `yaml:"modes"`
	Sample      Duration `yaml:"sample"` // time-series bucket
	Network     Network  `yaml:"network"`
	Store       Store    `yaml:"store"`
	Client      Client   `yaml:"client"`
	Local       Local    `yaml:"local"`
	Lease       Lease    `yaml:"lease"`
	Gossip      Gossip   `yaml:"gossip"`
	Referee     Referee  `yaml:"referee"`
	Members     []Group  `yaml:"members"`
	Events      []Event  `yaml:"events"`

	file string
}

// Network is the simulated network: the links from members to the store and to the API.
type Network struct {
	Store Link `yaml:"store"`
	API   Link `yaml:"api"`
}

// Link is one direction-agnostic link: each message takes a latency drawn from Latency,
// and is lost with probability Loss.
type Link struct {
	Latency Dist    `yaml:"latency"`
	Loss    float64 `yaml:"loss"`
	line    int
}

// Dist is a latency distribution: fixed (value), uniform (min, max), exp (mean, shifted by
// min) or normal (mean, sd, never below min).
type Dist struct {
	Kind  string   `yaml:"dist"`
	Value Duration `yaml:"value"`
	Min   Duration `yaml:"min"`
	Max   Duration `yaml:"max"`
	Mean  Duration `yaml:"mean"`
	SD    Duration `yaml:"sd"`
	line  int
}

// Store is the simulated central store (the strict mode's model).
type Store struct {
	Timeout       Duration `yaml:"timeout"`        // a member gives up on an answer after this
	FailMode      string   `yaml:"fail_mode"`      // closed, open or local
	FallbackShare float64  `yaml:"fallback_share"` // local: the share of the limit a cut-off member uses
	line          int
}

// Client is how members ask for permits: the limiter's settings.
type Client struct {
	MaxWait Duration `yaml:"max_wait"` // how far ahead a decision may reserve (not a bound on a request's wait); 0 is pessimistic
	Margin  Duration `yaml:"margin"`   // jitter tolerance
	OnDeny  string   `yaml:"on_deny"`  // retry (with back-off) or drop
	Backoff Backoff  `yaml:"backoff"`
	line    int
}

// Backoff is the jittered back-off of a denied request.
type Backoff struct {
	Base   Duration `yaml:"base"`
	Max    Duration `yaml:"max"`
	Jitter float64  `yaml:"jitter"`
}

// Local are the local mode's settings: the share of the limit its limiter decides on, and
// whether the members are one process sharing that limiter (processes: one, the default)
// or each a process of its own with a limiter of its own (each).
type Local struct {
	Share     float64 `yaml:"share"`
	Processes string  `yaml:"processes"` // one (default) or each
	line      int
}

// oneProcess reports whether the local mode's members are one process (local.processes).
func (l *Local) oneProcess() bool { return l.Processes != "each" }

func (x *Local) UnmarshalYAML(n *yaml.Node) error {
	type plain Local
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}

// Lease are the lease mode's settings: the store's (ttl, grace, policy, join_window)
// and the members' (renew, margin, fail_mode). Zero values take the lease package's
// defaults.
type Lease struct {
	TTL        Duration `yaml:"ttl"`
	Grace      Duration `yaml:"grace"`
	Policy     string   `yaml:"policy"` // fair (default) or equal
	JoinWindow Duration `yaml:"join_window"`
	Renew      Duration `yaml:"renew"`
	Margin     Duration `yaml:"margin"`
	FailMode   string   `yaml:"fail_mode"` // local (default) or closed
	line       int
}

// Gossip are the gossip mode's settings: the sync interval, how long a lost peer keeps
// its share, and the policy (auto, owner, shares, equal, or whole: the DThrottle design as
// written). Zero
// values take the defaults. Members' reports travel over the store link (its latency and
// loss); a partition cuts its members from those outside it.
type Gossip struct {
	Interval Duration `yaml:"interval"`
	Hold     Duration `yaml:"hold"`
	Policy   string   `yaml:"policy"`
	line     int
}

func (x *Gossip) UnmarshalYAML(n *yaml.Node) error {
	type plain Gossip
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}

// Referee is how the API answers: the header fields it writes, and an LLM-style API's
// limits on tokens, each request costing its demand's tokens.
type Referee struct {
	Style  string  `yaml:"style"`  // ietf (default), openai, anthropic, heroku (RateLimit-Remaining alone) or bare (Retry-After alone)
	Tokens *Limits `yaml:"tokens"` // e.g. 40000/m: tokens per minute
	style  referee.Style
	line   int
}

// TokenRange is the cost of each request in tokens, drawn uniformly from Min to Max
// (the documents of random length an LLM pool summarises).
type TokenRange struct {
	Min int64 `yaml:"min"`
	Max int64 `yaml:"max"`
}

// Group is a set of identical members, named NAME1..NAMEn.
type Group struct {
	Name       string   `yaml:"name"`
	Count      int      `yaml:"count"`
	Goroutines int      `yaml:"goroutines"`
	Demand     Demand   `yaml:"demand"`
	Join       Duration `yaml:"join"`
	Leave      Duration `yaml:"leave"` // 0: stays
	// Priority is the class of the members' calls: critical, standard (the default) or
	// sheddable (docs/priorities.md); the report then gives each class's part (per_class).
	Priority string `yaml:"priority"`
	line     int
}

// Demand is a member's pattern of requests.
type Demand struct {
	Pattern string     `yaml:"pattern"` // constant, poisson, onoff, diurnal, backlog, times
	Rate    float64    `yaml:"rate"`    // requests per second (onoff: while on; diurnal: the mean)
	N       int64      `yaml:"n"`       // backlog: requests waiting at join
	On      Duration   `yaml:"on"`      // onoff: mean length of an on spell
	Off     Duration   `yaml:"off"`     // onoff: mean length of an off spell
	Swing   float64    `yaml:"swing"`   // diurnal: relative amplitude in [0, 1]
	Period  Duration   `yaml:"period"`  // diurnal: default 24h
	Phase   Duration   `yaml:"phase"`   // diurnal: shifts the cycle (half a period: opposite)
	Times   []Duration `yaml:"times"`   // times: one request at each time after join
	Tokens  TokenRange `yaml:"tokens"`  // each request's cost in tokens (a referee with token limits)
	line    int
}

// Event is something that happens at a time. Exactly one of its kinds is set.
type Event struct {
	At           Duration  `yaml:"at"`
	Crash        Targets   `yaml:"crash"`         // members stop at once, giving nothing back
	Leave        Targets   `yaml:"leave"`         // members leave gracefully
	Join         Targets   `yaml:"join"`          // members join (again)
	Pause        Targets   `yaml:"pause"`         // members freeze for For
	StoreOutage  *Duration `yaml:"store_outage"`  // the store is down for this long
	Partition    Targets   `yaml:"partition"`     // members are cut from the store for For
	Heal         bool      `yaml:"heal"`          // every partition heals
	Limit        *Limits   `yaml:"limit"`         // the API's limit (and the members') changes
	StoreRestart bool      `yaml:"store_restart"` // the store restarts empty
	For          Duration  `yaml:"for"`
	line         int
}

// Targets names members: a member (w3), a group (w: all its members), or "all".
type Targets []string

// UnmarshalYAML accepts one name or a list.
func (t *Targets) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*t = Targets{n.Value}
		return nil
	case yaml.SequenceNode:
		var s []string
		if err := n.Decode(&s); err != nil {
			return yamlx.At(n, "want a member name or a list of them")
		}
		*t = s
		return nil
	}
	return yamlx.At(n, "want a member name or a list of them")
}

// Duration is a time.Duration read from "10s", "1h30m" or "2d".
type Duration = yamlx.Duration

func parseDuration(s string) (time.Duration, error) { return yamlx.ParseDuration(s) }

// Limits is sluice.Limits read from its text form.
type Limits = yamlx.Limits

// Line-keeping decoders: each struct remembers the line it started on, for errors found
// after decoding.

func (x *Link) UnmarshalYAML(n *yaml.Node) error {
	type plain Link
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}
func (x *Dist) UnmarshalYAML(n *yaml.Node) error {
	type plain Dist
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}
func (x *Store) UnmarshalYAML(n *yaml.Node) error {
	type plain Store
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}
func (x *Client) UnmarshalYAML(n *yaml.Node) error {
	type plain Client
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}
func (x *Lease) UnmarshalYAML(n *yaml.Node) error {
	type plain Lease
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}
func (x *Referee) UnmarshalYAML(n *yaml.Node) error {
	type plain Referee
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}
func (x *Group) UnmarshalYAML(n *yaml.Node) error {
	type plain Group
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}
func (x *Demand) UnmarshalYAML(n *yaml.Node) error {
	type plain Demand
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}
func (x *Event) UnmarshalYAML(n *yaml.Node) error {
	type plain Event
	return yamlx.DecodeMapping(n, (*plain)(x), &x.line)
}

// Load reads and checks a scenario file.
func Load(path string) (*Scenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, b)
}

// maxScenarioBytes bounds a scenario file.
const maxScenarioBytes = 1 << 20

// Parse reads and checks a scenario; file names it in errors.
func Parse(file string, b []byte) (*Scenario, error) {
	if len(b) > maxScenarioBytes {
		return nil, &yamlx.Error{File: file, Msg: "larger than 1 MiB"}
	}
	var s Scenario
	if err := yamlx.Decode(file, b, &s); err != nil {
		return nil, err
	}
	s.file = file
	if err := s.check(); err != nil {
		return nil, yamlx.Wrap(file, err)
	}
	return &s, nil
}

// Limits of the simulator, so that a scenario cannot exhaust the machine.
const (
	maxMembers    = 100_000
	maxGoroutines = 10_000
	maxDuration   = 366 * 24 * time.Hour
)

// check fills defaults and validates, with the line of each problem.
func (s *Scenario) check() error {
	bad := func(line int, format string, a ...any) error {
		return yamlx.AtLine(line, format, a...)
	}
	if s.Duration <= 0 || s.Duration.D() > maxDuration {
		return bad(0, "duration: want more than 0 and at most 366d")
	}
	if len(s.Limit.Limits) == 0 {
		return bad(0, "limit: missing (e.g. limit: '100/s burst=20')")
	}
	if len(s.Modes) == 0 {
		s.Modes = []string{"strict"}
	}
	for _, m := range s.Modes {
		if err := CheckMode(m); err != nil {
			return bad(0, "modes: %v", err)
		}
		if kinds := limitconv.Windowed(s.Limit.Limits) || limitconv.RampOver(s.Limit.Limits) > 0; kinds && m != "strict" && m != "redis" && m != "local" && m != "lease" && m != "ideal" {
			return bad(0, "modes: %s decides no windowed quota or ramp (limit: %v); use strict, local, lease or ideal", m, s.Limit.Limits)
		}
		if m == "lease" && limitconv.Windowed(s.Limit.Limits) {
			for _, l := range s.Limit.Limits {
				if !l.Window {
					return bad(0, "modes: lease decides a windowed quota only beside other windowed quotas (limit: %v)", s.Limit.Limits)
				}
			}
		}
	}
	if s.Sample <= 0 {
		s.Sample = Duration(max(time.Second, s.Duration.D()/1000).Round(time.Second))
	}
	if s.Duration.D()/s.Sample.D() > 1_000_000 {
		return bad(0, "sample: %v makes more than a million buckets", s.Sample.D())
	}
	for _, l := range []*Link{&s.Network.Store, &s.Network.API} {
		if l.Loss < 0 || l.Loss >= 1 {
			return bad(l.line, "loss: want a probability in [0, 1)")
		}
		if err := l.Latency.check(); err != nil {
			return err
		}
	}
	if s.Store.Timeout <= 0 {
		s.Store.Timeout = Duration(100 * time.Millisecond)
	}
	switch s.Store.FailMode {
	case "":
		s.Store.FailMode = "closed"
	case "closed", "open":
	case "local":
		if s.Store.FallbackShare <= 0 || s.Store.FallbackShare > 1 {
			return bad(s.Store.line, "fallback_share: want a share of the limit in (0, 1] for fail_mode local")
		}
	default:
		return bad(s.Store.line, "fail_mode: want closed, open or local, not %q", s.Store.FailMode)
	}
	if !choose(&s.Client.OnDeny, "retry", "drop") {
		return bad(s.Client.line, "on_deny: want retry or drop, not %q", s.Client.OnDeny)
	}
	if s.Client.MaxWait < 0 || s.Client.Margin < 0 {
		return bad(s.Client.line, "max_wait and margin: want 0 or more")
	}
	b := &s.Client.Backoff
	if b.Base <= 0 {
		b.Base = Duration(50 * time.Millisecond)
	}
	if b.Max <= 0 {
		b.Max = Duration(30 * time.Second)
	}
	if b.Jitter == 0 {
		b.Jitter = 0.2
	}
	if b.Jitter < 0 || b.Jitter > 1 {
		return bad(s.Client.line, "backoff.jitter: want a fraction in [0, 1]")
	}
	if s.Local.Share == 0 {
		s.Local.Share = 1
	}
	if s.Local.Share < 0 || s.Local.Share > 1 {
		return bad(s.Local.line, "local.share: want a fraction in (0, 1]")
	}
	if !choose(&s.Local.Processes, "one", "each") {
		return bad(s.Local.line, "local.processes: want one or each, not %q", s.Local.Processes)
	}
	if _, err := hits.ParsePolicy(s.Gossip.Policy); err != nil || s.Gossip.Interval < 0 || s.Gossip.Hold < 0 {
		return yamlx.AtLine(s.Gossip.line, "gossip: policy auto, owner, shares, equal or whole, interval and hold 0 (the default) or more")
	}
	if err := s.Lease.check(); err != nil {
		return err
	}
	if err := s.Referee.check(); err != nil {
		return err
	}
	if len(s.Members) == 0 {
		return bad(0, "members: none")
	}
	total := 0
	names := map[string]bool{"all": true}
	for i := range s.Members {
		g := &s.Members[i]
		if g.Name == "" || strings.ContainsAny(g.Name, " ,:") {
			return bad(g.line, "members[%d].name: want a name without spaces", i)
		}
		if names[g.Name] {
			return bad(g.line, "members[%d].name: %q used twice", i, g.Name)
		}
		names[g.Name] = true
		if g.Count == 0 {
			g.Count = 1
		}
		if g.Goroutines == 0 {
			g.Goroutines = 1
		}
		if g.Count < 0 || g.Goroutines < 0 || g.Goroutines > maxGoroutines {
			return bad(g.line, "members[%d]: count and goroutines must be positive (goroutines at most %d)", i, maxGoroutines)
		}
		total += g.Count
		if g.Join < 0 || (g.Leave != 0 && g.Leave <= g.Join) {
			return bad(g.line, "members[%d]: leave must come after join", i)
		}
		if err := g.Demand.check(); err != nil {
			return err
		}
		if _, err := priority.Parse(g.Priority); err != nil {
			return bad(g.line, "members[%d].priority: %q: want critical, standard or sheddable", i, g.Priority)
		}
		if t := g.Demand.Tokens; t.Max > 0 && s.Referee.Tokens != nil {
			if burst := gcra.MaxCost(limitconv.Core(s.Referee.Tokens.Limits, 0)); t.Max > burst {
				return bad(g.Demand.line, "tokens: max %d is more than the token limit's burst (%d): such a request can never be accepted", t.Max, burst)
			}
		}
	}
	if total > maxMembers {
		return bad(0, "members: %d in all, more than %d", total, maxMembers)
	}
	for i := range s.Events {
		e := &s.Events[i]
		kinds := 0
		for _, set := range []bool{len(e.Crash) > 0, len(e.Leave) > 0, len(e.Join) > 0, len(e.Pause) > 0,
			e.StoreOutage != nil, len(e.Partition) > 0, e.Heal, e.Limit != nil, e.StoreRestart} {
			if set {
				kinds++
			}
		}
		if kinds != 1 {
			return bad(e.line, "events[%d]: want exactly one of crash, leave, join, pause, store_outage, store_restart, partition, heal, limit", i)
		}
		if e.At < 0 || e.At.D() > s.Duration.D() {
			return bad(e.line, "events[%d].at: outside the run (0 to %v)", i, s.Duration.D())
		}
		if (len(e.Pause) > 0) && e.For <= 0 {
			return bad(e.line, "events[%d]: pause needs for: DURATION", i)
		}
		if e.StoreOutage != nil && *e.StoreOutage <= 0 {
			return bad(e.line, "events[%d].store_outage: want a positive duration", i)
		}
		for _, ts := range []Targets{e.Crash, e.Leave, e.Join, e.Pause, e.Partition} {
			for _, name := range ts {
				if !s.knownTarget(name) {
					return bad(e.line, "events[%d]: no member or group named %q", i, name)
				}
			}
		}
	}
	slices.SortStableFunc(s.Events, func(a, b Event) int { return int(a.At.D() - b.At.D()) })
	return nil
}

func (s *Scenario) knownTarget(name string) bool {
	if name == "all" {
		return true
	}
	for _, g := range s.Members {
		if name == g.Name {
			return true
		}
		if rest, ok := strings.CutPrefix(name, g.Name); ok {
			if n, err := strconv.Atoi(rest); err == nil && n >= 1 && n <= g.Count {
				return true
			}
		}
	}
	return false
}

func (l *Lease) check() error {
	bad := func(format string, a ...any) error { return yamlx.AtLine(l.line, format, a...) }
	if _, err := lease.ParsePolicy(l.Policy); l.Policy != "" && err != nil {
		return bad("lease.policy: want fair or equal, not %q", l.Policy)
	}
	switch l.FailMode {
	case "", "local", "closed":
	default:
		return bad("lease.fail_mode: want local or closed, not %q", l.FailMode)
	}
	if l.TTL < 0 || l.Grace < 0 || l.JoinWindow < 0 || l.Renew < 0 || l.Margin < 0 {
		return bad("lease: durations must not be negative")
	}
	return nil
}

func (r *Referee) check() error {
	st, err := referee.ParseStyle(r.Style)
	if r.Style != "" && err != nil {
		return yamlx.AtLine(r.line, "referee.style: want ietf, openai, anthropic, heroku or bare, not %q", r.Style)
	}
	r.style = st
	return nil
}

func (d *Dist) check() error {
	bad := func(format string, a ...any) error { return yamlx.AtLine(d.line, format, a...) }
	switch d.Kind {
	case "":
		if d.Value == 0 && d.Min == 0 && d.Max == 0 && d.Mean == 0 {
			d.Kind = "fixed"
			return nil
		}
		return bad("dist: want fixed, uniform, exp or normal")
	case "fixed":
	case "uniform":
		if d.Max < d.Min {
			return bad("uniform: max below min")
		}
	case "exp":
		if d.Mean <= 0 {
			return bad("exp: want mean > 0")
		}
	case "normal":
		if d.Mean <= 0 || d.SD < 0 {
			return bad("normal: want mean > 0 and sd >= 0")
		}
	default:
		return bad("dist: want fixed, uniform, exp or normal, not %q", d.Kind)
	}
	if d.Value < 0 || d.Min < 0 {
		return bad("latencies cannot be negative")
	}
	return nil
}

func (d *Demand) check() error {
	bad := func(format string, a ...any) error { return yamlx.AtLine(d.line, format, a...) }
	switch d.Pattern {
	case "constant", "poisson":
		if d.Rate <= 0 || d.Rate > 1e7 {
			return bad("%s: want rate in (0, 1e7] requests per second", d.Pattern)
		}
	case "onoff":
		if d.Rate <= 0 || d.Rate > 1e7 || d.On <= 0 || d.Off <= 0 {
			return bad("onoff: want rate > 0, on > 0 and off > 0")
		}
	case "diurnal":
		if d.Rate <= 0 || d.Rate > 1e7 || d.Swing < 0 || d.Swing > 1 {
			return bad("diurnal: want rate > 0 and swing in [0, 1]")
		}
		if d.Period == 0 {
			d.Period = Duration(24 * time.Hour)
		}
	case "backlog":
		if d.N <= 0 {
			return bad("backlog: want n > 0")
		}
	case "times":
		if len(d.Times) == 0 {
			return bad("times: want a list of times")
		}
		if !slices.IsSorted(d.Times) {
			return bad("times: want the times in order")
		}
	case "":
		return bad("pattern: missing (constant, poisson, onoff, diurnal, backlog or times)")
	default:
		return bad("pattern: want constant, poisson, onoff, diurnal, backlog or times, not %q", d.Pattern)
	}
	if t := d.Tokens; t.Min < 0 || t.Max < t.Min || t.Max > 1e9 {
		return bad("tokens: want 0 <= min <= max <= 1e9")
	}
	return nil
}

// choose checks a setting that takes one of values, the first its default when it is
// left out (set in *v then): false if *v is none of them.
func choose(v *string, values ...string) bool {
	if *v == "" {
		*v = values[0]
		return true
	}
	return slices.Contains(values, *v)
}
