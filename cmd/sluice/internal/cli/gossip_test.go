package cli

import (
	"io"
	"slices"
	"testing"
	"time"
)

// TestGossipFlags: the gossip flags set the config's gossip block.
func TestGossipFlags(t *testing.T) {
	sf := newServeFlags(Env{Stdout: io.Discard, Stderr: io.Discard})
	if err := sf.fs.Parse([]string{"--backend", "gossip", "--gossip-bind", "127.0.0.1:9000", "--peers", "a:1, b:2",
		"--gossip-interval", "50ms", "--gossip-hold", "3s", "--gossip-key-file", "/k", "--gossip-policy", "whole"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := sf.build()
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.Gossip
	if cfg.Backend != "gossip" || g.Bind != "127.0.0.1:9000" || !slices.Equal(g.Peers, []string{"a:1", "b:2"}) ||
		g.Interval.D() != 50*time.Millisecond || g.Hold.D() != 3*time.Second || g.KeyFile != "/k" || g.Policy != "whole" {
		t.Errorf("gossip config %+v", g)
	}
	if code, _, errs := run(t, "serve", "--backend", "gossip", "--gossip-key-file", "/nonexistent"); code == 0 {
		t.Errorf("a missing key file was accepted: %s", errs)
	}
}
