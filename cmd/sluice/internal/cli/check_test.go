package cli

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/server"
)

// TestCheckFlagsAnywhereAndExitCodes: `sluice check` takes its flags before or after the
// tag, and its exit codes tell allowed (0), denied (1), bad usage (2) and a daemon that
// does not answer (3) apart.
func TestCheckFlagsAnywhereAndExitCodes(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.ListenLine, cfg.ListenHTTP = "127.0.0.1:0", ""
	r, err := server.ParseRuleFlag("api=3/h", false)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Rules = []server.Rule{r}
	srv, err := server.New(cfg, server.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(t.Context())
	addr := srv.LineAddr().String()
	steps := []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"check", "--addr", addr, "api", "--n", "2"}, ExitOK, "OK remaining=1"},
		{[]string{"check", "api", "--addr", addr, "--n", "2"}, ExitDenied, "NO retry_after="},
		{[]string{"check", "--n", "0", "api", "--addr", addr}, ExitOK, "remaining=1"},
		{[]string{"check", "--addr", addr, "--", "api"}, ExitOK, "OK"},
		{[]string{"check", "api", "--addr", addr, "--quiet"}, ExitDenied, ""},
	}
	for i, s := range steps {
		code, out, errs := run(t, s.args...)
		if code != s.code || !strings.Contains(out, s.out) {
			t.Errorf("step %d %v: got exit %d out %q err %q, want %d and %q", i, s.args, code, out, errs, s.code, s.out)
		}
	}
	dead := proctest.FreeAddr(t) // nobody listens there
	for i, c := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"check", "api", "--addr", dead}, ExitUnreachable, "unavailable"},
		{[]string{"check", "api", "extra", "--addr", addr}, ExitUsage, "want one tag"},
		{[]string{"check", "--addr", addr}, ExitUsage, "no tag"},
		{[]string{"check", "api", "--n"}, ExitUsage, "flag needs an argument"},
	} {
		code, _, errs := run(t, c.args...)
		if code != c.code || !strings.Contains(errs, c.err) {
			t.Errorf("case %d %v: got exit %d err %q, want %d and %q", i, c.args, code, errs, c.code, c.err)
		}
	}
}

// TestErrorsSayTheirPrefixOnce: an error from a package below the command reads
// "sluice: ...", not "sluice: ... sluice: ...".
func TestErrorsSayTheirPrefixOnce(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--limit", "ten per sec"},
		{"serve", "--limit", "api=ten", "--listen-line", "127.0.0.1:0", "--listen-http", ""},
		{"referee", "--limit", "0/s"},
	} {
		code, _, errs := run(t, args...)
		if code != ExitUsage || strings.Count(errs, "sluice:") != 1 || !strings.HasPrefix(errs, "sluice: ") {
			t.Errorf("%v: exit %d, stderr %q: want one sluice: prefix", args, code, errs)
		}
	}
}

