package cli

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/testkit/daemontest"
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

// TestCompletion: `sluice completion SHELL` prints cobra's script for bash, zsh, fish and
// PowerShell (bash and zsh check its syntax), and refuses another shell. The scripts ask
// the binary what to complete (its hidden __complete command), which completes the
// commands, a command's flags and a flag's values; bash, given its script and the binary
// on its PATH, completes through it.
func TestCompletion(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ shell, has string }{
		{"bash", "complete -o default -F __start_sluice sluice"},
		{"zsh", "#compdef sluice"},
		{"fish", "complete -c sluice"},
		{"powershell", "Register-ArgumentCompleter"},
	} {
		code, out, errs := run(t, "completion", c.shell)
		if code != 0 || !strings.Contains(out, c.has) || !strings.Contains(out, "__complete") {
			t.Errorf("completion %s: exit %d, stderr %q; want 0 and a script with %q that asks sluice __complete", c.shell, code, errs, c.has)
			continue
		}
		if c.shell != "bash" && c.shell != "zsh" {
			continue
		}
		f := filepath.Join(dir, "sluice."+c.shell)
		if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		if b, err := exec.Command(c.shell, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v: %s", c.shell, err, b)
		}
	}
	if code, _, errs := run(t, "completion", "tcsh"); code != ExitUsage || !strings.Contains(errs, "powershell") {
		t.Errorf("completion tcsh: exit %d, stderr %q; want %d and the shells it knows", code, errs, ExitUsage)
	}
	steps := []struct {
		words     []string // after "sluice"; the last is the word being completed
		want, not string
	}{
		{[]string{"se"}, "serve", "sim"},
		{[]string{"check", "--q"}, "--quiet", "--addr"},
		{[]string{"serve", "--backend", "le"}, "lease", "local"},
		{[]string{"serve", "--check-c"}, "--check-config", "--config"},
		{[]string{"demo", "--mode", ""}, "adaptive", "--json"},
		{[]string{"completion", "p"}, "powershell", "bash"},
	}
	for i, s := range steps {
		code, out, errs := run(t, append([]string{"__completeNoDesc"}, s.words...)...)
		var got []string
		for _, line := range strings.Split(out, "\n") {
			if line != "" && !strings.HasPrefix(line, ":") { // ":N" ends the list: the directive
				got = append(got, line)
			}
		}
		if code != 0 || !slices.Contains(got, s.want) || slices.Contains(got, s.not) {
			t.Errorf("step %d: __complete %q: exit %d, got %q (%s), want %q and not %q", i, s.words, code, got, errs, s.want, s.not)
		}
	}
	if testing.Short() {
		t.Skip("builds the binary for bash to run")
	}
	bin := t.TempDir()
	if b, err := exec.Command("go", "build", "-o", filepath.Join(bin, "sluice"), "github.com/sluicehq/sluice/cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, b)
	}
	// The script takes the words from bash-completion's _get_comp_words_by_ref, which a
	// system with bash completion has: this stand-in splits as bash does here.
	const script = `_get_comp_words_by_ref() { cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} words=("${COMP_WORDS[@]}") cword=$COMP_CWORD; }
source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
__start_sluice; printf '%s\n' "${COMPREPLY[@]}"`
	for i, s := range steps {
		cmd := exec.Command("bash", append([]string{"-c", script, "bash", filepath.Join(dir, "sluice.bash"), "sluice"}, s.words...)...)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		b, err := cmd.CombinedOutput()
		got := strings.Fields(string(b))
		if err != nil || !slices.Contains(got, s.want) || slices.Contains(got, s.not) {
			t.Errorf("step %d: bash completes sluice %q: %v, got %q, want %q and not %q", i, s.words, err, got, s.want, s.not)
		}
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
		{[]string{"serve", "--check-config", "--backend", "strict", "--store", "etcd://127.0.0.1:1", "--limit", "a=100/h window"}, nil, ExitUsage, "windowed quota"},
		{[]string{"serve", "--check-config", "--backend", "strict", "--store", "etcd://127.0.0.1:1", "--limit", "a=100/s ramp=10/s..1m"}, nil, 0, "ok: 1 rule,"},
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
		var opts []server.Option
		if cfg.Backend == "strict" {
			b, err := serveBackend(cfg, clock.Default, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			opts = append(opts, server.WithBackend(b))
		}
		return daemontest.Start(t, cfg, opts...).LineAddr().String()
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
// is wrong in it: not the flag package's prefix (pflag's, `invalid argument "V" for
// "--F" flag`) and the limit's own quote of it again.
func TestFlagErrorsSayTheValueOnce(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--limit", "api=10/x", "--check-config"}, `sluice: --limit "api=10/x": unknown period unit (use ns, us, ms, s, m, h or d): "x" (want`},
		{[]string{"serve", "--limit", "api=10/s;", "--check-config"}, `an empty limit between or after ';'`},
		{[]string{"demo", "--limit", "10/x"}, `sluice: --limit "10/x": unknown period unit`},
		{[]string{"demo", "--workers", "x"}, `sluice: --workers "x": not a number`},
		{[]string{"demo", "--duration", "10"}, `sluice: --duration "10": not a duration (e.g. 500ms, 10s or 1m30s)`},
		{[]string{"serve", "--max-penalty", "soon", "--check-config"}, `sluice: --max-penalty "soon": want off, period or a positive duration`},
	} {
		code, _, errs := run(t, c.args...)
		if code != ExitUsage || !strings.Contains(errs, c.want) || strings.Contains(errs, "invalid value") || strings.Contains(errs, "invalid argument") {
			t.Errorf("%v: exit %d, %q; want %d and %q", c.args, code, errs, ExitUsage, c.want)
		}
		if v := c.args[2]; strings.Count(errs, strconv.Quote(v)) != 1 {
			t.Errorf("%v: the value is quoted %d times: %q", c.args, strings.Count(errs, strconv.Quote(v)), errs)
		}
	}
}

// TestHelpWritesFlagsAsTheREADME: every command's --help lists its flags as GNU tools do
// and the README writes them, --name (never -name), each with what it takes named by a
// word of its own (--mode mode: never its default, which would read as the kind of value,
// as --mode local did) and its default after.
func TestHelpWritesFlagsAsTheREADME(t *testing.T) {
	for name, newCmd := range commands {
		code, out, errs := run(t, name, "--help")
		if code != ExitOK {
			t.Errorf("%s --help: exit %d %s", name, code, errs)
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			flag := strings.TrimLeft(line, " ")
			if indent := len(line) - len(flag); indent > 6 || !strings.HasPrefix(flag, "-") {
				continue // not a flag's line: a description, or the rest of one
			}
			if !strings.HasPrefix(line, "      --") && !strings.HasPrefix(line, "  -h, --help ") {
				t.Errorf("%s --help: %q is not written --flag", name, line)
			}
		}
		newCmd(Env{}).Flags().VisitAll(func(f *pflag.Flag) {
			value, _ := pflag.UnquoteUsage(f)
			switch {
			case f.Value.Type() == "bool":
				return
			case value == "" || value == f.DefValue:
				t.Errorf("%s --%s: its value is named %q (default %q)", name, f.Name, value, f.DefValue)
			case !strings.Contains(out, "      --"+f.Name+" "+value+" "):
				t.Errorf("%s --help does not list --%s %s:\n%s", name, f.Name, value, out)
			}
		})
	}
	_, out, _ := run(t, "demo", "--help")
	for _, want := range []string{"      --mode mode ", `(default "local")`, "      --duration duration ", "(default 10s)", "      --workers int "} {
		if !strings.Contains(out, want) {
			t.Errorf("demo --help lacks %q:\n%s", want, out)
		}
	}
}

// TestOneDashLongFlags: the spellings the standard flag package read, a long flag with one
// dash (-mode, -workers=0, -help, -n), still read as the flag, and -h is still help; a
// value that starts with a dash stays a value.
func TestOneDashLongFlags(t *testing.T) {
	for i, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"demo", "-mode", "quantum"}, ExitUsage, `--mode "quantum"`},
		{[]string{"demo", "-workers=0"}, ExitUsage, "--workers 0"},
		{[]string{"demo", "-help"}, ExitOK, "Usage: sluice demo"},
		{[]string{"serve", "-check-config", "-limit", "a=1/s", "-default-shared=false"}, ExitOK, "ok: 1 rule,"},
		{[]string{"check", "api", "-n", "-1"}, ExitUsage, "--n -1: want 0 to"},
		{[]string{"check", "api", "-h"}, ExitOK, "Usage: sluice check"},
		{[]string{"sim", "--", "-modes"}, ExitUsage, "-modes"}, // after "--": a file name
	} {
		code, out, errs := run(t, c.args...)
		if code != c.code || !strings.Contains(out+errs, c.out) {
			t.Errorf("case %d %q: exit %d, out %q err %q; want %d and %q", i, c.args, code, out, errs, c.code, c.out)
		}
	}
}
