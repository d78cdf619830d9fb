package server

import (
	"strings"
	"testing"

	_ "github.com/sluicehq/sluice/store/all" // the daemon links every store: Validate checks their URLs
)

const goodConfig = `
listen_line: 127.0.0.1:7070
listen_http: 127.0.0.1:7071
fail_mode: open
margin: 5ms
idle_timeout: 1m
rules:
  - match: api
    limit: 10/s
  - name: users
    match: "user-*"
    limit: 5/s burst=10
  - match: "team-*"
    limit: "100/s; 4500/h"
    shared: true
default:
  limit: 50/s
`

func TestLoadConfig(t *testing.T) {
	cfg, err := ParseConfig("sluice.yaml", []byte(goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.FailMode != "open" || cfg.Margin.D().Milliseconds() != 5 || len(cfg.Rules) != 3 || cfg.Rules[1].Name != "users" ||
		!cfg.Rules[2].Shared || len(cfg.Rules[2].Limit) != 2 || cfg.Default == nil || cfg.MaxLine != 1024 {
		t.Errorf("config %+v", cfg)
	}
}

// TestConfigDeprecatedSpellings: backend redis and redis_url still read for one release,
// as backend strict and store, each with a warning that names the new spelling; the new
// spellings warn of nothing.
func TestConfigDeprecatedSpellings(t *testing.T) {
	c, err := ParseConfig("c.yaml", []byte("backend: redis\nredis_url: redis://127.0.0.1:6379\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Backend != "strict" || c.Store != "redis://127.0.0.1:6379" || !c.StrictOnRedis() {
		t.Errorf("backend %q, store %q: want strict on redis://127.0.0.1:6379", c.Backend, c.Store)
	}
	w := strings.Join(c.Warnings(), "\n")
	for _, want := range []string{"backend redis (--backend redis) is deprecated: use backend strict", "redis_url (--redis-url) is deprecated: use store"} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings %q, want %q", w, want)
		}
	}
	c, err = ParseConfig("c.yaml", []byte("backend: strict\nstore: etcd://127.0.0.1:2379\n"))
	if err != nil || len(c.Warnings()) != 0 || c.StrictOnRedis() {
		t.Errorf("backend strict on etcd: %v, warnings %q, on Redis %v", err, c.Warnings(), c.StrictOnRedis())
	}
}

func TestConfigErrorsNameFileAndLine(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"listen_line: x\nbogus: 1\n", `c.yaml:2: unknown field "bogus"`},
		{"listen_line: x\nbogus: 1\nrules: []\nextra: 2\n", "c.yaml:2: unknown field \"bogus\"\nc.yaml:4: unknown field \"extra\""},
		{"rules:\n  - {match: a, limit: 1/s}\n  - {match: b, limit: 1/s}\n  - {match: a, limit: 2/s}\n", `c.yaml:4: rules[2]: the name "a" is used twice (by rules[0] too)`},
		{"rules:\n  - match: api\n    limit: ten per sec\n", "c.yaml:3: sluice: bad limit"},
		{"rules:\n  - match: api\n", "c.yaml:2: rules[0].limit: missing"},
		{"rules:\n  - match: api\n    limit: 1/s\n    colour: red\n", `c.yaml:4: unknown field "colour"`},
		{"rules:\n  - match: api\n    limit: 1/s\n    shared: true\n", "c.yaml:2: rules[0]: shared only means something for a pattern"},
		{"fail_mode: sideways\n", "c.yaml:1: fail_mode: want closed, open or local"},
		{"fail_mode: local\n", "c.yaml:1: fail_mode local degrades the strict mode on Redis"},
		{"backend: strict\nstore: etcd://x:1\nfail_mode: local\nfallback_share: 0.5\n", "c.yaml:3: fail_mode local degrades the strict mode on Redis"},
		{"backend: redis\nredis_url: redis://x\nfail_mode: local\n", "c.yaml:3: fail_mode local needs fallback_share"},
		{"backend: redis\n", "c.yaml:1: backend strict needs store"},
		{"backend: strict\n", "c.yaml:1: backend strict needs store"},
		{"backend: lease\n", "c.yaml:1: backend lease needs store"},
		{"redis_replica_acks: 1\n", "c.yaml:1: redis_replica_acks: want 0 or more, and only with backend strict on a redis"},
		{"backend: redis\nredis_url: redis://x\nredis_replica_acks: -1\n", "c.yaml:3: redis_replica_acks: want 0 or more"},
		{"idle_timeout: soon\n", "c.yaml:1: bad duration"},
		{"max_line: 5\n", "c.yaml:1: max_line"},
		{"rules:\n  - {match: a, limit: 1/s}\n  - {name: a, match: b, limit: 1/s}\n", `c.yaml:3: rules[1]: the name "a" is used twice`},
		{"rules:\n  - {name: default, match: b, limit: 1/s}\ndefault: {limit: 1/s}\n", `c.yaml:2: default: the name "default" is used twice (by rules[0] too)`},
		{"", "c.yaml: empty file"},
		{"backend: gossip\ngossip: {policy: loud}\n", "c.yaml:2: gossip.policy: want auto, owner, shares, equal or whole"},
		{"listen_grpc: 127.0.0.1:0\ngrpc:\n  transport: grpc\n", `c.yaml:3: grpc.transport: want lean or grpc-go, not "grpc"`},
		{"backend: gossip\ngossip: {bind: ''}\n", "c.yaml:2: backend gossip needs gossip.bind"},
		{"backend: gossip\ngossip: {colour: red}\n", `c.yaml:2: unknown field "colour"`},
		{"backend: gossip\nrules:\n  - {match: api, limit: 1/s, gossip: loud}\n", `c.yaml:3: rules[0].gossip: want owner, shares or auto, not "loud"`},
		{"backend: gossip\nrules:\n  - {match: api, limit: 1/s, gossip: equal}\n", `c.yaml:3: rules[0].gossip: want owner, shares or auto, not "equal"`},
		{"rules:\n  - {match: api, limit: 1/s, gossip: owner}\n", `c.yaml:2: rules[0].gossip: "owner" is for backend gossip (this one is local)`},
		{"backend: gossip\ngossip: {policy: equal}\nrules:\n  - {match: api, limit: 1/s, gossip: owner}\n", `c.yaml:4: rules[0].gossip: "owner" with gossip.policy equal`},
		// every problem at once, each at its line, in the file's order
		{"nonsense_key: 1\nbackend: lcoal\nrules:\n  - match: a\n    limit: 1/x\n  - match: b\n    limit: 10/s burst=0\n  - limit: 1/s\nmax_line: 5\n",
			"c.yaml:1: unknown field \"nonsense_key\"\nc.yaml:2: backend: want local, strict, lease or gossip, not \"lcoal\"\nc.yaml:5: sluice: bad limit \"1/x\""},
		{"nonsense_key: 1\nbackend: lcoal\nrules:\n  - match: a\n    limit: 1/x\n  - match: b\n    limit: 10/s burst=0\n  - limit: 1/s\nmax_line: 5\n",
			"c.yaml:7: sluice: bad limit \"10/s burst=0\""},
		{"nonsense_key: 1\nbackend: lcoal\nrules:\n  - match: a\n    limit: 1/x\n  - match: b\n    limit: 10/s burst=0\n  - limit: 1/s\nmax_line: 5\n",
			"c.yaml:8: rules[2]: no match (want match: a tag, or a pattern such as user-*)\nc.yaml:9: max_line"},
		{"rules:\n  - match: x\n    limit: 5/s\n     shared: true\n", "c.yaml:4: mapping values are not allowed"},
	}
	for i, c := range cases {
		_, err := ParseConfig("c.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("case %d: got %v, want %q", i, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "limit: missing") && strings.Contains(err.Error(), "bad limit") {
			t.Errorf("case %d: a limit that did not read is reported missing too: %v", i, err)
		}
	}
}

