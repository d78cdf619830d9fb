package server

import (
	"cmp"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/yamlx"
)

// Envoy's rate limit service (envoyproxy/ratelimit) decides descriptors: a domain and a
// list of entries, each a key and a value. The daemon decides a descriptor as one tag,
// the domain and each entry in order, separated by '/':
//
//	domain "edge", entries [remote_address=10.0.0.1] [path=/login]  ->  edge/remote_address=10.0.0.1/path=%2Flogin
//
// In the domain, the keys and the values, '%', '/' and '=' and control characters are
// written %XX (so the tag's '/' and '=' always separate), and an entry with an empty
// value ends in '='. The same tag may be asked over the line protocol or the HTTP API.

// EnvoyEntry is one entry of an Envoy rate limit descriptor.
type EnvoyEntry struct{ Key, Value string }

// EnvoyTag returns the tag a descriptor of domain with entries is decided under.
func EnvoyTag(domain string, entries ...EnvoyEntry) string {
	b := appendTagPart(nil, domain)
	for _, e := range entries {
		b = appendEntry(b, e.Key, e.Value)
	}
	return string(b)
}

// appendEntry appends one descriptor entry to a tag: "/KEY=VALUE", escaped.
func appendEntry(b []byte, key, value string) []byte {
	b = append(b, '/')
	b = appendTagPart(b, key)
	b = append(b, '=')
	return appendTagPart(b, value)
}

// appendTagPart appends s with '%', '/', '=' and control characters escaped as %XX.
func appendTagPart(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '%' || c == '/' || c == '=' || c < 0x20 || c == 0x7f:
			b = append(b, '%', hex[c>>4], hex[c&15])
		default:
			b = append(b, c)
		}
	}
	return b
}

// envoyUnits are the units of Envoy's rate limits, as periods (a month is 30 days and a
// year 365, as envoyproxy/ratelimit counts them).
var envoyUnits = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// envoyFile is a config file in envoyproxy/ratelimit's format.
type envoyFile struct {
	Domain      string            `yaml:"domain"`
	Descriptors []envoyDescriptor `yaml:"descriptors"`
}

type envoyDescriptor struct {
	Key            string            `yaml:"key"`
	Value          string            `yaml:"value"`
	RateLimit      *envoyRateLimit   `yaml:"rate_limit"`
	Descriptors    []envoyDescriptor `yaml:"descriptors"`
	ShadowMode     bool              `yaml:"shadow_mode"`
	DetailedMetric bool              `yaml:"detailed_metric"`
	ValueToMetric  bool              `yaml:"value_to_metric"`
	ShareThreshold bool              `yaml:"share_threshold"`
	line           int
}

type envoyRateLimit struct {
	Unit            string    `yaml:"unit"`
	RequestsPerUnit *int64    `yaml:"requests_per_unit"`
	Unlimited       bool      `yaml:"unlimited"`
	Name            string    `yaml:"name"`
	Replaces        yaml.Node `yaml:"replaces"`
	line            int
}

func (d *envoyDescriptor) UnmarshalYAML(n *yaml.Node) error {
	type plain envoyDescriptor
	return yamlx.DecodeMapping(n, (*plain)(d), &d.line)
}

func (r *envoyRateLimit) UnmarshalYAML(n *yaml.Node) error {
	type plain envoyRateLimit
	if err := yamlx.DecodeMapping(n, (*plain)(r), &r.line); err != nil {
		return err
	}
	if !r.Replaces.IsZero() {
		return yamlx.At(&r.Replaces, "replaces: not supported by sluice (a limit that replaces another when both match); remove it, or give the descriptors limits that apply together")
	}
	return nil
}

// LoadEnvoyConfig reads a config file in envoyproxy/ratelimit's format (see
// ParseEnvoyConfig).
func LoadEnvoyConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	return ParseEnvoyConfig(path, b)
}

