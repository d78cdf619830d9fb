package adaptive_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/referee"
)

// TestTransportPacesAgainstTheReferee: three clients (three Transports, sharing nothing),
// four goroutines each, call a real referee over HTTP for two seconds. Every request gets
// an answer, the clients together stay close to the limit (a loose bound: real time), and
// a request whose context ends while it waits for its slot returns the context's error.
func TestTransportPacesAgainstTheReferee(t *testing.T) {
	ref, err := referee.New(sluice.MustParse("50/s burst=10"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ref)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		client := &http.Client{Transport: &adaptive.Transport{}}
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/work", nil)
					req.Header.Set("Authorization", "Bearer t")
					resp, err := client.Do(req)
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("request failed: %v", err)
						}
						return
					}
					resp.Body.Close()
				}
			}()
		}
	}
	wg.Wait()
	st := ref.Stats()
	t.Logf("accepted %d, refused %d", st.Accepted, st.Rejected)
	// 2 s of 50/s burst 10 is 110 at most: the pool must get a fair part of it, and must
	// not flood the API (12 goroutines unpaced would send thousands).
	if st.Accepted < 40 || st.Accepted+st.Rejected > 400 {
		t.Errorf("accepted %d, refused %d: not paced to the limit", st.Accepted, st.Rejected)
	}
}
