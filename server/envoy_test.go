package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The example files in testdata/envoy are written in envoyproxy/ratelimit's format after
// the examples its documentation gives (a database's calls per second, messages per day
// with a marketing exception, per-IP limits with a blocked and an unlimited address,
// a shadowed limit, wildcards, nested keys). Each is parsed into the rules it should give,
// and each lookup is the rule (by match) the descriptor should be decided by ("" none).

type wantRule struct {
	match, limit string // limit: the text form, "unlimited" or "deny"
	shadow       bool
	shared       bool
	detailed     bool
}

func TestEnvoyConfigExamples(t *testing.T) {
	type lookup struct {
		entries []EnvoyEntry
		want    string
	}
	e := func(kv ...string) []EnvoyEntry {
		var out []EnvoyEntry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, EnvoyEntry{kv[i], kv[i+1]})
		}
		return out
	}
	cases := []struct {
		file    string
		domain  string
		rules   []wantRule
		lookups []lookup
	}{
		{"database.yaml", "mongo_cps", []wantRule{
			{match: "mongo_cps/database=users", limit: "500/s"},
			{match: "mongo_cps/database=default", limit: "500/s"},
		}, []lookup{
			{e("database", "users"), "mongo_cps/database=users"},
			{e("database", "other"), ""},
			{e("database", "users", "extra", "x"), ""}, // deeper than the config: no limit
		}},
		{"messaging.yaml", "messaging", []wantRule{
			{match: "messaging/message_type=marketing/to_number=*", limit: "5/24h"},
			{match: "messaging/to_number=*", limit: "100/24h"},
		}, []lookup{
			{e("message_type", "marketing", "to_number", "2061234567"), "messaging/message_type=marketing/to_number=*"},
			{e("to_number", "2061234567"), "messaging/to_number=*"},
			{e("message_type", "marketing"), ""}, // no limit at that depth
			{e("message_type", "other", "to_number", "1"), ""},
		}},
		{"per_ip.yaml", "edge_proxy_per_ip", []wantRule{
			{match: "edge_proxy_per_ip/remote_address=50.0.0.5", limit: "deny"},
			{match: "edge_proxy_per_ip/remote_address=10.0.0.1", limit: "unlimited"},
			{match: "edge_proxy_per_ip/remote_address=*", limit: "10/s", detailed: true},
		}, []lookup{
			{e("remote_address", "50.0.0.5"), "edge_proxy_per_ip/remote_address=50.0.0.5"},
			{e("remote_address", "10.0.0.1"), "edge_proxy_per_ip/remote_address=10.0.0.1"},
			{e("remote_address", "1.2.3.4"), "edge_proxy_per_ip/remote_address=*"},
		}},
		{"shadow.yaml", "shadow", []wantRule{
			{match: "shadow/api_key=*", limit: "20/m", shadow: true},
		}, []lookup{
			{e("api_key", "k1"), "shadow/api_key=*"},
		}},
		{"wildcard.yaml", "paths", []wantRule{
			{match: "paths/path=%2Fapi%2Fv1%2Fusers", limit: "50/s"},
			{match: "paths/path=%2Fapi%2F*", limit: "100/s", shared: true},
			{match: "paths/path=%2F*", limit: "10/s"},
			{match: "paths/path=*", limit: "1/s"},
		}, []lookup{
			{e("path", "/api/v1/users"), "paths/path=%2Fapi%2Fv1%2Fusers"},
			{e("path", "/api/v1/orders"), "paths/path=%2Fapi%2F*"},
			{e("path", "/static/x.css"), "paths/path=%2F*"},
			{e("path", "relative"), "paths/path=*"},
		}},
		{"nested.yaml", "nested", []wantRule{
			{match: "nested/client_id=foo", limit: "5/s"},
			{match: "nested/client_id=foo/path=%2Fbar", limit: "10/s"},
			{match: "guard nested/client_id=foo/*"},
			{match: "nested/client_id=*/path=*", limit: "1/s"},
		}, []lookup{
			{e("client_id", "foo", "path", "/bar"), "nested/client_id=foo/path=%2Fbar"},
			{e("client_id", "foo"), "nested/client_id=foo"},
			// foo is taken at the first level, and has no other path: no limit, as
			// envoyproxy/ratelimit answers (it does not go back to the key alone)
			{e("client_id", "foo", "path", "/other"), ""},
			{e("client_id", "baz", "path", "/other"), "nested/client_id=*/path=*"},
			{e("client_id", "baz"), ""},
		}},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			cfg, err := LoadEnvoyConfig(filepath.Join("testdata", "envoy", c.file))
			if err != nil {
				t.Fatal(err)
			}
			var got []wantRule
			for _, r := range cfg.Rules {
				w := wantRule{match: r.Match, limit: r.Limit.String(), shadow: r.Shadow, shared: r.Shared, detailed: r.DetailedMetrics}
				switch {
				case r.guard:
					w = wantRule{match: r.Name}
				case r.Unlimited:
					w.limit = "unlimited"
				case r.Deny:
					w.limit = "deny"
				}
				if !r.PathGlob {
					t.Errorf("rule %q: not a path pattern", r.Match)
				}
				got = append(got, w)
			}
			if len(got) != len(c.rules) {
				t.Fatalf("rules:\n got %+v\nwant %+v", got, c.rules)
			}
			for i := range got {
				if got[i] != c.rules[i] {
					t.Errorf("rule %d: got %+v, want %+v", i, got[i], c.rules[i])
				}
			}
			rs, err := cfg.ruleSet()
			if err != nil {
				t.Fatal(err)
			}
			for i, l := range c.lookups {
				tag := EnvoyTag(c.domain, l.entries...)
				r := rs.lookup(tag)
				name := ""
				if r != nil {
					name = r.Match
				}
				if name != l.want {
					t.Errorf("lookup %d %q: got rule %q, want %q", i, tag, name, l.want)
				}
			}
		})
	}
}

