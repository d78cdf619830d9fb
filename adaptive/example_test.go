package adaptive_test

import (
	"fmt"
	"net/http"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/referee"
)

// A client of the adaptive mode in virtual time: a controller learns its pace from the
// referee's answers (20/s with a burst of 10) and keeps it without a refusal.
func ExampleController() {
	clk := clock.NewVirtual()
	ref, _ := referee.New(sluice.MustParse("20/s burst=10"), referee.WithClock(clk))
	c, _ := adaptive.New(adaptive.Config{}, 1)
	for sent := 0; sent < 400; {
		at, out := c.Next(clk.Nanotime(), 0)
		clk.Set(max(at, clk.Nanotime()))
		if out != adaptive.Send {
			continue // ask again at the time given
		}
		sent++
		v, _ := ref.Call("token", 1, at)
		h := http.Header{}
		ref.WriteHeaders(h, v, clk.Now())
		status := http.StatusOK
		if !v.Allowed {
			status = http.StatusTooManyRequests
		}
		c.Observe(at, adaptive.Answer{Status: status, Header: h, Date: clk.Now(), Sent: at})
	}
	st := ref.Stats()
	fmt.Printf("accepted %d, refused %d, in %.0f s\n", st.Accepted, st.Rejected, float64(clk.Nanotime())/1e9)
	// Output: accepted 400, refused 0, in 20 s
}

// The one line: an http.Client whose goroutines are one client of the adaptive mode.
func ExampleTransport() {
	client := &http.Client{Transport: &adaptive.Transport{}}
	_ = client // client.Get(...) waits for its slot, and learns from the answer
}
