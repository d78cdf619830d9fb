package server

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/internal/yamlx"
	"github.com/sluicehq/sluice/store"
)

// Duration is a duration in a Config: set it from a time.Duration (Duration(5 *
// time.Second)); in YAML it is text such as 10s, 1h30m or 2d.
type Duration = yamlx.Duration

// Config is the daemon's configuration: a YAML file (see docs/daemon.md), flags, or both
// (flags win). Make one with DefaultConfig; check it with Validate.
type Config struct {
	ListenLine     string       `yaml:"listen_line"`     // TCP address or Unix socket path of the line protocol; "" disables it
	ListenHTTP     string       `yaml:"listen_http"`     // TCP address of the HTTP API and /metrics; "" disables it
	ListenAdmin    string       `yaml:"listen_admin"`    // TCP address of /healthz, /readyz and /metrics without the token; "" disables it
	ListenGRPC     string       `yaml:"listen_grpc"`     // TCP address of Envoy's rate limit service (gRPC); "" disables it
	GRPC           GRPCConfig   `yaml:"grpc"`            // the gRPC listener's bounds and options
	Backend        string       `yaml:"backend"`         // local, strict, lease or gossip (redis: deprecated, strict)
	RedisURL       string       `yaml:"redis_url"`       // deprecated: store
	Store          string       `yaml:"store"`           // backend strict or lease: the store's URL (redis://, rediss://, redis-cluster://, redis-sentinel://, etcd://, zk://, memory://)
	FailMode       string       `yaml:"fail_mode"`       // closed, open, or (the strict mode on Redis) local: the answer when the back end fails
	FallbackShare  float64      `yaml:"fallback_share"`  // fail_mode local: the share of each limit this daemon uses while Redis is down
	RedisTimeout   Duration     `yaml:"redis_timeout"`   // the strict mode on Redis: how long a decision waits for Redis
	Margin         Duration     `yaml:"margin"`          // jitter tolerance applied to every rule's limit
	HTTPTokenFile  string       `yaml:"http_token_file"` // file holding the bearer token the HTTP API requires; "" means no auth
	MaxConnections int          `yaml:"max_connections"` // line-protocol connections at once
	MaxKeys        int          `yaml:"max_keys"`        // buckets held at once
	MaxLine        int          `yaml:"max_line"`        // bytes in one query line, newline included
	MaxPending     int          `yaml:"max_pending"`     // answers buffered for a client that does not read
	IdleTimeout    Duration     `yaml:"idle_timeout"`    // a connection that sends nothing for this long is closed
	WriteTimeout   Duration     `yaml:"write_timeout"`   // a client that does not take its answers for this long is dropped
	ShutdownGrace  Duration     `yaml:"shutdown_grace"`  // SIGTERM: time to answer the queries already read
	Gossip         GossipConfig `yaml:"gossip"`          // backend gossip: the peers and the sync
	LogFormat      string       `yaml:"log_format"`      // text or json
	LogLevel       string       `yaml:"log_level"`       // debug, info, warn or error
	MaxPenalty     PenaltyCap   `yaml:"max_penalty"`     // the longest hold a client may put on a tag (p=): off, period or a duration; a rule may set its own
	Rules          []Rule       `yaml:"rules"`           // first match wins
	Default        *DefaultRule `yaml:"default"`         // for tags no rule matches; none: such tags are allowed

	file     string
	lines    map[string]int // the line of each key of the file (keyLines)
	warnings []string       // set by Validate: the deprecated spellings it read

	// RedisAcks (the strict mode on Redis) is how many replicas must acknowledge each
	// batch's writes (Redis WAIT, within half the redis_timeout) before its grants are
	// used; 0: none (strict.WithReplicaAcks; docs/strict.md, "The failover bound").
	RedisAcks int `yaml:"redis_replica_acks"`
}

