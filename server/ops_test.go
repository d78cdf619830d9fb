package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testkit/proctest"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/strict"
)

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminListener: with a token, the admin listener serves /healthz, /readyz and
// /metrics without it (probes and scrapers send none), and nothing else; the HTTP API
// still wants the token. /metrics has the Go and process collectors and the build info.
func TestAdminListener(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("s3cret\n"), 0o600)
	cfg := testConfig("api=10/s")
	cfg.HTTPTokenFile = tok
	cfg.ListenAdmin = "127.0.0.1:0"
	s := start(t, cfg)
	admin, api := "http://"+s.AdminAddr().String(), "http://"+s.HTTPAddr().String()
	steps := []struct {
		url, token string
		code       int
		has        string
	}{
		{admin + "/healthz", "", 200, "ok"},
		{admin + "/readyz", "", 200, "ready"},
		{admin + "/metrics", "", 200, "go_goroutines"},
		{admin + "/metrics", "", 200, "process_resident_memory_bytes"},
		{admin + "/metrics", "", 200, "sluice_build_info{commit="},
		{admin + "/metrics", "", 200, "sluice_backend_up 1"},
		{admin + "/v1/rules", "", 404, ""},
		{api + "/metrics", "", 401, ""},
		{api + "/readyz", "", 401, ""},
		{api + "/metrics", "s3cret", 200, "go_goroutines"},
	}
	for i, st := range steps {
		code, body := get(t, st.url, st.token)
		if code != st.code || !strings.Contains(body, st.has) {
			t.Errorf("step %d: GET %s: got %d, want %d with %q", i, st.url, code, st.code, st.has)
		}
	}
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if s.AdminAddr() == nil {
		t.Error("the admin listener went away on a reload")
	}
}

// TestReloadOutcomesCounted: a reload that cannot even be read or parsed is counted and
// logged as refused; the gauges say whether the last one succeeded, and when one last did.
func TestReloadOutcomesCounted(t *testing.T) {
	var logs proctest.LockedBuffer
	s := start(t, testConfig("api=10/s"), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	started := testutil.ToFloat64(s.m.reloadTime)
	if started == 0 || testutil.ToFloat64(s.m.reloadOK) != 1 {
		t.Fatalf("at start: last reload at %v, successful %v", started, testutil.ToFloat64(s.m.reloadOK))
	}
	steps := []struct {
		load    func() (Config, error)
		ok, bad float64
		good    float64
	}{
		{func() (Config, error) { return Config{}, errors.New("c.yaml:1: did not find expected node content") }, 0, 1, 0},
		{func() (Config, error) { return ParseConfig("c.yaml", []byte("rules: [\n")) }, 0, 2, 0},
		{func() (Config, error) { return testConfig("api=20/s"), nil }, 1, 2, 1},
		{func() (Config, error) { c := testConfig("api=20/s"); c.MaxLine = 1; return c, nil }, 1, 3, 0},
	}
	for i, st := range steps {
		time.Sleep(time.Millisecond) // the success timestamps must differ
		before := testutil.ToFloat64(s.m.reloadTime)
		_ = s.ReloadFrom("test", st.load)
		okN, badN := testutil.ToFloat64(s.m.reloads.WithLabelValues("ok")), testutil.ToFloat64(s.m.reloads.WithLabelValues("error"))
		last, at := testutil.ToFloat64(s.m.reloadOK), testutil.ToFloat64(s.m.reloadTime)
		if okN != st.ok || badN != st.bad || last != st.good || (st.good == 1) != (at > before) {
			t.Errorf("step %d: reloads ok %v error %v, last successful %v, time moved %v; want %v %v %v %v", i, okN, badN, last, at > before, st.ok, st.bad, st.good, st.good == 1)
		}
	}
	if n := strings.Count(logs.String(), "reload refused"); n != 3 {
		t.Errorf("%d refusals logged, want 3:\n%s", n, logs.String())
	}
}

// TestUnmatchedTagsCounted: a query for a tag that no rule matches (allowed) is counted;
// a look at the state (n = 0) is not.
func TestUnmatchedTagsCounted(t *testing.T) {
	s := start(t, testConfig("api=10/s"))
	c := dial(t, s)
	if got := exchange(t, c, "other\napi\n~n=0 other2\n", 9); got != "OK\nOK\nOK\n" {
		t.Fatalf("got %q", got)
	}
	if n := testutil.ToFloat64(s.m.unmatched); n != 1 {
		t.Errorf("sluice_unmatched_total %v, want 1", n)
	}
}

// TestRedisOutageLoggedOnce: a daemon over a real Redis that is down at start, comes back,
// goes down and comes back again logs each change once, with the fail mode in force, and
// sluice_backend_up follows; sluice_keys counts the keys in Redis.
func TestRedisOutageLoggedOnce(t *testing.T) {
	srv := redistest.New(t)
	o, _ := redisstore.ClientOptions(srv.URL(), 100*time.Millisecond)
	client := goredis.NewClient(o)
	defer client.Close()
	be := strict.New(client, strict.WithTimeout(100*time.Millisecond), strict.WithProbeEvery(20*time.Millisecond),
		strict.WithPrefix("sluice:test:"+t.Name()+":"))
	defer be.Close()
	srv.Kill()
	var logs proctest.LockedBuffer
	cfg := testConfig("k-*=10/s")
	cfg.Backend, cfg.Store = "strict", srv.URL()
	s := start(t, cfg, WithBackend(be), WithHealthEvery(20*time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	// Down at start: logged by the time Start returns.
	if n := strings.Count(logs.String(), "backend unavailable"); n != 1 || !strings.Contains(logs.String(), "fail_mode=closed") {
		t.Fatalf("at start, with Redis down: %d lines of it logged, want 1 with the fail mode:\n%s", n, logs.String())
	}
	waitFor := func(what string, n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(logs.String(), what) < n {
			if time.Now().After(deadline) {
				t.Fatalf("%q was not logged %d times:\n%s", what, n, logs.String())
			}
			time.Sleep(10 * time.Millisecond) // wait for the condition: the monitor's next check
		}
	}
	up := func() float64 { return testutil.ToFloat64(s.m.backendUp) }
	if up() != 0 {
		t.Errorf("sluice_backend_up %v while down", up())
	}
	for round := 1; round <= 2; round++ {
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		waitFor("backend available again", round)
		if up() != 1 {
			t.Errorf("round %d: sluice_backend_up %v once back", round, up())
		}
		srv.Kill()
		waitFor("backend unavailable", round+1)
	}
	time.Sleep(100 * time.Millisecond) // five more checks, all down: nothing more is logged
	if a, b := strings.Count(logs.String(), "backend unavailable"), strings.Count(logs.String(), "backend available again"); a != 3 || b != 2 {
		t.Errorf("logged %d downs and %d ups, want 3 and 2:\n%s", a, b, logs.String())
	}
	// The keys in Redis, counted for sluice_keys.
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor("backend available again", 3)
	for i := range 3 {
		if _, err := s.Decide(context.Background(), "k-"+string(rune('a'+i)), 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := s.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var keys float64 = -1
	for _, mf := range mfs {
		if mf.GetName() == "sluice_keys" {
			keys = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if keys != 3 {
		t.Errorf("sluice_keys %v with 3 keys in Redis", keys)
	}
}
