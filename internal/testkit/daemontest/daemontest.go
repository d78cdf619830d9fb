// Package daemontest starts a daemon (package server) in a test: on the listeners its
// configuration names, quiet, shut down when the test ends. The packages whose tests run a
// daemon beside their own code share it (package server's own tests, inside the package,
// cannot import it).
package daemontest

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/sluicehq/sluice/server"
)

// Start starts a daemon of cfg with opts (its log discarded), and shuts it down when t
// ends.
func Start(t testing.TB, cfg server.Config, opts ...server.Option) *server.Server {
	t.Helper()
	opts = append([]server.Option{server.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	s, err := server.New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return s
}

// Rules reads rule flags (server.ParseRuleFlag) into server.Rules, failing t on a bad one.
func Rules(t testing.TB, flags ...string) []server.Rule {
	t.Helper()
	var rs []server.Rule
	for _, f := range flags {
		r, err := server.ParseRuleFlag(f, false)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	return rs
}