func TestParseRuleFlag(t *testing.T) {
	cases := []struct {
		in, match, limit string
		bad              bool
	}{
		{in: "api=10/s", match: "api", limit: "10/s"},
		{in: "user-*=5/s burst=10", match: "user-*", limit: "5/s burst=10"},
		{in: "a=b=1/s", match: "a=b", limit: "1/s"},
		{in: "x=1/s; 100/h", match: "x", limit: "1/s; 100/h"},
		{in: "=1/s", bad: true},
		{in: "api", bad: true},
		{in: "api=ten", bad: true},
	}
	for i, c := range cases {
		r, err := ParseRuleFlag(c.in, false)
		if (err != nil) != c.bad || (!c.bad && (r.Match != c.match || r.Limit.String() != c.limit)) {
			t.Errorf("case %d %q: got %+v %v", i, c.in, r, err)
		}
	}
	if _, err := ParseRuleFlag("api=1/s", true); err == nil {
		t.Errorf("a shared exact rule was accepted")
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(goodConfig))
	f.Add([]byte("rules: [{match: '*', limit: 1/s}]"))
	f.Add([]byte("default: {limit: 1/s, shared: true}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := ParseConfig("f.yaml", b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("a parsed config does not validate: %v", err)
		}
	})
}

// TestGossipPolicies: a rule's own gossip policy reaches the back end by the rule's name
// in its buckets' keys (a tag's own bucket and a pattern's shared one alike); other rules'
// keys keep gossip.policy's.
func TestGossipPolicies(t *testing.T) {
	c, err := ParseConfig("c.yaml", []byte("backend: gossip\nrules:\n  - {match: api, limit: 1000/s burst=500, gossip: owner}\n  - {name: users, match: user-*, limit: 5/s, gossip: shares}\n  - {match: other, limit: 1/s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := c.ruleSet()
	if err != nil {
		t.Fatal(err)
	}
	of := GossipPolicies(c.Rules)
	for tag, want := range map[string]string{"api": "owner", "user-7": "shares", "other": ""} {
		ru := rs.lookup(tag)
		if ru == nil {
			t.Fatalf("no rule for %q", tag)
		}
		p, ok := of(ru.key(tag))
		if got := map[bool]string{true: p.String(), false: ""}[ok]; got != want {
			t.Errorf("%q (key %q): policy %q, want %q", tag, ru.key(tag), got, want)
		}
	}
	if GossipPolicies(nil) != nil {
		t.Error("no rule sets one: want nil (gossip.policy for every key)")
	}
}
