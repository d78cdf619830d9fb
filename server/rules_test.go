package server

import (
	"fmt"
	"path"
	"strings"
	"testing"
	"unicode/utf8"

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
