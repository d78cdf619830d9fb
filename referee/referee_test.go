package referee

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/httplimit"
)

func get(t *testing.T, url, tok string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("X-Api-Token", tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestStepsAtVirtualTimes: strict GCRA per token, with the headers a client reads.
func TestStepsAtVirtualTimes(t *testing.T) {
	clk := clock.NewVirtual()
	ref, err := New(sluice.MustParse("2/s burst=3"), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ref)
	defer srv.Close()
	ms := time.Millisecond
	steps := []struct {
		at        time.Duration
		tok       string
		status    int
		remaining string
		retry     string
		retryMs   string
		rl        string
	}{
		{0, "a", 200, "2", "", "", `"2/s burst=3";r=2;t=1`},
		{0, "a", 200, "1", "", "", `"2/s burst=3";r=1;t=1`},
		{0, "a", 200, "0", "", "", `"2/s burst=3";r=0;t=2`},
		{0, "a", 429, "0", "1", "500", `"2/s burst=3";r=0;t=2`},
		{0, "b", 200, "2", "", "", `"2/s burst=3";r=2;t=1`}, // tokens are independent
		{499 * ms, "a", 429, "0", "1", "1", `"2/s burst=3";r=0;t=2`},
		{500 * ms, "a", 200, "0", "", "", `"2/s burst=3";r=0;t=2`},
		{3 * time.Second, "a", 200, "2", "", "", `"2/s burst=3";r=2;t=1`},
	}
	for i, s := range steps {
		clk.Set(int64(s.at))
		resp := get(t, srv.URL+"/anything", s.tok)
		h := resp.Header
		if resp.StatusCode != s.status || h.Get("RateLimit-Remaining") != s.remaining || h.Get("Retry-After") != s.retry ||
			h.Get("Retry-After-Ms") != s.retryMs || h.Get("RateLimit") != s.rl {
			t.Errorf("step %d: got %d remaining=%q retry=%q retryMs=%q RateLimit=%q, want %d %q %q %q %q", i, resp.StatusCode,
				h.Get("RateLimit-Remaining"), h.Get("Retry-After"), h.Get("Retry-After-Ms"), h.Get("RateLimit"),
				s.status, s.remaining, s.retry, s.retryMs, s.rl)
		}
		if got := h.Get("RateLimit-Policy"); got != `"2/s burst=3";q=2;w=1;burst=3` {
			t.Errorf("step %d: RateLimit-Policy %q", i, got)
		}
	}
	st := ref.Stats()
	if st.Accepted != 6 || st.Rejected != 2 {
		t.Errorf("stats: accepted %d rejected %d, want 6 and 2", st.Accepted, st.Rejected)
	}
	if a := st.Tokens[MaskToken("a")]; a.Accepted != 5 || a.Rejected != 2 {
		t.Errorf("token a: %+v", a)
	}
}

// TestStatsEndpointCountsWhatWasSent: concurrent clients, then GET /stats.
func TestStatsEndpointCountsWhatWasSent(t *testing.T) {
	clk := clock.NewVirtual()
	ref, _ := New(sluice.MustParse("10/s; 15/m"), WithClock(clk))
	srv := httptest.NewServer(ref)
	defer srv.Close()
	done := make(chan int, 4)
	for w := 0; w < 4; w++ {
		go func() {
			ok := 0
			for i := 0; i < 10; i++ {
				if get(t, srv.URL+"/x", "tok").StatusCode == 200 {
					ok++
				}
			}
			done <- ok
		}()
	}
	accepted := 0
	for w := 0; w < 4; w++ {
		accepted += <-done
	}
	if accepted != 10 {
		t.Fatalf("%d accepted at one instant, want the burst 10", accepted)
	}
	clk.Advance(time.Second)
	for i := 0; i < 10; i++ {
		get(t, srv.URL+"/x", "tok") // 10 more earned, but the minute allows 5
	}
	resp, err := http.Get(srv.URL + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.Accepted != 15 || st.Rejected != 35 || st.Limits != "10/s; 15/m" {
		t.Errorf("/stats: %+v, want accepted 15 rejected 35", st)
	}
	if st.Tokens[MaskToken("tok")].Accepted != 15 || len(st.Tokens) != 1 {
		t.Errorf("/stats tokens: %+v", st.Tokens)
	}
	if strings.Contains(st.Summary(), "tok~") == false {
		t.Errorf("summary: %q", st.Summary())
	}
}

func TestRetryAfterAsDate(t *testing.T) {
	clk := clock.NewVirtual()
	ref, _ := New(sluice.MustParse("1/m"), WithClock(clk), WithDateRetryAfter())
	srv := httptest.NewServer(ref)
	defer srv.Close()
	get(t, srv.URL, "a")
	clk.Advance(10*time.Second + 300*time.Millisecond)
	resp := get(t, srv.URL, "a")
	if resp.StatusCode != 429 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	v := resp.Header.Get("Retry-After")
	at, err := http.ParseTime(v)
	if err != nil {
		t.Fatalf("Retry-After %q is not an HTTP-date: %v", v, err)
	}
	if want := clock.Epoch.Add(time.Minute); !at.Equal(want) {
		t.Errorf("Retry-After %v, want %v (rounded up to the second)", at, want)
	}
	if resp.Header.Get("Retry-After-Ms") != "" {
		t.Errorf("Retry-After-Ms sent with a date")
	}
	d, ok := httplimit.RetryAfter(resp.Header, clk.Now())
	if !ok || d != 49*time.Second+700*time.Millisecond {
		t.Errorf("httplimit.RetryAfter read %v %v", d, ok)
	}
}

func TestNoTokenAndTokenCap(t *testing.T) {
	ref, _ := New(sluice.MustParse("1/s"), WithMaxTokens(2))
	srv := httptest.NewServer(ref)
	defer srv.Close()
	if r := get(t, srv.URL, ""); r.StatusCode != 401 {
		t.Errorf("no token: %d", r.StatusCode)
	}
	get(t, srv.URL, "a")
	get(t, srv.URL, "b")
	if r := get(t, srv.URL, "c"); r.StatusCode != 503 {
		t.Errorf("third token past a cap of 2: %d", r.StatusCode)
	}
	ref.Reset()
	if r := get(t, srv.URL, "c"); r.StatusCode != 200 {
		t.Errorf("after Reset: %d", r.StatusCode)
	}
}

func TestBearerToken(t *testing.T) {
	ref, _ := New(sluice.MustParse("1/h"))
	srv := httptest.NewServer(ref)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/x", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer s3cr3t")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || ref.Stats().Tokens[MaskToken("s3cr3t")].Accepted != 1 {
		t.Errorf("bearer token not counted: %d %+v", resp.StatusCode, ref.Stats().Tokens)
	}
	if strings.Contains(ref.Stats().Summary(), "s3cr3t") {
		t.Errorf("the summary shows the token")
	}
}
