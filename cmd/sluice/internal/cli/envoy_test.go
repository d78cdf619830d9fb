package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeEnvoyConfigFormat: --config-format envoy reads envoyproxy/ratelimit's files,
// with their errors' file and line; the format is checked.
func TestServeEnvoyConfigFormat(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"), 0o644)
	os.WriteFile(bad, []byte("domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: lustrum, requests_per_unit: 10}\n"), 0o644)
	for i, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"serve", "--check-config", "--config-format", "envoy", "--config", good, "--listen-grpc", "127.0.0.1:8081"}, 0, "ok: 2 rules"},
		{[]string{"serve", "--check-config", "--config-format", "envoy", "--config", bad}, ExitUsage, "bad.yaml:4: rate_limit.unit"},
		{[]string{"serve", "--check-config", "--config", good}, ExitUsage, `unknown field "domain"`}, // the daemon's own format by default
		{[]string{"serve", "--check-config", "--config-format", "xml", "--config", good}, ExitUsage, "--config-format: want sluice or envoy"},
	} {
		code, out, errs := run(t, c.args...)
		if code != c.code || !strings.Contains(out+errs, c.out) {
			t.Errorf("case %d %v: exit %d, out %q err %q; want %d and %q", i, c.args, code, out, errs, c.code, c.out)
		}
	}
}
