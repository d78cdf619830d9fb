package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/referee"
)

func init() {
	register(command{
		name:    "referee",
		summary: "serve a strict rate-limited API stand-in that counts violations (GET /stats)",
		run:     runReferee,
	})
}

func runReferee(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env, "referee", "referee --limit '1/6s' [--tokens '40000/m' --style openai] [--listen 127.0.0.1:8429]")
	var limits sluice.Limits
	fs.TextVar(&limits, "limit", sluice.MustParse("1/6s"), "the `limit` enforced per token (e.g. '1/6s', '4500/h', '100/s burst=20; 4500/h')")
	listen := fs.String("listen", "127.0.0.1:8429", "`address` to listen on (loopback unless told otherwise)")
	dateRetry := fs.Bool("retry-after-date", false, "send Retry-After as an HTTP-date instead of seconds")
	maxTokens := fs.Int("max-tokens", referee.DefaultMaxTokens, "most tokens tracked; requests with new tokens past it get 503")
	var costs sluice.Limits
	fs.TextVar(&costs, "tokens", sluice.Limits(nil), "an LLM-style API: also limit what requests cost, each request's cost in tokens read from its X-Cost header (e.g. '40000/m': tokens a minute)")
	var style referee.Style
	fs.TextVar(&style, "style", referee.IETF, "the answers' header `fields`: ietf (RateLimit-Policy, RateLimit, RateLimit-Remaining), openai (x-ratelimit-*-requests and -tokens) anthropic (anthropic-ratelimit-*), heroku (RateLimit-Remaining alone) or bare (Retry-After alone, on a 429)")
	if err := parseFlags(env, fs, args); err != nil {
		return err
	}
	opts := []referee.Option{referee.WithMaxTokens(*maxTokens), referee.WithStyle(style)}
	if len(costs) > 0 {
		opts = append(opts, referee.WithCostLimits(costs))
	}
	if *dateRetry {
		opts = append(opts, referee.WithDateRetryAfter())
	}
	ref, err := referee.New(limits, opts...)
	if err != nil {
		return usageError{err}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("referee: %w", err)
	}
	srv := &http.Server{Handler: ref, ReadHeaderTimeout: 10 * time.Second}
	what := limits.String()
	if len(costs) > 0 {
		what += ", and " + costs.String() + " in tokens (X-Cost),"
	}
	fmt.Fprintf(env.Stderr, "sluice referee: %s per API token on http://%s, %s fields (GET /stats for counts)\n", what, ln.Addr(), style)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	fmt.Fprint(env.Stderr, ref.Stats().Summary())
	return nil
}
