package server

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice"
)

func rule(match string) Rule { return Rule{Match: match, Limit: sluice.MustParse("1/s")} }

func TestFirstMatchWins(t *testing.T) {
	rules := []Rule{rule("api-v2"), rule("api-*"), rule("api-v1"), rule("*-admin"), rule("user-??"), rule(`lit\*`), rule("*")}
	rs, err := newRuleSet(rules, nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ tag, want string }{
		{"api-v2", "api-v2"},   // exact, first
		{"api-v1", "api-*"},    // the pattern comes before the exact rule
		{"api-", "api-*"},      // '*' matches nothing too
		{"x-admin", "*-admin"}, // no literal prefix
		{"api-admin", "api-*"}, // both match: the first wins
		{"user-42", "user-??"}, // '?' is one character
		{"user-421", "*"},      // not two
		{"lit*", `lit\*`},      // an escaped '*' is literal
		{"litx", "*"},          // and is not a wildcard
		{"", "*"},
	}
	for i, c := range cases {
		got := rs.lookup(c.tag)
		if got == nil || got.Name != c.want {
			t.Errorf("case %d %q: got %v, want %q", i, c.tag, got, c.want)
		}
	}
	none, _ := newRuleSet([]Rule{rule("a")}, nil)
	if none.lookup("b") != nil {
		t.Errorf("an unmatched tag found a rule")
	}
	deflt, _ := newRuleSet([]Rule{rule("a")}, &Rule{Name: "default", Match: "*", Limit: sluice.MustParse("1/s")})
	if c := deflt.lookup("b"); c == nil || c.Name != "default" {
		t.Errorf("the default rule was not used")
	}
	if _, err := newRuleSet([]Rule{rule("a"), {Name: "a", Match: "b", Limit: sluice.MustParse("1/s")}}, nil); err == nil {
		t.Errorf("two rules named alike were accepted")
	}
}

func TestKeys(t *testing.T) {
	rs, _ := newRuleSet([]Rule{rule("api"), rule("user-*"), {Match: "team-*", Limit: sluice.MustParse("1/s"), Shared: true}}, nil)
	for _, c := range []struct{ tag, key string }{
		{"api", "api\x1f"},
		{"user-1", "user-*\x1fuser-1"},
		{"team-a", "team-*\x1f"},
		{"team-b", "team-*\x1f"},
	} {
		if got := rs.lookup(c.tag).key(c.tag); got != c.key {
			t.Errorf("%q: key %q, want %q", c.tag, got, c.key)
		}
	}
}

// TestGlobAgreesWithPathMatch: for patterns without '/' or '[', '*' and '?' mean what they
// mean in path.Match.
func TestGlobAgreesWithPathMatch(t *testing.T) {
	pats := []string{"a*", "*a", "a*b*c", "*", "??", "a?c", "*x*", "ab", "", "**", "a*a*a"}
	tags := []string{"", "a", "ab", "abc", "aXbYc", "xax", "aaa", "ba", "cab", "aa"}
	for _, p := range pats {
		for _, s := range tags {
			want, _ := path.Match(p, s)
			if got := globMatch(p, s); got != want {
				t.Errorf("globMatch(%q, %q) = %v, path.Match says %v", p, s, got, want)
			}
		}
	}
}

