package server

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/internal/yamlx"
)

// Rule maps tags to a limit. Match is an exact tag, or a glob where '*' matches any run of
// characters (none included) and '?' any one character; '\' makes the next character
// literal. The first rule that matches a tag wins. A pattern gives each matching tag its
// own bucket, unless Shared: then all its tags draw from one.
type Rule struct {
	Name   string        `yaml:"name"`   // how metrics and the API name it; default: Match
	Match  string        `yaml:"match"`  // exact tag or glob
	Limit  sluice.Limits `yaml:"limit"`  // in the shared text form
	Shared bool          `yaml:"shared"` // one bucket for every tag the rule matches
	// MaxPenalty caps the holds clients put on the rule's tags (p=); unset: the server's
	// max_penalty.
	MaxPenalty PenaltyCap `yaml:"max_penalty"`
	// PathGlob makes Match a path pattern: '/' separates segments, and '*' and '?' match
	// within one segment only, as in path.Match ("api/*" matches "api/a", not "api/a/b").
	PathGlob bool `yaml:"path_glob"`
	// Unlimited allows every tag the rule matches, with no bucket (and no Limit); Deny
	// refuses every one. Their decisions are counted like any other rule's.
	Unlimited bool `yaml:"unlimited"`
	Deny      bool `yaml:"deny"`
	// Shadow decides and counts as usual but answers every denial as allowed (counted as
	// result "shadowed"): a dry run of a limit. A back-end failure still follows the fail
	// mode.
	Shadow bool `yaml:"shadow"`
	// DetailedMetrics also counts the rule's decisions by tag
	// (sluice_tag_decisions_total{rule,tag,result}), for the first MaxDetailedTags tags of
	// the rule; later tags are counted under the tag "_other". The tags appear in /metrics.
	DetailedMetrics bool `yaml:"detailed_metrics"`
	// Gossip, with backend gossip, decides the rule's tags at their owner ("owner": exact,
	// one forwarded query per decision) or by shares ("shares": at memory speed, within the
	// mode's bound), or chooses by the limit's size ("auto"), in place of gossip.policy;
	// "": gossip.policy's.
	Gossip string `yaml:"gossip"`

	// guard marks a rule that stops the search: a tag it matches is decided as if no rule
	// matched (by the default rule, if any). Configs in Envoy's format need them, where a
	// more specific descriptor hides a less specific one even when it has no limit.
	guard    bool
	line     int
	bad      error // what did not read from its file (a *yaml.TypeError), reported by the check
	badLimit bool  // its limit's text did not parse (in bad)
}

// keySep ends a rule's name in the keys of its buckets: RULE keySep, then the tag for a
// tag's own bucket. Tags are unlikely to carry it.
const keySep = "\x1f"

// GossipPolicies returns, for the gossip back end, the policy of each bucket key whose
// rule sets its own (Rule.Gossip, validated), read from the rule's name in the key; nil
// when no rule sets one.
func GossipPolicies(rules []Rule) func(key string) (hits.Policy, bool) {
	own := map[string]hits.Policy{}
	for name, g := range gossipByRule(rules) {
		if p, err := hits.ParsePolicy(g); err == nil {
			own[name] = p
		}
	}
	if len(own) == 0 {
		return nil
	}
	return func(key string) (hits.Policy, bool) {
		name, _, _ := strings.Cut(key, keySep)
		p, ok := own[name]
		return p, ok
	}
}

// MaxDetailedTags is how many tags of a rule with DetailedMetrics are counted by name.
const MaxDetailedTags = 1000

// noLimit reports whether the rule decides without a bucket.
func (r *Rule) noLimit() bool { return r.Unlimited || r.Deny || r.guard }

// isPattern reports whether m has an unescaped wildcard.
func isPattern(m string) bool {
	for i := 0; i < len(m); i++ {
		switch m[i] {
		case '\\':
			i++
		case '*', '?':
			return true
		}
	}
	return false
}