// ParseEnvoyConfig reads a config file in envoyproxy/ratelimit's format into the daemon's
// defaults. The file holds a domain and its nested descriptors, each with a key, an
// optional value, and an optional rate_limit of requests_per_unit per unit. Each
// descriptor that has a rate limit becomes one rule, matching the tags EnvoyTag makes.
// The rules decide as envoyproxy/ratelimit does:
//   - A descriptor's limit applies to requests whose entries walk down to it exactly.
//   - At each level an entry with the same key and value wins over a wildcard value
//     ("foo*"), which wins over a key alone (any value, each its own bucket).
//   - requests_per_unit 0 denies every request, and unlimited allows every one.
//   - shadow_mode answers OK but counts the denials.
//   - share_threshold makes a wildcard's values share one bucket.
//   - detailed_metric (or value_to_metric) counts decisions by tag.
//
// Where envoyproxy/ratelimit counts fixed windows, the daemon keeps the limit with GCRA,
// with a burst of requests_per_unit. replaces is refused, as is any field the format does
// not have. Every error names file and line.
func ParseEnvoyConfig(file string, b []byte) (Config, error) {
	c := DefaultConfig()
	if len(b) > 16<<20 {
		return c, &yamlx.Error{File: file, Msg: "larger than 16 MiB"}
	}
	var f envoyFile
	if err := yamlx.Decode(file, b, &f); err != nil {
		return c, err
	}
	if f.Domain == "" {
		return c, &yamlx.Error{File: file, Line: 1, Msg: "domain: empty (every file of envoyproxy/ratelimit's format names its domain)"}
	}
	var e envoyRules
	if err := e.level(appendTagPart(nil, f.Domain), 1, f.Descriptors); err != nil {
		return c, yamlx.Wrap(file, err)
	}
	c.Rules = e.rules
	c.file = file
	return c, c.Validate()
}

// envoyRules turns a tree of descriptors into rules in the order that makes the first
// match envoyproxy/ratelimit's lookup.
type envoyRules struct {
	rules []Rule
	seen  map[string]bool // patterns emitted
}

// envoy descriptor kinds, in the order a level is searched.
const (
	kindExact    = iota // key and value
	kindWildcard        // key and a value ending in '*': a prefix
	kindKey             // key alone: any value
)

func envoyKind(d *envoyDescriptor) int {
	switch {
	case d.Value == "":
		return kindKey
	case strings.HasSuffix(d.Value, "*"):
		return kindWildcard
	}
	return kindExact
}

// segment is the path pattern of one descriptor's entry.
func (d *envoyDescriptor) segment() string {
	key := escapeGlob(string(appendTagPart(nil, d.Key)))
	switch envoyKind(d) {
	case kindKey:
		return key + "=*"
	case kindWildcard:
		return key + "=" + escapeGlob(string(appendTagPart(nil, strings.TrimSuffix(d.Value, "*")))) + "*"
	}
	return key + "=" + escapeGlob(string(appendTagPart(nil, d.Value)))
}