// GossipConfig are the gossip back end's settings (docs/gossip.md).
type GossipConfig struct {
	Bind      string   `yaml:"bind"`      // host:port of the membership's UDP and TCP listeners
	Advertise string   `yaml:"advertise"` // host:port peers reach this daemon at; "": bind
	Peers     []string `yaml:"peers"`     // seed list, host:port each (a DNS name with several addresses joins each)
	KeyFile   string   `yaml:"key_file"`  // file holding the shared key (16, 24 or 32 bytes; raw, base64 or hex); "": traffic in clear
	Interval  Duration `yaml:"interval"`  // sync interval
	Hold      Duration `yaml:"hold"`      // how long a lost peer keeps its share
	Policy    string   `yaml:"policy"`    // auto (owner for small limits, shares for large), owner, shares (by demand), equal (1/N) or whole (the DThrottle design as written)
	// MeshMax is the largest pool that reports all-to-all; a larger one reports over each
	// tag's tree (docs/gossip.md, "Hundreds of daemons"). 0: the default, 32.
	MeshMax int `yaml:"mesh_max"`
}

// GRPCConfig are the gRPC listener's settings (docs/envoy.md).
type GRPCConfig struct {
	MaxMessage      int    `yaml:"max_message"`      // bytes in one request message
	MaxStreams      uint32 `yaml:"max_streams"`      // concurrent calls on one connection
	Reflection      bool   `yaml:"reflection"`       // serve gRPC server reflection (grpcurl lists the services)
	ResponseHeaders bool   `yaml:"response_headers"` // answer x-ratelimit-limit, -remaining and -reset for Envoy to add to the response
	// PriorityEntry names the descriptor entry that carries a request's class (critical,
	// standard or sheddable: docs/priorities.md); it is not part of the descriptor's tag.
	// "": none.
	PriorityEntry string `yaml:"priority_entry"`
	// Transport serves the listener: "lean" (the daemon's own HTTP/2 server of unary
	// calls: ShouldRateLimit and the health service's Check, a few allocations a call) or
	// "grpc-go" (google.golang.org/grpc's server: every gRPC feature, the health service's
	// Watch too). Reflection and tracing are served by grpc-go whatever this says.
	Transport string `yaml:"transport"`
}

// DefaultRule is the rule for tags that no other rule matches. Each tag gets its own
// bucket unless Shared.
type DefaultRule struct {
	Limit      sluice.Limits `yaml:"limit"`
	Shared     bool          `yaml:"shared"`
	MaxPenalty PenaltyCap    `yaml:"max_penalty"` // unset: the server's
	line       int
	bad        error // what did not read (a *yaml.TypeError), reported by the check
	badLimit   bool  // its limit's text did not parse (in bad)
}

// DefaultConfig returns the defaults, each commented.
func DefaultConfig() Config {
	return Config{
		ListenLine:     "127.0.0.1:7070",                       // loopback: other hosts must be allowed explicitly
		ListenHTTP:     "127.0.0.1:7071",                       // loopback, as above
		ListenAdmin:    "",                                     // off: health and metrics are on listen_http (behind its token, if any)
		ListenGRPC:     "",                                     // off: Envoy's rate limit service is asked for (e.g. 127.0.0.1:8081)
		Backend:        "local",                                // in process: the embedded default
		FailMode:       "closed",                               // deny when the back end cannot decide
		FallbackShare:  0,                                      // set it with fail_mode local
		RedisTimeout:   yamlx.Duration(100 * time.Millisecond), // a decision is a round trip on a LAN
		RedisAcks:      0,                                      // asynchronous replication: a failover may lose the last writes
		MaxConnections: 4096,                                   // forked workers on one host, with room
		MaxKeys:        1 << 20,                                // about 180 MB of heap when full (docs/local.md)
		MaxLine:        1024,                                   // a tag is an IP, a token, a name: 1 KiB is plenty
		MaxPending:     64 << 10,                               // 64 KiB of unread answers (about 21,000) per client
		IdleTimeout:    yamlx.Duration(5 * time.Minute),        // idle clients give their connection back
		WriteTimeout:   yamlx.Duration(5 * time.Second),        // a client that stops reading is dropped after this
		ShutdownGrace:  yamlx.Duration(5 * time.Second),        // SIGTERM answers what it has read within this
		GRPC: GRPCConfig{
			MaxMessage:      64 << 10, // a request of a few dozen descriptors is a few KiB
			MaxStreams:      1024,     // calls in flight on one connection (Envoy multiplexes)
			Reflection:      false,    // off: the service is known to its callers
			ResponseHeaders: false,    // off: Envoy adds no x-ratelimit-* headers
			PriorityEntry:   "",       // none: every descriptor is standard
			Transport:       "lean",   // the daemon's own HTTP/2 server: a ShouldRateLimit call costs a third of grpc-go's
		},
		Gossip: GossipConfig{
			Bind:     "127.0.0.1:7946",                       // loopback: other hosts must be allowed explicitly
			Interval: yamlx.Duration(100 * time.Millisecond), // the excess between syncs scales with it
			Hold:     yamlx.Duration(2 * time.Second),        // a partition shorter than this does not multiply the limit
			Policy:   "auto",                                 // each small limit decided at its key's owner, large ones by shares
		},
		LogFormat:     "text",            // log/slog's text handler
		LogLevel:      "info",            // startup, reloads, shutdown, errors
		MaxPenalty:    PenaltiesPeriod,   // a client holds a tag back for at most its rule's longest period
		Margin:        yamlx.Duration(0), // decide the limits exactly as written
		Default:       nil,               // tags no rule matches are allowed
		Rules:         nil,               // no rule: every tag is allowed
		HTTPTokenFile: "",                // the HTTP API requires no token
		RedisURL:      "",                // deprecated: store
		Store:         "",                // needed by backend strict and lease
		file:          "",                // set by LoadConfig
	}
}