// TestCompletion: the scripts are valid bash and zsh, name every command, and bash
// completes a command's flags and a flag's values.
func TestCompletion(t *testing.T) {
	dir := t.TempDir()
	for _, sh := range []string{"bash", "zsh"} {
		code, out, errs := run(t, "completion", sh)
		if code != 0 {
			t.Fatalf("completion %s: exit %d: %s", sh, code, errs)
		}
		for name := range commands {
			if !strings.Contains(out, name) {
				t.Errorf("the %s script lacks the command %s", sh, name)
			}
		}
		f := filepath.Join(dir, "sluice."+sh)
		if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		if b, err := exec.Command(sh, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v: %s", sh, err, b)
		}
	}
	complete := func(line string) string {
		words := strings.Fields(line)
		if strings.HasSuffix(line, " ") {
			words = append(words, "")
		}
		script := `source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _sluice; echo "${COMPREPLY[*]}"`
		b, err := exec.Command("bash", append([]string{"-c", script, "bash", filepath.Join(dir, "sluice.bash")}, words...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v: %s", err, b)
		}
		return strings.TrimSpace(string(b))
	}
	for i, c := range []struct{ line, want string }{
		{"sluice se", "serve"},
		{"sluice check --q", "--quiet"},
		{"sluice serve --backend le", "lease"},
		{"sluice serve --check-c", "--check-config"},
	} {
		if got := complete(c.line); got != c.want {
			t.Errorf("case %d %q: completed %q, want %q", i, c.line, got, c.want)
		}
	}
	if code, _, _ := run(t, "completion", "fish"); code != ExitUsage {
		t.Errorf("completion fish: exit %d, want %d", code, ExitUsage)
	}
}

// TestServeCheckConfig: --check-config says whether the config (file, environment, flags)
// would start, naming each problem's file and line, without listening; flags win over
// the environment, which wins over the file.
func TestServeCheckConfig(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("backend: redis\nredis_url: redis://127.0.0.1:1\nrules:\n  - {match: api, limit: 10/s}\n"), 0o644)
	os.WriteFile(bad, []byte("rules:\n  - {match: api, limit: 10/s}\n  - {match: api, limit: 1/s}\nextra_key: 1\n"), 0o644)
	for i, c := range []struct {
		args []string
		env  map[string]string
		code int
		out  string
	}{
		{[]string{"serve", "--check-config", "--config", good}, nil, 0, "ok: 1 rule,"},
		{[]string{"serve", "--config", bad, "--check-config"}, nil, ExitUsage, `bad.yaml:4: unknown field "extra_key"`},
		{[]string{"serve", "--check-config"}, map[string]string{"SLUICE_MAX_KEYS": "lots"}, ExitUsage, "SLUICE_MAX_KEYS"},
		{[]string{"serve", "--check-config"}, map[string]string{"SLUICE_BACKEND": "redis"}, ExitUsage, "backend strict needs store"},
		{[]string{"serve", "--check-config", "--backend", "local"}, map[string]string{"SLUICE_BACKEND": "redis"}, 0, "backend local"},
		{[]string{"serve", "--check-config", "--config", good}, map[string]string{"SLUICE_BACKEND": "local"}, 0, "backend local"},
		{[]string{"serve", "--check-config"}, map[string]string{"SLUICE_LIMIT": "a=1/s\nb-*=2/s"}, 0, "ok: 2 rules"},
		{[]string{"serve", "--check-config"}, map[string]string{"SLUICE_CHECK_CONFIG": "false"}, 0, "ok:"},
		// A rule its back end does not decide is refused by the check as by the start.
		{[]string{"serve", "--check-config", "--backend", "gossip", "--limit", "gh=5000/h window"}, nil, ExitUsage, `rule "gh"`},
		{[]string{"serve", "--check-config", "--backend", "strict", "--store", "etcd://127.0.0.1:1", "--limit", "a=100/s ramp=10/s..1m"}, nil, ExitUsage, "ramp"},
		{[]string{"serve", "--check-config", "--backend", "redis", "--redis-url", "redis://127.0.0.1:1", "--limit", "a=10/s; 100/h window"}, nil, ExitUsage, "beside"},
		{[]string{"serve", "--check-config", "--backend", "redis", "--redis-url", "redis://127.0.0.1:1", "--limit", "a=100/h window"}, nil, 0, "ok: 1 rule,"},
		{[]string{"serve", "--check-config", "--backend", "lease", "--store", "zk://127.0.0.1:1", "--limit", "a=100/s ramp=10/s..1m"}, nil, 0, "ok: 1 rule,"},
		// The old spellings still start, and say what to write instead.
		{[]string{"serve", "--check-config", "--config", good}, nil, 0, "backend redis (--backend redis) is deprecated: use backend strict"},
		{[]string{"serve", "--check-config", "--backend", "redis", "--redis-url", "redis://127.0.0.1:1"}, nil, 0, "redis_url (--redis-url) is deprecated: use store (--store)"},
		{[]string{"serve", "--check-config", "--backend", "strict", "--store", "redis://127.0.0.1:1", "--limit", "a=100/h window"}, nil, 0, "ok: 1 rule, no default rule, backend strict"},
		// A store URL start cannot use is refused by the check, as start refuses it (exit 2).
		{[]string{"serve", "--check-config", "--backend", "strict", "--store", "http://127.0.0.1:16379", "--limit", "a=1/s"}, nil, ExitUsage, `unknown scheme "http"`},
		{[]string{"serve", "--check-config", "--backend", "strict", "--store", "redis://127.0.0.1:notaport", "--limit", "a=1/s"}, nil, ExitUsage, "invalid port"},
		{[]string{"serve", "--check-config", "--backend", "strict", "--store", "127.0.0.1:16379", "--limit", "a=1/s"}, nil, ExitUsage, "write redis://127.0.0.1:16379"},
		{[]string{"serve", "--check-config", "--backend", "strict", "--store", "redis-sentinel://127.0.0.1:1", "--limit", "a=1/s"}, nil, ExitUsage, "no master name"},
		{[]string{"serve", "--check-config", "--backend", "lease", "--store", "mysql://x", "--limit", "a=1/s"}, nil, ExitUsage, `unknown scheme "mysql"`},
		{[]string{"serve", "--backend", "lease", "--store", "mysql://x", "--limit", "a=1/s", "--listen-line", "127.0.0.1:0"}, nil, ExitUsage, `unknown scheme "mysql"`},
		{[]string{"serve", "--backend", "strict", "--store", "redis://127.0.0.1:notaport", "--limit", "a=1/s", "--listen-line", "127.0.0.1:0"}, nil, ExitUsage, "invalid port"},
	} {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		code, out, errs := run(t, c.args...)
		for k := range c.env {
			os.Unsetenv(k)
		}
		if code != c.code || !strings.Contains(out+errs, c.out) {
			t.Errorf("case %d %v %v: exit %d, out %q err %q; want %d and %q", i, c.args, c.env, code, out, errs, c.code, c.out)
		}
	}
}

