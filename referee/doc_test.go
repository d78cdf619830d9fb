package referee_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/referee"
)

func Example() {
	clk := clock.NewVirtual()
	ref, _ := referee.New(sluice.MustParse("1/6s"), referee.WithClock(clk))
	srv := httptest.NewServer(ref)
	defer srv.Close()
	for _, at := range []int64{2, 8, 13, 14} {
		clk.Set(at * 1e9)
		req, _ := http.NewRequest("GET", srv.URL+"/v1/things", nil)
		req.Header.Set("Authorization", "Bearer secret-token")
		resp, _ := http.DefaultClient.Do(req)
		resp.Body.Close()
		fmt.Printf("t=%-2d %d", at, resp.StatusCode)
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			fmt.Printf(" retry after %ss", ra)
		}
		fmt.Println()
	}
	s := ref.Stats()
	fmt.Println(s.Accepted, s.Rejected)
	// Output:
	// t=2  200
	// t=8  200
	// t=13 429 retry after 1s
	// t=14 200
	// 3 1
}