// normalize reads the deprecated spellings into the current ones, noting a warning for
// each (Warnings): backend redis is backend strict, redis_url is store.
func (c *Config) normalize() {
	if c.Backend == "redis" {
		c.Backend = "strict"
		c.warn("backend redis (--backend redis) is deprecated: use backend strict (--backend strict) with store redis://HOST:PORT (--store)")
	}
	if c.RedisURL != "" {
		switch {
		case c.Store == "":
			c.Store = c.RedisURL
			c.warn("redis_url (--redis-url) is deprecated: use store (--store)")
		case c.Store != c.RedisURL:
			c.warn("redis_url (--redis-url) is deprecated and ignored: store (--store) is set")
		}
		c.RedisURL = ""
	}
}

func (c *Config) warn(s string) {
	if !slices.Contains(c.warnings, s) {
		c.warnings = append(c.warnings, s)
	}
}

// Warnings lists what Validate read in a deprecated spelling, one line each, for the
// caller to print: deprecated spellings keep working for one release.
func (c *Config) Warnings() []string { return c.warnings }

// StrictOnRedis reports whether the config's back end is the strict mode on Redis (the
// decision script: redis://, rediss:// or redis-sentinel://), which alone takes fail_mode
// local, redis_timeout and redis_replica_acks.
func (c *Config) StrictOnRedis() bool {
	scheme, _, _ := strings.Cut(c.Store, "://")
	return c.Backend == "strict" && (scheme == "redis" || scheme == "rediss" || scheme == "redis-sentinel")
}

// Validate reports the first problem in c, naming the field (and, for a loaded file, the
// file and line).
func (c *Config) Validate() error {
	err := c.validate()
	if err != nil && c.file != "" {
		return yamlx.Wrap(c.file, err)
	}
	return err
}

