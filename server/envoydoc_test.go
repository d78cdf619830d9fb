package server

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// yamlBlocks returns the ```yaml blocks of a Markdown file, in order.
func yamlBlocks(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, part := range strings.Split(string(b), "```yaml\n")[1:] {
		out = append(out, part[:strings.Index(part, "```")])
	}
	return out
}

// TestEnvoyDocConfigs: the Envoy config docs/envoy.md shows is a valid Envoy bootstrap
// (parsed into go-control-plane's types, with their validation, the rate limit filter
// naming the sluice cluster), and the rate limit config beside it parses into its rules.
func TestEnvoyDocConfigs(t *testing.T) {
	blocks := yamlBlocks(t, "../docs/envoy.md")
	if len(blocks) < 2 {
		t.Fatalf("docs/envoy.md has %d yaml blocks, want the Envoy config and the rate limit config", len(blocks))
	}
	var v any
	if err := yaml.Unmarshal([]byte(blocks[0]), &v); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var boot bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &boot); err != nil {
		t.Fatalf("the Envoy config: %v", err)
	}
	if err := boot.ValidateAll(); err != nil {
		t.Fatalf("the Envoy config: %v", err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := boot.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	if err := hcm.ValidateAll(); err != nil {
		t.Fatalf("the connection manager: %v", err)
	}
	var rl ratelimitv3.RateLimit
	if err := hcm.HttpFilters[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	if err := rl.ValidateAll(); err != nil {
		t.Fatalf("the rate limit filter: %v", err)
	}
	if rl.Domain != "edge" || rl.RateLimitService.GrpcService.GetEnvoyGrpc().GetClusterName() != "sluice" {
		t.Errorf("the filter asks domain %q of cluster %q", rl.Domain, rl.RateLimitService.GrpcService.GetEnvoyGrpc().GetClusterName())
	}
	cfg, err := ParseEnvoyConfig("docs/envoy.md", []byte(blocks[1]))
	if err != nil || len(cfg.Rules) != 3 {
		t.Fatalf("the rate limit config: %d rules, %v", len(cfg.Rules), err)
	}
}

// TestDaemonDocConfig: the config file docs/daemon.md shows parses, rules and all.
func TestDaemonDocConfig(t *testing.T) {
	blocks := yamlBlocks(t, "../docs/daemon.md")
	cfg, err := ParseConfig("docs/daemon.md", []byte(blocks[0]))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ListenGRPC == "" || len(cfg.Rules) < 6 || !cfg.Rules[3].PathGlob || !cfg.Rules[4].Deny || !cfg.Rules[5].Shadow {
		t.Errorf("parsed %+v", cfg)
	}
}
