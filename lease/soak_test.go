//go:build soak

package lease_test

import (
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestSoakMultiProcessOnRedis: TestMultiProcessOnRedis for SLUICE_SOAK (default 1m), held
// to the tight figure the short test leaves out: the pool uses at least 95% of the limit
// before the kill and after its recovery window.
func TestSoakMultiProcessOnRedis(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("SLUICE_SOAK"))
	if err != nil || d <= 0 {
		d = time.Minute
	}
	srv := redistest.New(t)
	testMultiProcess(t, memberConfig{Addrs: []string{srv.Addr()}}, d, 0.95)
}