// TestServeRefusesRuleItsBackendCannotDecide: a daemon whose back end does not decide a
// rule's limit (a windowed quota on gossip) stops before listening with the usage exit, as
// --check-config says it would (exit 1 before: a run-time failure, not the config's).
func TestServeRefusesRuleItsBackendCannotDecide(t *testing.T) {
	code, _, errs := run(t, "serve", "--backend", "gossip", "--gossip-bind", "127.0.0.1:0", "--listen-line", "127.0.0.1:0",
		"--listen-http", "127.0.0.1:0", "--limit", "gh=5000/h window")
	if code != ExitUsage || !strings.Contains(errs, `rule "gh"`) || !strings.Contains(errs, "windowed quota") {
		t.Fatalf("exit %d, err %q; want %d and the rule refused", code, errs, ExitUsage)
	}
}

// TestCheckSaysWhatDecided: sluice check keeps its contract (0 allowed, 1 throttled, 2 bad
// usage, 3 no answer) on the answers that are not a limit's: an empty tag and a negative
// --n are bad usage; a cost above the burst is an answer (1, with the reason); an
// unmatched tag, a deny rule and an unlimited one say what they mean; a back end that is
// down says so and exits 3.
func TestCheckSaysWhatDecided(t *testing.T) {
	start := func(yml string) string {
		cfg, err := server.ParseConfig("c.yaml", []byte(yml))
		if err != nil {
			t.Fatal(err)
		}
		opts := []server.Option{server.WithLogger(slog.New(slog.DiscardHandler))}
		if cfg.Backend == "strict" {
			b, err := serveBackend(cfg, clock.Default, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			opts = append(opts, server.WithBackend(b))
		}
		srv, err := server.New(cfg, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Shutdown(context.Background()) })
		return srv.LineAddr().String()
	}
	const rules = "listen_line: 127.0.0.1:0\nlisten_http: ''\nrules:\n  - {match: api, limit: 10/s}\n  - {match: bad, deny: true}\n  - {match: free, unlimited: true}\n"
	addr := start(rules)
	down := start("backend: strict\nstore: redis://" + proctest.FreeAddr(t) + "\n" + rules)
	for i, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"check", "", "--addr", addr}, ExitUsage, "want a non-empty"},
		{[]string{"check", "api", "--n", "-1", "--addr", addr}, ExitUsage, "want 0 to"},
		{[]string{"check", "api", "--n", "1000", "--addr", addr}, ExitDenied, "NO cost exceeds the burst"},
		{[]string{"check", "api", "--addr", addr}, ExitOK, "OK remaining=9"},
		{[]string{"check", "other", "--addr", addr}, ExitOK, "no rule matches this tag"},
		{[]string{"check", "bad", "--addr", addr}, ExitDenied, "its rule denies every request"},
		{[]string{"check", "free", "--addr", addr}, ExitOK, "its rule is unlimited"},
		{[]string{"check", "api", "--addr", down}, ExitUnreachable, "back end is down"},
	} {
		code, out, errs := run(t, c.args...)
		if code != c.code || !strings.Contains(out+errs, c.out) {
			t.Errorf("case %d %v: exit %d, out %q err %q; want %d and %q", i, c.args, code, out, errs, c.code, c.out)
		}
	}
}

// TestFlagErrorsSayTheValueOnce: a bad flag value is named once, as the flag's, with what
// is wrong in it: not the flag package's prefix and the limit's own quote of it again.
func TestFlagErrorsSayTheValueOnce(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--limit", "api=10/x", "--check-config"}, `sluice: --limit "api=10/x": unknown period unit (use ns, us, ms, s, m, h or d): "x" (want`},
		{[]string{"serve", "--limit", "api=10/s;", "--check-config"}, `an empty limit between or after ';'`},
		{[]string{"demo", "--limit", "10/x"}, `sluice: --limit "10/x": unknown period unit`},
		{[]string{"demo", "--workers", "x"}, `sluice: --workers "x": not a number`},
	} {
		code, _, errs := run(t, c.args...)
		if code != ExitUsage || !strings.Contains(errs, c.want) || strings.Contains(errs, "invalid value") {
			t.Errorf("%v: exit %d, %q; want %d and %q", c.args, code, errs, ExitUsage, c.want)
		}
		if v := c.args[2]; strings.Count(errs, strconv.Quote(v)) != 1 {
			t.Errorf("%v: the value is quoted %d times: %q", c.args, strings.Count(errs, strconv.Quote(v)), errs)
		}
	}
}

// TestHelpWritesFlagsAsTheREADME: every command's --help lists its flags as --name, with
// what each takes named in capitals (never its default), and its default quoted.
func TestHelpWritesFlagsAsTheREADME(t *testing.T) {
	for name := range commands {
		code, out, errs := run(t, name, "--help")
		if code != ExitOK && code != ExitUsage {
			t.Errorf("%s --help: exit %d %s", name, code, errs)
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "  -") && !strings.HasPrefix(line, "  --") {
				t.Errorf("%s --help: %q is not written --flag", name, line)
			}
		}
	}
	_, out, _ := run(t, "demo", "--help")
	if !strings.Contains(out, "  --mode VALUE\n") || !strings.Contains(out, `(default "local")`) || strings.Contains(out, "  --mode local\n") {
		t.Errorf("demo --help:\n%s", out)
	}
}