// level emits the rules of the descriptors under the pattern parent, at depth (the
// number of entries a tag has at this level).
func (e *envoyRules) level(parent []byte, depth int, ds []envoyDescriptor) error {
	type at struct {
		d    *envoyDescriptor
		kind int
	}
	order := make([]at, len(ds))
	seen := map[string]int{}
	for i := range ds {
		d := &ds[i]
		if d.Key == "" {
			return yamlx.AtLine(d.line, "descriptor: empty key")
		}
		id := d.Key + "\x00" + d.Value
		if first, dup := seen[id]; dup {
			return yamlx.AtLine(d.line, "descriptor %s=%s: twice at this level (line %d too)", d.Key, d.Value, first)
		}
		seen[id] = d.line
		if d.ShareThreshold && envoyKind(d) != kindWildcard {
			return yamlx.AtLine(d.line, "descriptor %s: share_threshold needs a wildcard value (one ending in *)", d.Key)
		}
		order[i] = at{d, envoyKind(d)}
	}
	slices.SortStableFunc(order, func(a, b at) int { return cmp.Compare(a.kind, b.kind) })
	for i, o := range order {
		pat := append(append(slices.Clip(parent), '/'), o.d.segment()...)
		if err := e.node(pat, depth, o.d); err != nil {
			return err
		}
		// A tag this descriptor matches is never decided by a later one of the same key
		// (envoyproxy/ratelimit takes the first that matches at each level and does not
		// come back): guard every depth at which a later one has a limit.
		var depths []int
		for _, l := range order[i+1:] {
			if l.d.Key == o.d.Key {
				depths = limitDepths(l.d, depth, depths)
			}
		}
		slices.Sort(depths)
		for _, dd := range slices.Compact(depths) {
			g := string(pat) + strings.Repeat("/*", dd-depth)
			if !e.seen[g] {
				e.add(Rule{Name: "guard " + g, Match: g, PathGlob: true, guard: true, line: o.d.line})
			}
		}
	}
	return nil
}

// limitDepths appends the depths at which d (at depth) or its descendants have a limit.
func limitDepths(d *envoyDescriptor, depth int, out []int) []int {
	if d.RateLimit != nil {
		out = append(out, depth)
	}
	for i := range d.Descriptors {
		out = limitDepths(&d.Descriptors[i], depth+1, out)
	}
	return out
}

// node emits a descriptor's own rule (if it has a rate limit) and its descendants'.
func (e *envoyRules) node(pat []byte, depth int, d *envoyDescriptor) error {
	if rl := d.RateLimit; rl != nil {
		r := Rule{Name: rl.Name, Match: string(pat), PathGlob: true, Shadow: d.ShadowMode,
			DetailedMetrics: d.DetailedMetric || d.ValueToMetric, Shared: d.ShareThreshold, line: rl.line}
		unit, okUnit := envoyUnits[strings.ToLower(rl.Unit)]
		switch {
		case rl.Unlimited && rl.Unit != "":
			return yamlx.AtLine(rl.line, "rate_limit: unlimited with a unit")
		case rl.Unlimited:
			r.Unlimited = true
		case !okUnit:
			return yamlx.AtLine(rl.line, "rate_limit.unit: want second, minute, hour, day, week, month or year, not %q", rl.Unit)
		case rl.RequestsPerUnit == nil:
			return yamlx.AtLine(rl.line, "rate_limit.requests_per_unit: missing")
		case *rl.RequestsPerUnit < 0 || *rl.RequestsPerUnit > 1<<32-1:
			return yamlx.AtLine(rl.line, "rate_limit.requests_per_unit: want 0 to 4294967295, not %d", *rl.RequestsPerUnit)
		case *rl.RequestsPerUnit == 0:
			r.Deny = true
		default:
			n := *rl.RequestsPerUnit
			r.Limit = sluice.Limits{{Rate: n, Period: unit, Burst: n}}
		}
		e.add(r)
	}
	return e.level(pat, depth+1, d.Descriptors)
}

func (e *envoyRules) add(r Rule) {
	if e.seen == nil {
		e.seen = map[string]bool{}
	}
	e.seen[r.Match] = true
	e.rules = append(e.rules, r)
}

// envoyLimit is the limit of a rule in the terms of Envoy's API: requests per unit, the
// unit being the smallest of Envoy's that is at least the rule's first period (the
// requests rounded down).
func envoyLimit(ls sluice.Limits) (rpu uint32, unit string) {
	if len(ls) == 0 {
		return 0, "second"
	}
	l := ls[0]
	best, name := time.Duration(0), ""
	for n, u := range envoyUnits {
		if u >= l.Period && (best == 0 || u < best) {
			best, name = u, n
		}
	}
	if best == 0 {
		best, name = envoyUnits["year"], "year"
	}
	v := float64(l.Rate) * float64(best) / float64(l.Period)
	return uint32(min(v, float64(1<<32-1))), name
}
