package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testConfig(rules ...string) Config {
	cfg := DefaultConfig()
	cfg.ListenLine = "127.0.0.1:0"
	cfg.ListenHTTP = "127.0.0.1:0"
	for _, r := range rules {
		rule, err := ParseRuleFlag(r, false)
		if err != nil {
			panic(err)
		}
		cfg.Rules = append(cfg.Rules, rule)
	}
	return cfg
}

func start(t *testing.T, cfg Config, opts ...Option) *Server {
	t.Helper()
	opts = append([]Option{WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	s, err := New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return s
}

func dial(t *testing.T, s *Server) net.Conn {
	t.Helper()
	c, err := net.Dial(s.LineAddr().Network(), s.LineAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// exchange writes in one write and reads exactly want bytes.
func exchange(t *testing.T, c net.Conn, in string, n int) string {
	t.Helper()
	if _, err := c.Write([]byte(in)); err != nil {
		t.Fatal(err)
	}
	// A liveness guard, not a speed bound: 20,000 pipelined queries under -race took
	// longer than 5 s with two make test runs on the machine.
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, n)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("reading %d bytes: %v (got %q)", n, err, buf)
	}
	return string(buf)
}

// TestLineProtocolByteExact speaks DThrottle's line protocol on a raw socket: `TAG\n` in,
// `OK\n` or `NO\n` out, byte for byte.
func TestLineProtocolByteExact(t *testing.T) {
	s := start(t, testConfig("api=10/s", "slow=1/6s"), WithClock(clock.NewVirtual()))
	c := dial(t, s)
	if got := exchange(t, c, "slow\nslow\n", 6); got != "OK\nNO\n" {
		t.Fatalf("slow twice: %q, want \"OK\\nNO\\n\"", got)
	}
	// 100 pipelined queries in one write: the burst of 10, then 90 refusals, in order.
	want := strings.Repeat("OK\n", 10) + strings.Repeat("NO\n", 90)
	if got := exchange(t, c, strings.Repeat("api\n", 100), 300); got != want {
		t.Fatalf("100 pipelined queries: got %q", got)
	}
	// A tag no rule matches is allowed; answers stay exactly three bytes.
	if got := exchange(t, c, "other\n", 3); got != "OK\n" {
		t.Fatalf("unmatched tag: %q", got)
	}
}

func TestReloadKeepsStateAndConnections(t *testing.T) {
	clk := clock.NewVirtual()
	s := start(t, testConfig("api=2/s", "other=1/s"), WithClock(clk))
	c := dial(t, s)
	if got := exchange(t, c, "api\napi\napi\n", 9); got != "OK\nOK\nNO\n" {
		t.Fatalf("before: %q", got)
	}
	if n := testutil.CollectAndCount(s.m.latency); n != 1 {
		t.Fatalf("latency histogram: %d series", n)
	}
	if got := histogramCount(t, s); got != 3 {
		t.Errorf("latency histogram counted %d decisions, want 3", got)
	}
	// Change "other", keep "api": api's bucket (drained) survives, the connection too.
	if err := s.Reload(testConfig("api=2/s", "other=5/s", "new-*=1/s")); err != nil {
		t.Fatal(err)
	}
	if got := exchange(t, c, "api\nnew-1\nnew-1\nnew-2\n", 12); got != "NO\nOK\nNO\nOK\n" {
		t.Fatalf("after reload: %q", got)
	}
	bad := testConfig("api=2/s")
	bad.Rules[0].Match = ""
	if err := s.Reload(bad); err == nil {
		t.Fatal("a bad config was accepted")
	}
	if got := exchange(t, c, "new-3\n", 3); got != "OK\n" {
		t.Fatalf("after a refused reload the old rules must stay: %q", got)
	}
	if testutil.ToFloat64(s.m.reloads.WithLabelValues("ok")) != 1 || testutil.ToFloat64(s.m.reloads.WithLabelValues("error")) != 1 {
		t.Errorf("reload counts wrong")
	}
	// Start-only settings stay as they were; the others take effect.
	before := s.Config()
	next := testConfig("api=2/s")
	next.ListenLine, next.MaxKeys, next.FailMode = "127.0.0.1:1", before.MaxKeys+1, "open"
	next.MaxConnections = before.MaxConnections + 1
	if err := s.Reload(next); err != nil {
		t.Fatal(err)
	}
	after := s.Config()
	if after.ListenLine != before.ListenLine || after.MaxKeys != before.MaxKeys || after.FailMode != before.FailMode {
		t.Errorf("start-only settings changed by a reload: %+v", after)
	}
	if after.MaxConnections != next.MaxConnections {
		t.Errorf("max_connections %d after reload, want %d", after.MaxConnections, next.MaxConnections)
	}
}

// TestShutdownAnswersEveryQueryRead: under a pipelined load, Shutdown answers every query
// it has read before it closes: the client gets as many answers as the server decided.
func TestShutdownAnswersEveryQueryRead(t *testing.T) {
	s, err := New(testConfig("api=1000000/s"), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", s.LineAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		chunk := []byte(strings.Repeat("api\n", 64))
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	answers := make(chan int)
	go func() {
		r := bufio.NewReader(c)
		n := 0
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				answers <- n
				return
			}
			if line != "OK\n" {
				t.Errorf("answer %q", line)
			}
			n++
		}
	}()
	// Let some load through, then stop.
	for testutil.ToFloat64(s.m.decisions.WithLabelValues("api", "allowed")) < 1000 {
		time.Sleep(time.Millisecond)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := <-answers
	c.Close()
	wg.Wait()
	decided := int(testutil.ToFloat64(s.m.decisions.WithLabelValues("api", "allowed")))
	if got != decided {
		t.Errorf("the client got %d answers, the server decided %d queries", got, decided)
	}
}

func TestHTTPAPI(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	os.WriteFile(tokFile, []byte("s3cr3t\n"), 0o600)
	cfg := testConfig("api=2/s", "user-*=1/s")
	cfg.HTTPTokenFile = tokFile
	cfg.Default = &DefaultRule{Limit: sluice.MustParse("5/s")}
	s := start(t, cfg, WithClock(clock.NewVirtual()))
	base := "http://" + s.HTTPAddr().String()
	do := func(method, path, body string, auth bool) (int, string, http.Header) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if auth {
			req.Header.Set("Authorization", "Bearer s3cr3t")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	if code, _, _ := do("GET", "/healthz", "", false); code != 200 {
		t.Errorf("/healthz without a token: %d", code)
	}
	for _, p := range []string{"/readyz", "/metrics", "/v1/rules"} {
		if code, _, _ := do("GET", p, "", false); code != 401 {
			t.Errorf("%s without a token: %d, want 401", p, code)
		}
	}
	steps := []struct {
		body    string
		code    int
		allowed bool
		rule    string
	}{
		{`{"key":"api"}`, 200, true, "api"},
		{`{"key":"api","n":1,"priority":"critical"}`, 200, true, "api"},
		{`{"key":"api","priority":"sheddable"}`, 200, false, "api"},
		{`{"key":"user-7"}`, 200, true, "user-*"},
		{`{"key":"zed"}`, 200, true, "default"},
		{`{"key":"api","n":5}`, 400, false, "api"},
		{`{"key":""}`, 400, false, ""},
		{`{"nope":1}`, 400, false, ""},
		{`not json`, 400, false, ""},
	}
	for i, st := range steps {
		code, body, h := do("POST", "/v1/decide", st.body, true)
		var resp DecideResponse
		json.Unmarshal([]byte(body), &resp)
		if code != st.code || resp.Allowed != st.allowed || resp.Rule != st.rule {
			t.Errorf("step %d %s: got %d %s, want %d allowed=%v rule=%q", i, st.body, code, body, st.code, st.allowed, st.rule)
		}
		if code == 200 && h.Get("RateLimit-Policy") == "" {
			t.Errorf("step %d: no RateLimit-Policy header", i)
		}
	}
	code, body, _ := do("GET", "/v1/rules", "", true)
	if code != 200 || !strings.Contains(body, `"match":"user-*"`) || !strings.Contains(body, `"default":{"name":"default"`) {
		t.Errorf("/v1/rules: %d %s", code, body)
	}
	code, body, _ = do("GET", "/v1/keys?tag=api", "", true)
	if code != 200 || !strings.Contains(body, `"remaining":0`) {
		t.Errorf("/v1/keys?tag=api: %d %s", code, body)
	}
	code, body, _ = do("GET", "/v1/keys", "", true)
	if code != 200 || !strings.Contains(body, `"held":3`) || !strings.Contains(body, `user-*:user-7`) {
		t.Errorf("/v1/keys: %d %s", code, body)
	}
	code, body, _ = do("GET", "/metrics", "", true)
	if code != 200 || !strings.Contains(body, `sluice_decisions_total{result="allowed",rule="api"} 2`) ||
		!strings.Contains(body, "sluice_keys 3") {
		t.Errorf("/metrics: %d, missing counts:\n%s", code, body)
	}
	if code, _, _ := do("GET", "/readyz", "", true); code != 200 {
		t.Errorf("/readyz: %d", code)
	}
}

func TestUnixSocket(t *testing.T) {
	cfg := testConfig("api=1/s")
	cfg.ListenLine = filepath.Join(t.TempDir(), "sluice.sock")
	cfg.ListenHTTP = ""
	s := start(t, cfg, WithClock(clock.NewVirtual()))
	c := dial(t, s)
	if got := exchange(t, c, "api\napi\n", 6); got != "OK\nNO\n" {
		t.Fatalf("over a Unix socket: %q", got)
	}
}

// TestKeyFloodIsBounded: a flood of random tags under a per-tag rule never holds more than
// max_keys buckets; every query is still answered.
func TestKeyFloodIsBounded(t *testing.T) {
	cfg := testConfig("t-*=1/h")
	cfg.MaxKeys = 1000
	s := start(t, cfg, WithClock(clock.NewVirtual()))
	c := dial(t, s)
	var in bytes.Buffer
	for i := 0; i < 20000; i++ {
		in.WriteString("t-")
		in.WriteString(strings.Repeat("x", i%7))
		in.WriteString(time.Duration(i).String())
		in.WriteByte('\n')
	}
	out := exchange(t, c, in.String(), 3*20000)
	if strings.Count(out, "OK\n") != 20000 {
		t.Errorf("new tags under the flood were not all allowed: %d", strings.Count(out, "OK\n"))
	}
	if s.local.Len() > 1000 {
		t.Errorf("%d buckets held, over max_keys 1000", s.local.Len())
	}
	if s.local.EvictedLive() < 19000 {
		t.Errorf("evictions %d", s.local.EvictedLive())
	}
}

// histogramCount is how many decisions the latency histogram has observed.
func histogramCount(t *testing.T, s *Server) uint64 {
	t.Helper()
	var m dto.Metric
	if err := s.m.latency.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// TestWindowAndRampRules: the daemon takes a windowed quota and a ramp as any limit: the
// daily quota answers its count then NO until 00:00 UTC, the ramp starts at its low rate.
func TestWindowAndRampRules(t *testing.T) {
	clk := clock.NewVirtualAt(time.Date(2026, 5, 1, 23, 59, 0, 0, time.UTC))
	s := start(t, testConfig("q=3/24h window", "warm=100/s ramp=10/s..60s"), WithClock(clk))
	c := dial(t, s)
	if got := exchange(t, c, strings.Repeat("q\n", 5), 15); got != "OK\nOK\nOK\nNO\nNO\n" {
		t.Fatalf("a quota of 3: %q", got)
	}
	if got := exchange(t, c, strings.Repeat("warm\n", 12), 36); got != strings.Repeat("OK\n", 10)+"NO\nNO\n" {
		t.Fatalf("a ramp from 10/s: %q, want its burst of 10 then NO", got)
	}
	clk.Advance(time.Minute) // 00:00 UTC
	if got := exchange(t, c, "q\n", 3); got != "OK\n" {
		t.Fatalf("after midnight: %q", got)
	}
}

// TestReloadKeepsTheRamp: a reload that keeps a rule's ramp goes on with it (30 s into
// "100/s ramp=10/s..60s" a drained tag gets the burst of 55/s, not the 10 of a restarted
// ramp); a reload that changes the ramp starts the new one.
func TestReloadKeepsTheRamp(t *testing.T) {
	clk := clock.NewVirtual()
	s := start(t, testConfig("warm=100/s ramp=10/s..60s"), WithClock(clk))
	c := dial(t, s)
	oks := func(n int) int { return strings.Count(exchange(t, c, strings.Repeat("warm\n", n), 3*n), "OK") }
	if got := oks(20); got != 10 {
		t.Fatalf("at the start: %d OK, want the ramp's burst of 10", got)
	}
	clk.Advance(30 * time.Second)
	if err := s.Reload(testConfig("warm=100/s ramp=10/s..60s")); err != nil {
		t.Fatal(err)
	}
	if got := oks(100); got != 55 {
		t.Fatalf("30 s in, after a reload that keeps the ramp: %d OK, want 55", got)
	}
	clk.Advance(10 * time.Second)
	if err := s.Reload(testConfig("warm=100/s ramp=20/s..60s")); err != nil {
		t.Fatal(err)
	}
	if got := oks(100); got != 20 {
		t.Fatalf("after a reload to another ramp: %d OK, want its start's burst of 20", got)
	}
}

// TestExpiredPermitReports: a client reports reserved permits it did not use because they
// came too late (~x, with n=), answered OK; the daemon counts them by rule in /metrics
// (sluice_permits_expired_total), a tag no rule matches under rule "". A report with
// other options is refused.
func TestExpiredPermitReports(t *testing.T) {
	s := start(t, testConfig("api=10/s", "user-*=1/s"), WithClock(clock.NewVirtual()))
	c := dial(t, s)
	for i, st := range []struct{ in, want string }{
		{"~x api\n", "OK\n"},
		{"~x,n=3 api\n", "OK\n"},
		{"~x,n=2 user-7\n", "OK\n"},
		{"~x other\n", "OK\n"},
		{"~x,w=100 api\n", "ER " + wire.ErrBadOptions.Error() + "\n"},
	} {
		if got := exchange(t, c, st.in, len(st.want)); got != st.want {
			t.Errorf("step %d %q: got %q, want %q", i, st.in, got, st.want)
		}
	}
	resp, err := http.Get("http://" + s.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`sluice_permits_expired_total{rule="api"} 4`,
		`sluice_permits_expired_total{rule="user-*"} 2`,
		`sluice_permits_expired_total{rule=""} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// A report takes nothing: the burst is whole.
	if got := exchange(t, c, strings.Repeat("api\n", 10), 30); got != strings.Repeat("OK\n", 10) {
		t.Errorf("after the reports, 10 queries: %q, want the burst of 10", got)
	}
}

// TestLocalSaysItIsAlone: a daemon in the local mode says at the start that it decides
// its limits alone, naming the modes that share one; a strict daemon does not.
func TestLocalSaysItIsAlone(t *testing.T) {
	var logs bytes.Buffer
	s, err := New(testConfig("api=10/s"), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	s.Shutdown(context.Background())
	if !strings.Contains(logs.String(), "decides each limit in this daemon alone") || !strings.Contains(logs.String(), "strict, lease or gossip") {
		t.Errorf("the local daemon's start log does not say it is alone:\n%s", logs.String())
	}
}

// TestHTTPErrorsAreOneShape: every error of the HTTP API, on every endpoint and method
// (the mux's own 404 and 405 included), is JSON {"error": "..."}, with no internal key
// encoding and no doubled "sluice:"; times are whole milliseconds; a tag's answer names
// its bucket, and the buckets listed name the exact rule's tag.
func TestHTTPErrorsAreOneShape(t *testing.T) {
	s := start(t, testConfig("api=10/s", "team-*=5/s"))
	base := "http://" + s.HTTPAddr().String()
	do := func(method, path, body string) (int, http.Header, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var j map[string]any
		if err := json.Unmarshal(b, &j); err != nil {
			t.Errorf("%s %s: %d, not JSON: %q", method, path, resp.StatusCode, b)
		}
		if strings.Contains(string(b), `\u001f`) || strings.Count(string(b), "sluice:") > 1 {
			t.Errorf("%s %s: %s", method, path, b)
		}
		return resp.StatusCode, resp.Header, j
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		says               string
	}{
		{"GET", "/v1/decide", "", 405, "not allowed"},
		{"DELETE", "/v1/keys", "", 405, "not allowed"},
		{"GET", "/nope", "", 404, "no such endpoint"},
		{"POST", "/v1/decide", "{bad", 400, "bad request body"},
		{"POST", "/v1/decide", `{"key":""}`, 400, "non-empty"},
		{"POST", "/v1/decide", `{"key":"api","n":1000}`, 400, `cost 1000 exceeds the burst of rule "api"`},
		{"POST", "/v1/decide", `{"key":"api","priority":"urgent"}`, 400, `unknown priority "urgent"`},
		{"DELETE", "/v1/penalties/zzz", "", 404, "no rule matches"},
	} {
		status, h, j := do(c.method, c.path, c.body)
		if msg, _ := j["error"].(string); status != c.status || !strings.Contains(msg, c.says) {
			t.Errorf("%s %s: %d %v, want %d saying %q", c.method, c.path, status, j, c.status, c.says)
		}
		if status == 405 && h.Get("Allow") == "" {
			t.Errorf("%s %s: a 405 without Allow", c.method, c.path)
		}
	}
	_, _, j := do("POST", "/v1/decide", `{"key":"team-a"}`)
	if j["bucket"] != "team-a" || j["reset_after_ms"] != float64(int64(j["reset_after_ms"].(float64))) {
		t.Errorf("a pattern's tag: %v", j)
	}
	_, _, j = do("POST", "/v1/decide", `{"key":"zzz"}`)
	if j["why"] != "no-rule" || j["allowed"] != true {
		t.Errorf("an unmatched tag: %v", j)
	}
	do("POST", "/v1/decide", `{"key":"api"}`)
	_, _, j = do("GET", "/v1/keys", "")
	keys, _ := j["keys"].([]any)
	if !slices.Contains(keys, any("api:api")) || !slices.Contains(keys, any("team-*:team-a")) {
		t.Errorf("buckets listed: %v, want api:api and team-*:team-a", keys)
	}
}