func TestEnvoyConfigErrors(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"descriptors: []\n", "e.yaml:1: domain: empty"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    colour: red\n", `e.yaml:5: unknown field "colour"`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", `e.yaml:5: rate_limit.unit: want second, minute`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n", "e.yaml:5: rate_limit.requests_per_unit: missing"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", "e.yaml:5: rate_limit.requests_per_unit: want 0 to 4294967295"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n", "e.yaml:5: rate_limit: unlimited with a unit"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: b\n", "e.yaml:8: replaces: not supported by sluice"},
		{"domain: d\ndescriptors:\n  - value: x\n", "e.yaml:3: descriptor: empty key"},
		{"domain: d\ndescriptors:\n  - key: a\n  - key: a\n", "e.yaml:4: descriptor a=: twice at this level (line 3 too)"},
		{"domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n", "e.yaml:3: descriptor a: share_threshold needs a wildcard value"},
		{"domain: d\nlimits: []\n", `e.yaml:2: unknown field "limits"`},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: x, unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {name: x, unit: second, requests_per_unit: 1}\n", `e.yaml:6: rules[1]: the name "x" is used twice`},
		{"", "e.yaml: empty file"},
	}
	for i, c := range cases {
		_, err := ParseEnvoyConfig("e.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("case %d: got %v, want %q", i, err, c.want)
		}
	}
}

func TestEnvoyTagEscapes(t *testing.T) {
	got := EnvoyTag("d/1", EnvoyEntry{"path", "/a=b%c"}, EnvoyEntry{"k", ""}, EnvoyEntry{"n", "line\nbreak"})
	want := "d%2F1/path=%2Fa%3Db%25c/k=/n=line%0Abreak"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := os.Stat(filepath.Join("testdata", "envoy")); err != nil {
		t.Fatal(err)
	}
}

func FuzzParseEnvoyConfig(f *testing.F) {
	entries, _ := os.ReadDir(filepath.Join("testdata", "envoy"))
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join("testdata", "envoy", e.Name()))
		f.Add(b)
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    value: 'x*'\n    descriptors: [{key: b}]\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := ParseEnvoyConfig("f.yaml", b)
		if err != nil {
			return
		}
		if _, err := cfg.ruleSet(); err != nil {
			t.Fatalf("a config that parsed does not compile: %v", err)
		}
	})
}