func (c *Config) validate() error {
	var errs []error
	bad := func(line int, format string, a ...any) { errs = append(errs, yamlx.AtLine(line, format, a...)) }
	at := c.lineOf // the line of a top-level field in the file, 0 if none
	c.normalize()
	switch c.Backend {
	case "local":
	case "strict":
		if c.Store == "" {
			bad(at("backend"), "backend strict needs store (--store): redis://HOST:PORT, redis-sentinel://HOST:PORT,.../MASTER, etcd://HOST:PORT, zk://HOST:PORT or memory://")
		} else if err := store.Check(c.Store); err != nil {
			bad(at("store", "redis_url"), "store (--store): %s", strings.TrimPrefix(err.Error(), "sluice: "))
		}
	case "lease":
		if c.Store == "" {
			bad(at("backend"), "backend lease needs store (--store): redis://HOST:PORT, redis-cluster://..., redis-sentinel://..., etcd://HOST:PORT, zk://HOST:PORT or memory://")
		} else if err := store.Check(c.Store); err != nil {
			bad(at("store", "redis_url"), "store (--store): %s", strings.TrimPrefix(err.Error(), "sluice: "))
		}
	case "gossip":
		g := &c.Gossip
		if g.Bind == "" {
			bad(at("gossip.bind", "gossip", "backend"), "backend gossip needs gossip.bind (--gossip-bind)")
		}
		if g.Interval < yamlx.Duration(time.Millisecond) || g.Hold < 0 {
			bad(at("gossip.interval", "gossip.hold", "gossip"), "gossip.interval: want at least 1ms; gossip.hold: want 0 or more")
		}
		if g.MeshMax < 0 {
			bad(at("gossip.mesh_max", "gossip"), "gossip.mesh_max: want 0 (the default, 32) or more")
		}
		if _, err := hits.ParsePolicy(g.Policy); err != nil || g.Policy == "" {
			bad(at("gossip.policy", "gossip"), "gossip.policy: want auto, owner, shares, equal or whole, not %q", g.Policy)
		}
	default:
		bad(at("backend"), "backend: want local, strict, lease or gossip, not %q", c.Backend)
	}
	switch c.FailMode {
	case "closed", "open":
	case "local":
		if !c.StrictOnRedis() {
			bad(at("fail_mode"), "fail_mode local degrades the strict mode on Redis to a local share: it needs backend strict with a redis:// or redis-sentinel:// store")
		}
		if c.FallbackShare <= 0 || c.FallbackShare > 1 {
			bad(at("fallback_share", "fail_mode"), "fail_mode local needs fallback_share in (0, 1] (--fallback-share)")
		}
	default:
		bad(at("fail_mode"), "fail_mode: want closed, open or local, not %q", c.FailMode)
	}
	if c.RedisTimeout <= 0 {
		bad(at("redis_timeout"), "redis_timeout: want a positive duration")
	}
	if c.RedisAcks < 0 || c.RedisAcks > 0 && !c.StrictOnRedis() {
		bad(at("redis_replica_acks"), "redis_replica_acks: want 0 or more, and only with backend strict on a redis:// or redis-sentinel:// store")
	}
	if c.ListenLine == "" && c.ListenHTTP == "" && c.ListenGRPC == "" {
		bad(at("listen_line", "listen_http", "listen_grpc"), "listen_line, listen_http and listen_grpc are all empty: nothing to serve")
	}
	if c.GRPC.MaxMessage < 1<<10 || c.GRPC.MaxMessage > 16<<20 {
		bad(at("grpc.max_message", "grpc"), "grpc.max_message: want 1 KiB to 16 MiB")
	}
	if c.GRPC.MaxStreams < 1 {
		bad(at("grpc.max_streams", "grpc"), "grpc.max_streams: want at least 1")
	}
	if c.GRPC.Transport != "lean" && c.GRPC.Transport != "grpc-go" {
		bad(at("grpc.transport", "grpc"), "grpc.transport: want lean or grpc-go, not %q", c.GRPC.Transport)
	}
	switch {
	case c.MaxConnections < 1:
		bad(at("max_connections"), "max_connections: want at least 1")
	case c.MaxKeys < 1:
		bad(at("max_keys"), "max_keys: want at least 1")
	case c.MaxLine < 16 || c.MaxLine > 1<<20:
		bad(at("max_line"), "max_line: want 16 bytes to 1 MiB")
	case c.MaxPending < 64:
		bad(at("max_pending"), "max_pending: want at least 64 bytes")
	case c.IdleTimeout <= 0, c.WriteTimeout <= 0, c.ShutdownGrace <= 0:
		bad(at("idle_timeout", "write_timeout", "shutdown_grace"), "idle_timeout, write_timeout and shutdown_grace must be positive")
	case c.Margin < 0:
		bad(at("margin"), "margin: want 0 or more")
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		bad(at("log_format"), "log_format: want text or json, not %q", c.LogFormat)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad(at("log_level"), "log_level: want debug, info, warn or error, not %q", c.LogLevel)
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		if r.bad != nil {
			errs = append(errs, r.bad)
		}
		if r.Match == "" {
			bad(r.line, "rules[%d]: no match (want match: a tag, or a pattern such as user-*)", i)
		}
		switch {
		case r.Unlimited && r.Deny:
			bad(r.line, "rules[%d]: unlimited and deny together", i)
		case r.noLimit() && len(r.Limit) > 0:
			bad(r.line, "rules[%d]: a limit with unlimited or deny", i)
		case r.noLimit():
		case r.badLimit: // reported as it was read
		case len(r.Limit) == 0:
			bad(r.line, "rules[%d].limit: missing (or unlimited: true, or deny: true)", i)
		default:
			if err := r.Limit.Validate(); err != nil {
				bad(r.line, "rules[%d].limit: %v", i, err)
			}
		}
		if r.Shared && !isPattern(r.Match) {
			bad(r.line, "rules[%d]: shared only means something for a pattern (%q has no * or ?)", i, r.Match)
		}
		if r.Gossip != "" {
			switch p, err := hits.ParsePolicy(r.Gossip); {
			case err != nil || (p != hits.Auto && p != hits.Owner && p != hits.Shares):
				bad(r.line, "rules[%d].gossip: want owner, shares or auto, not %q", i, r.Gossip)
			case c.Backend != "gossip":
				bad(r.line, "rules[%d].gossip: %q is for backend gossip (this one is %s): remove it, or run --backend gossip", i, r.Gossip, c.Backend)
			case c.Gossip.Policy == "equal" || c.Gossip.Policy == "whole":
				bad(r.line, "rules[%d].gossip: %q with gossip.policy %s: a rule chooses between its owner and shares under gossip.policy auto, owner or shares", i, r.Gossip, c.Gossip.Policy)
			}
		}
	}
	if c.Default != nil && c.Default.bad != nil {
		errs = append(errs, c.Default.bad)
	}
	if c.Default != nil && !c.Default.badLimit {
		if err := c.Default.Limit.Validate(); err != nil {
			bad(c.Default.line, "default.limit: %v", err)
		}
	}
	if _, err := c.ruleSet(); err != nil {
		if errors.As(err, new(*yamlx.LineError)) {
			errs = append(errs, err)
		} else {
			bad(at("rules"), "rules: %v", err)
		}
	}
	return errors.Join(errs...)
}

