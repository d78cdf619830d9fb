package gossip_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gossip"
)

// TestDaemonMetrics: a daemon on the gossip back end shows the pool's figures on /metrics.
func TestDaemonMetrics(t *testing.T) {
	cfg := gossip.DefaultConfig()
	cfg.Bind = "127.0.0.1:0"
	be, err := gossip.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() }) // after the daemon's shutdown (cleanups run last first)
	s := daemon(t, be, "api=10/s")
	if _, err := s.Decide(context.Background(), "api", 1, 0); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + s.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"sluice_gossip_members 1", `sluice_gossip_hits_total{origin="local",tag="api"} 1`, "sluice_gossip_malformed_total 0", `sluice_gossip_bytes_total{direction="sent"}`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