func FuzzGlobMatch(f *testing.F) {
	f.Add("a*b?c", "aXXbYc")
	f.Add("*", "")
	f.Add(`\*x`, "*x")
	f.Fuzz(func(t *testing.T, p, s string) {
		if strings.ContainsAny(p, `/[\`) || strings.Contains(s, "/") || !utf8.ValidString(p) || !utf8.ValidString(s) {
			globMatch(p, s) // must not panic or hang (tags are valid UTF-8: the daemon refuses others)
			return
		}
		want, err := path.Match(p, s)
		if err != nil {
			return
		}
		if got := globMatch(p, s); got != want {
			t.Fatalf("globMatch(%q, %q) = %v, path.Match %v", p, s, got, want)
		}
	})
}

// BenchmarkLookup10kRules: a lookup among 10,000 rules (exact tags, prefixes and globs with
// prefixes, a few without) stays under a microsecond.
func BenchmarkLookup10kRules(b *testing.B) {
	var rules []Rule
	for i := 0; i < 10000; i++ {
		switch i % 4 {
		case 0:
			rules = append(rules, rule(fmt.Sprintf("tenant-%05d", i)))
		case 1:
			rules = append(rules, rule(fmt.Sprintf("svc-%05d-*", i)))
		case 2:
			rules = append(rules, rule(fmt.Sprintf("ip-%05d.*.?", i)))
		case 3:
			if i%1000 == 3 {
				rules = append(rules, rule(fmt.Sprintf("*-%05d-suffix", i)))
			} else {
				rules = append(rules, rule(fmt.Sprintf("user-%05d", i)))
			}
		}
	}
	rs, err := newRuleSet(rules, &Rule{Name: "default", Match: "*", Limit: sluice.MustParse("1/s")})
	if err != nil {
		b.Fatal(err)
	}
	tags := []string{"tenant-09996", "svc-05001-abc", "ip-02002.10.1", "user-00007", "nobody-at-all", "x-07003-suffix"}
	for b.Loop() {
		for _, tag := range tags {
			if rs.lookup(tag) == nil {
				b.Fatal("no rule")
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(tags)), "ns/lookup")
}

// TestPathGlob: a path_glob rule's '*' and '?' stay within one '/'-separated part, so a
// rule matches only tags with as many parts as it has.
func TestPathGlob(t *testing.T) {
	for _, c := range []struct {
		p, s string
		want bool
	}{
		{"a/*", "a/b", true},
		{"a/*", "a/b/c", false},
		{"a/*/c", "a/b/c", true},
		{"a/*/c", "a/b/x/c", false},
		{"a/b=*", "a/b=", true},
		{"a/b=x*", "a/b=xyz", true},
		{"a/?", "a/é", true},
		{"a/?", "a/", false},
		{"*", "a/b", false},
		{"a/*/*", "a/b", false},
		{"a", "a", true},
	} {
		if got := pathGlobMatch(c.p, c.s); got != c.want {
			t.Errorf("pathGlobMatch(%q, %q) = %v, want %v", c.p, c.s, got, c.want)
		}
		if want, _ := path.Match(c.p, c.s); want != c.want {
			t.Errorf("path.Match(%q, %q) = %v: the test's want disagrees", c.p, c.s, want)
		}
	}
	rs, err := newRuleSet([]Rule{{Match: "d/a=*/b=*", Limit: sluice.MustParse("1/s"), PathGlob: true}, rule("d/*")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for tag, want := range map[string]string{"d/a=1/b=2": "d/a=*/b=*", "d/a=1/x=5/b=2": "d/*", "d/a=1": "d/*"} {
		if got := rs.lookup(tag); got == nil || got.Match != want {
			t.Errorf("%q: rule %v, want %q", tag, got, want)
		}
	}
}

// TestRuleKinds: unlimited, deny and shadow rules over the line protocol, counted.
func TestRuleKinds(t *testing.T) {
	cfg := testConfig()
	cfg.Rules = []Rule{
		{Match: "free-*", Unlimited: true},
		{Match: "blocked", Deny: true},
		{Match: "trial-*", Limit: sluice.MustParse("1/h"), Shadow: true, DetailedMetrics: true},
	}
	s := start(t, cfg)
	c := dial(t, s)
	if got := exchange(t, c, "free-1\nfree-1\nblocked\ntrial-a\ntrial-a\ntrial-b\n", 18); got != "OK\nOK\nNO\nOK\nOK\nOK\n" {
		t.Errorf("answers %q", got)
	}
	for _, m := range []struct {
		rule, result string
		want         float64
	}{{"free-*", "allowed", 2}, {"blocked", "denied", 1}, {"trial-*", "allowed", 2}, {"trial-*", "shadowed", 1}} {
		if got := testutil.ToFloat64(s.m.decisions.WithLabelValues(m.rule, m.result)); got != m.want {
			t.Errorf("%s %s: %v, want %v", m.rule, m.result, got, m.want)
		}
	}
	if got := testutil.ToFloat64(s.m.tagDecisions.WithLabelValues("trial-*", "trial-a", "shadowed")); got != 1 {
		t.Errorf("trial-a shadowed by tag: %v, want 1", got)
	}
	if _, err := s.Lift(context.Background(), "free-1"); err != nil {
		t.Errorf("lift on an unlimited rule: %v", err)
	}
	if _, err := s.Penalize(context.Background(), "blocked", time.Second); !errors.Is(err, ErrPenaltyRefused) {
		t.Errorf("penalty on a deny rule: %v, want refused", err)
	}
	for i, bad := range []Rule{{Match: "x", Unlimited: true, Deny: true}, {Match: "x", Deny: true, Limit: sluice.MustParse("1/s")}} {
		cfg := testConfig()
		cfg.Rules = []Rule{bad}
		if err := cfg.Validate(); err == nil {
			t.Errorf("case %d: %+v accepted", i, bad)
		}
	}
}

// TestDetailedMetricsBounded: a rule counts at most MaxDetailedTags tags by name.
func TestDetailedMetricsBounded(t *testing.T) {
	m := newMetrics(nil, func() float64 { return 0 }, func() float64 { return 0 })
	tc := m.forTags("r")
	for i := range MaxDetailedTags + 50 {
		tc.count(fmt.Sprint("t", i), resultAllowed)
	}
	if n := len(tc.tags); n != MaxDetailedTags+1 {
		t.Errorf("%d tags counted by name, want %d and _other", n, MaxDetailedTags)
	}
	if got := testutil.ToFloat64(m.tagDecisions.WithLabelValues("r", "_other", "allowed")); got != 50 {
		t.Errorf("_other %v, want 50", got)
	}
}
