package referee

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/internal/ratehdr"
)

// call sends one request of cost tokens (X-Cost; none if cost < 0).
func call(t *testing.T, url string, cost string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/chat", nil)
	req.Header.Set("Authorization", "Bearer k")
	if cost != "" {
		req.Header.Set(HeaderCost, cost)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestLLMStyle: requests per minute plus tokens per minute, each request's cost from
// X-Cost; a refusal by the token limit takes nothing from the request limit; the answers
// carry OpenAI's or Anthropic's fields, which the header reader clients use reads back.
func TestLLMStyle(t *testing.T) {
	for _, style := range []Style{OpenAI, Anthropic, IETF} {
		t.Run(style.String(), func(t *testing.T) {
			clk := clock.NewVirtual()
			ref, err := New(sluice.MustParse("3/m"), WithClock(clk), WithCostLimits(sluice.MustParse("1000/m")), WithStyle(style))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(ref)
			defer srv.Close()
			steps := []struct {
				at            time.Duration
				cost          string
				status        int
				reqLeft, left int64 // requests and tokens left, as read back
			}{
				{0, "600", 200, 2, 400},
				{0, "500", 429, 2, 400}, // the tokens refuse; the request limit keeps its permit
				{0, "400", 200, 1, 0},
				{6 * time.Second, "", 200, 0, 99}, // no X-Cost: one token; 100 earned back
				{6 * time.Second, "1", 429, 0, 99},
				{20 * time.Second, "1", 200, 0, 331},
			}
			for i, s := range steps {
				clk.Set(int64(s.at))
				resp := call(t, srv.URL, s.cost)
				f := ratehdr.Read(resp.StatusCode, resp.Header, clk.Now())
				var req, tok ratehdr.Quota
				for _, q := range f.Quotas {
					if q.Tokens() {
						tok = q
					} else {
						req = q
					}
				}
				if resp.StatusCode != s.status || req.Remaining != s.reqLeft || tok.Remaining != s.left || req.Limit != 3 || tok.Limit != 1000 {
					t.Errorf("step %d: got %d, requests %d of %d, tokens %d of %d; want %d, %d of 3, %d of 1000", i,
						resp.StatusCode, req.Remaining, req.Limit, tok.Remaining, tok.Limit, s.status, s.reqLeft, s.left)
				}
				if s.status == 429 && !f.HasRetryAfter {
					t.Errorf("step %d: a refusal without Retry-After", i)
				}
				if style != IETF && (req.Reset < 0 || tok.Reset < 0) {
					t.Errorf("step %d: resets %v and %v not read back", i, req.Reset, tok.Reset)
				}
			}
			st := ref.Stats()
			if st.Accepted != 4 || st.Rejected != 2 || st.Cost != 1002 {
				t.Errorf("stats: %d accepted (%d tokens), %d refused; want 4 (1002), 2", st.Accepted, st.Cost, st.Rejected)
			}
		})
	}
}

func TestBadCost(t *testing.T) {
	ref, _ := New(sluice.MustParse("3/m"), WithCostLimits(sluice.MustParse("1000/m")))
	srv := httptest.NewServer(ref)
	defer srv.Close()
	for _, v := range []string{"-1", "many", "1e20", "99999999999999999999"} {
		if r := call(t, srv.URL, v); r.StatusCode != http.StatusBadRequest {
			t.Errorf("X-Cost %q: status %d, want 400", v, r.StatusCode)
		}
	}
	if st := ref.Stats(); st.Accepted+st.Rejected != 0 {
		t.Errorf("bad requests were judged: %+v", st)
	}
	if _, err := New(sluice.MustParse("3/m"), WithStyle(9)); err == nil {
		t.Error("an unknown style accepted")
	}
	if _, err := ParseStyle("azure"); err == nil {
		t.Error("an unknown style name accepted")
	}
}

// TestHerokuAndBareStyles: the heroku style answers RateLimit-Remaining alone, a refusal
// too (no limit, no window, no Retry-After); the bare style answers nothing but
// Retry-After on a refusal.
func TestHerokuAndBareStyles(t *testing.T) {
	for _, style := range []Style{Heroku, Bare} {
		t.Run(style.String(), func(t *testing.T) {
			clk := clock.NewVirtual()
			ref, err := New(sluice.MustParse("2/m"), WithClock(clk), WithStyle(style))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(ref)
			defer srv.Close()
			for i, want := range []int{200, 200, 429} {
				resp := call(t, srv.URL, "")
				var fields []string
				for k := range resp.Header {
					switch k {
					case "Content-Type", "Content-Length", "Date", "X-Content-Type-Options":
					default:
						fields = append(fields, k)
					}
				}
				f := ratehdr.Read(resp.StatusCode, resp.Header, clk.Now())
				switch {
				case resp.StatusCode != want:
					t.Errorf("step %d: status %d, want %d", i, resp.StatusCode, want)
				case style == Heroku && (len(fields) != 1 || fields[0] != "Ratelimit-Remaining" || len(f.Quotas) != 1 || f.Quotas[0].Remaining != int64(1-min(i, 1)) || f.Quotas[0].Limit > 0):
					t.Errorf("step %d: fields %v, read %+v; want RateLimit-Remaining alone", i, fields, f.Quotas)
				case style == Bare && want == 200 && len(fields) != 0:
					t.Errorf("step %d: fields %v on a 200, want none", i, fields)
				case style == Bare && want == 429 && (!f.HasRetryAfter || len(f.Quotas) != 0):
					t.Errorf("step %d: fields %v on a 429, want Retry-After alone", i, fields)
				}
			}
		})
	}
}