// lineOf is the line of the first of fields (top-level keys, or SECTION.KEY) the config's
// file sets, or 0.
func (c *Config) lineOf(fields ...string) int {
	for _, f := range fields {
		if l := c.lines[f]; l > 0 {
			return l
		}
	}
	return 0
}

// keyLines maps each key of a YAML document's top-level mapping, and SECTION.KEY of a
// mapping under one, to its line.
func keyLines(b []byte) map[string]int {
	var doc yaml.Node
	if yaml.Unmarshal(b, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil
	}
	out := map[string]int{}
	top := doc.Content[0]
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		out[k.Value] = k.Line
		if v.Kind == yaml.MappingNode {
			for j := 0; j+1 < len(v.Content); j += 2 {
				out[k.Value+"."+v.Content[j].Value] = v.Content[j].Line
			}
		}
	}
	return out
}

// ruleSet compiles the rules.
func (c *Config) ruleSet() (*ruleSet, error) {
	var d *Rule
	if c.Default != nil {
		d = &Rule{Name: "default", Match: "*", Limit: c.Default.Limit, Shared: c.Default.Shared, MaxPenalty: c.Default.MaxPenalty}
	}
	return newRuleSet(c.Rules, d)
}

// LoadConfig reads a config file over the defaults. Errors name the file and line.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	return ParseConfig(path, b)
}

// ParseConfig reads config text over the defaults; file names it in errors.
func ParseConfig(file string, b []byte) (Config, error) {
	c := DefaultConfig()
	if len(b) > 16<<20 {
		return c, &yamlx.Error{File: file, Msg: "larger than 16 MiB"}
	}
	c.file = file
	c.lines = keyLines(b)
	derr := yamlx.Decode(file, b, &c)
	if derr != nil && yaml.Unmarshal(b, new(yaml.Node)) != nil {
		return c, derr // not YAML: nothing more to check
	}
	// Every problem at once: the values that did not read, and what the check after
	// reading finds in the rest (a value that did not read is not reported twice).
	return c, yamlx.ByLine(errors.Join(derr, c.Validate()))
}

