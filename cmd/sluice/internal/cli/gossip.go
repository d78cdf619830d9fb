package cli

import (
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/clock"
	"github.com/sluicehq/sluice/gossip"
	"github.com/sluicehq/sluice/gossip/hits"
	"github.com/sluicehq/sluice/internal/yamlx"
	"github.com/sluicehq/sluice/server"
)

// addGossipFlags adds the gossip back end's flags (docs/gossip.md).
func addGossipFlags(fs *pflag.FlagSet, d server.GossipConfig) {
	fs.String("gossip-bind", d.Bind, "--backend gossip: `host:port` of the membership's UDP and TCP listeners")
	fs.String("gossip-advertise", d.Advertise, "--backend gossip: `host:port` peers reach this daemon at (default: --gossip-bind)")
	fs.String("peers", "", "--backend gossip: seed list `host:port,...` of daemons to join (a DNS name with several addresses joins each)")
	fs.String("gossip-key-file", d.KeyFile, "--backend gossip: `file` holding the shared key (16, 24 or 32 bytes; raw, base64 or hex) that encrypts and authenticates the daemons' traffic")
	fs.Duration("gossip-interval", d.Interval.D(), "--backend gossip: sync interval (the excess between syncs scales with it)")
	fs.Duration("gossip-hold", d.Hold.D(), "--backend gossip: how long a lost peer keeps its share (a partition shorter than this does not multiply the limit)")
	fs.String("gossip-policy", d.Policy, "--backend gossip: the `policy`: auto (each small limit decided at its key's owner, large ones by shares), owner (every limit decided at its key's owner: the daemon the key hashes to; the others forward), shares (spend only this daemon's share, by demand, between syncs), equal (1/N of each limit, N the daemons counted: no demand needed) or whole (the DThrottle design as written, for comparison)")
}

// setGossip applies one gossip flag of fs that was set.
func setGossip(g *server.GossipConfig, fs *pflag.FlagSet, f *pflag.Flag) {
	v := f.Value.String()
	switch f.Name {
	case "gossip-bind":
		g.Bind = v
	case "gossip-advertise":
		g.Advertise = v
	case "peers":
		g.Peers = nil
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				g.Peers = append(g.Peers, p)
			}
		}
	case "gossip-key-file":
		g.KeyFile = v
	case "gossip-policy":
		g.Policy = v
	case "gossip-interval", "gossip-hold":
		d := yamlx.Duration(must(fs.GetDuration(f.Name)))
		if f.Name == "gossip-interval" {
			g.Interval = d
		} else {
			g.Hold = d
		}
	}
}

// openGossip starts the gossip back end a config names.
func openGossip(cfg server.Config, clk clock.Clock) (backend.Backend, error) {
	g := cfg.Gossip
	gc := gossip.DefaultConfig()
	gc.Bind, gc.Advertise, gc.Peers = g.Bind, g.Advertise, g.Peers
	gc.Interval, gc.Hold, gc.MaxTags = g.Interval.D(), g.Hold.D(), cfg.MaxKeys
	gc.MeshMax = g.MeshMax
	gc.Policy, _ = hits.ParsePolicy(g.Policy) // checked by Validate
	gc.PolicyFor = server.GossipPolicies(cfg.Rules)
	gc.Clock = clk
	gc.Logger = server.NewLogger(cfg, os.Stderr)
	if g.KeyFile != "" {
		k, err := gossip.ReadKey(g.KeyFile)
		if err != nil {
			return nil, err
		}
		gc.Key = k
	}
	return gossip.New(gc)
}