// literalPrefix returns the characters of a glob before its first wildcard, unescaped.
func literalPrefix(m string) string {
	var b strings.Builder
	for i := 0; i < len(m); i++ {
		switch c := m[i]; c {
		case '\\':
			if i+1 < len(m) {
				i++
				b.WriteByte(m[i])
			}
		case '*', '?':
			return b.String()
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// literalSuffix returns the characters of a glob after its last wildcard, unescaped ("" if
// the last character is a wildcard).
func literalSuffix(m string) string {
	last := -1
	for i := 0; i < len(m); i++ {
		switch m[i] {
		case '\\':
			i++
		case '*', '?':
			last = i
		}
	}
	return unescape(m[last+1:])
}

// unescape removes the escapes of an exact match.
func unescape(m string) string { return literalPrefix(m) }

// pathGlobMatch matches s against a path pattern: both are split at '/', and each segment
// of s must match the pattern's segment at the same place (so '*' and '?' never match '/').
func pathGlobMatch(p, s string) bool {
	for {
		pi, si := strings.IndexByte(p, '/'), strings.IndexByte(s, '/')
		if pi < 0 || si < 0 {
			return pi < 0 && si < 0 && globMatch(p, s)
		}
		if !globMatch(p[:pi], s[:si]) {
			return false
		}
		p, s = p[pi+1:], s[si+1:]
	}
}

// globMatch matches s against pattern p ('*', '?', '\' escapes), iteratively with one
// backtrack point: linear for the patterns rules use. '?' matches one character (a UTF-8
// rune, as path.Match does), and '*' any run of whole characters.
func globMatch(p, s string) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		if pi < len(p) {
			switch c := p[pi]; c {
			case '*':
				star, mark = pi, si
				pi++
				continue
			case '?':
				_, n := utf8.DecodeRuneInString(s[si:])
				pi++
				si += n
				continue
			case '\\':
				if pi+1 < len(p) && p[pi+1] == s[si] {
					pi += 2
					si++
					continue
				}
			default:
				if c == s[si] {
					pi++
					si++
					continue
				}
			}
		}
		if star < 0 {
			return false
		}
		pi = star + 1
		_, n := utf8.DecodeRuneInString(s[mark:])
		mark += n
		si = mark
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// ruleSet finds the first rule that matches a tag. Exact rules are a map; patterns are
// indexed by their literal prefix (the characters before the first wildcard) in a map, and
// a lookup tries only the prefix lengths that occur, so it tests only the patterns whose
// prefix the tag has, plus those with no prefix at all. It is immutable once built and
// safe for concurrent use.
type ruleSet struct {
	rules      []*compiled
	exact      map[string]int   // tag -> index of the first exact rule for it
	byPrefix   map[string][]int // literal prefix -> patterns with it, in order
	prefixLens []int            // the prefix lengths that occur, ascending
	bySuffix   map[string][]int // for patterns with no literal prefix: literal suffix -> patterns
	suffixLens []int            // the suffix lengths that occur, ascending
	noPre      []int            // patterns with neither a literal prefix nor suffix, in order
	deflt      int              // index of the default rule, or -1
}

type compiled struct {
	Rule
	index    int
	pattern  bool
	prefix   bool         // a literal prefix followed by a single trailing '*': no glob test needed
	detailed *tagCounters // by tag, with DetailedMetrics
	// the limit in Envoy's terms (requests per unit), for the gRPC answers
	envoyRPU  uint32
	envoyUnit rls.RateLimitResponse_RateLimit_Unit
	limiter   *sluice.Limiter
	rampStart time.Time // when the limiter's ramps started (sluice.WithRampStart)
	counters  ruleCounters
	keyBase   string // bucket key, or its prefix for per-tag rules
	prefixOf  string
	penMax    time.Duration // the longest client penalty, if penOK
	penOK     bool          // clients may set penalties on the rule's tags
}

func newRuleSet(rules []Rule, deflt *Rule) (*ruleSet, error) {
	rs := &ruleSet{exact: map[string]int{}, byPrefix: map[string][]int{}, bySuffix: map[string][]int{}, deflt: -1}
	all := rules
	if deflt != nil {
		all = append(append([]Rule(nil), rules...), *deflt)
	}
	names := map[string]int{} // name -> index of the rule that has it
	label := func(i int) string {
		if deflt != nil && i == len(all)-1 {
			return "default"
		}
		return fmt.Sprintf("rules[%d]", i)
	}
	for i, r := range all {
		if r.Name == "" {
			r.Name = r.Match
		}
		if first, dup := names[r.Name]; dup {
			line := r.line
			if line == 0 { // the default rule, or a flag's: point at the other one
				line = all[first].line
			}
			return nil, yamlx.AtLine(line, "%s: the name %q is used twice (by %s too); a rule is named by name, else by match", label(i), r.Name, label(first))
		}
		names[r.Name] = i
		c := &compiled{Rule: r, index: i, pattern: isPattern(r.Match)}
		c.keyBase = r.Name + keySep
		rs.rules = append(rs.rules, c)
		if deflt != nil && i == len(all)-1 {
			rs.deflt = i
			c.pattern = true
			continue
		}
		if !c.pattern {
			tag := unescape(r.Match)
			if _, dup := rs.exact[tag]; !dup {
				rs.exact[tag] = i
			}
			continue
		}
		pre := literalPrefix(r.Match)
		c.prefixOf = pre
		c.prefix = r.Match == escapeGlob(pre)+"*" && !r.PathGlob
		if pre == "" {
			if suf := literalSuffix(r.Match); suf != "" {
				if !slices.Contains(rs.suffixLens, len(suf)) {
					rs.suffixLens = append(rs.suffixLens, len(suf))
				}
				rs.bySuffix[suf] = append(rs.bySuffix[suf], i)
			} else {
				rs.noPre = append(rs.noPre, i)
			}
			continue
		}
		if _, seen := rs.byPrefix[pre]; !seen && !slices.Contains(rs.prefixLens, len(pre)) {
			rs.prefixLens = append(rs.prefixLens, len(pre))
		}
		rs.byPrefix[pre] = append(rs.byPrefix[pre], i)
	}
	slices.Sort(rs.prefixLens)
	slices.Sort(rs.suffixLens)
	return rs, nil
}

// escapeGlob escapes the wildcards of a literal.
func escapeGlob(s string) string {
	if !strings.ContainsAny(s, `*?\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '*' || c == '?' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// lookup returns the first rule matching tag, or nil.
func (rs *ruleSet) lookup(tag string) *compiled {
	best := len(rs.rules)
	if i, ok := rs.exact[tag]; ok {
		best = i
	}
	test := func(i int) {
		if i >= best {
			return
		}
		c := rs.rules[i]
		if c.prefix || c.matches(tag) {
			best = i
		}
	}
	for _, i := range rs.noPre {
		if i >= best {
			break
		}
		test(i)
	}
	for _, l := range rs.prefixLens {
		if l > len(tag) {
			break
		}
		for _, i := range rs.byPrefix[tag[:l]] {
			if i >= best {
				break
			}
			test(i)
		}
	}
	for _, l := range rs.suffixLens {
		if l > len(tag) {
			break
		}
		for _, i := range rs.bySuffix[tag[len(tag)-l:]] {
			if i >= best {
				break
			}
			test(i)
		}
	}
	if best < len(rs.rules) && !rs.rules[best].guard {
		return rs.rules[best]
	}
	if rs.deflt >= 0 {
		return rs.rules[rs.deflt]
	}
	return nil
}

// matches reports whether the pattern rule c matches tag.
func (c *compiled) matches(tag string) bool {
	if c.PathGlob {
		return pathGlobMatch(c.Match, tag)
	}
	return globMatch(c.Match, tag)
}

// key is the bucket a tag draws from under rule c: the rule's own for a shared rule or
// an exact one, the rule's and the tag's otherwise. Keys depend on rule names, not
// positions, so a reload keeps every bucket whose rule keeps its name.
func (c *compiled) key(tag string) string {
	if c.Shared || !c.pattern {
		return c.keyBase
	}
	return c.keyBase + tag
}

// bucketName says a bucket's key in the API's words: RULE:TAG for a tag's own bucket (an
// exact rule's tag is its match), RULE (shared) for a pattern's shared one.
func (rs *ruleSet) bucketName(key string) string {
	rule, tag, ok := strings.Cut(key, keySep)
	if !ok {
		return key
	}
	if tag == "" {
		for _, c := range rs.rules {
			if c.Name != rule {
				continue
			}
			if c.pattern {
				return rule + " (shared)"
			}
			tag = c.Match
			break
		}
	}
	return rule + ":" + tag
}