// UnmarshalYAML reads a rule, keeping its line (and the limit's, for errors).
func (r *Rule) UnmarshalYAML(n *yaml.Node) error {
	var y struct {
		Name            string       `yaml:"name"`
		Match           string       `yaml:"match"`
		Limit           yamlx.Limits `yaml:"limit"`
		Shared          bool         `yaml:"shared"`
		MaxPenalty      PenaltyCap   `yaml:"max_penalty"`
		PathGlob        bool         `yaml:"path_glob"`
		Unlimited       bool         `yaml:"unlimited"`
		Deny            bool         `yaml:"deny"`
		Shadow          bool         `yaml:"shadow"`
		DetailedMetrics bool         `yaml:"detailed_metrics"`
		Gossip          string       `yaml:"gossip"`
	}
	// A rule with a bad value is kept, its problems reported by the check after decoding
	// (the yaml package drops a list's element that fails, which would renumber the
	// rules after it), with the rule's other problems but not the bad value's absence.
	r.bad = yamlx.DecodeMapping(n, &y, &r.line)
	r.Name, r.Match, r.Limit, r.Shared, r.MaxPenalty = y.Name, y.Match, y.Limit.Limits, y.Shared, y.MaxPenalty
	r.PathGlob, r.Unlimited, r.Deny, r.Shadow, r.DetailedMetrics = y.PathGlob, y.Unlimited, y.Deny, y.Shadow, y.DetailedMetrics
	r.Gossip = y.Gossip
	r.badLimit = y.Limit.Bad()
	return nil
}

// UnmarshalYAML reads the default rule, keeping its line.
func (d *DefaultRule) UnmarshalYAML(n *yaml.Node) error {
	var y struct {
		Limit      yamlx.Limits `yaml:"limit"`
		Shared     bool         `yaml:"shared"`
		MaxPenalty PenaltyCap   `yaml:"max_penalty"`
	}
	d.bad = yamlx.DecodeMapping(n, &y, &d.line)
	d.Limit, d.Shared, d.MaxPenalty, d.badLimit = y.Limit.Limits, y.Shared, y.MaxPenalty, y.Limit.Bad()
	return nil
}

// ParseRuleFlag reads the --limit flag's form, TAG=LIMIT: an exact tag or a pattern, then
// a limit in the shared text form.
func ParseRuleFlag(s string, shared bool) (Rule, error) {
	match, limit, ok := strings.Cut(s, "=")
	// A limit has no '=' before its '/', a tag may: split at the last '=' before the
	// limit's rate ("a=b=10/s" is the tag "a=b"), but "burst=" belongs to the limit.
	if i := strings.LastIndex(s[:max(0, strings.Index(s, "/"))], "="); i > 0 {
		match, limit, ok = s[:i], s[i+1:], true
	}
	if !ok || match == "" {
		return Rule{}, fmt.Errorf("--limit %q: want TAG=LIMIT, e.g. api=10/s or 'user-*=5/s burst=10'", s)
	}
	ls, err := sluice.Parse(limit)
	if le := (*sluice.LimitError)(nil); errors.As(err, &le) {
		// The flag's value named once: what is wrong, and where in it.
		return Rule{}, fmt.Errorf("--limit %q: %s%w", s, le.Detail(), errSilent{le})
	} else if err != nil {
		return Rule{}, fmt.Errorf("--limit %q: %w", s, err)
	}
	if shared && !isPattern(match) {
		return Rule{}, fmt.Errorf("--shared-limit %q: %q is not a pattern (no * or ?)", s, match)
	}
	return Rule{Match: match, Limit: ls, Shared: shared}, nil
}

// ErrNoToken is returned when the HTTP token file is empty.
var ErrNoToken = errors.New("sluice serve: the HTTP token file is empty")

// readToken reads the bearer token from a file (trailing whitespace trimmed).
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("sluice serve: http_token_file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", ErrNoToken
	}
	return t, nil
}

// errSilent wraps an error that a message has already said: errors.Is and As see it, its
// text adds nothing.
type errSilent struct{ err error }

func (e errSilent) Error() string { return "" }
func (e errSilent) Unwrap() error { return e.err }
