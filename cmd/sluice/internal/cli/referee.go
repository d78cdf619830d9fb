package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/referee"
)

func init() { register(newRefereeCmd) }

func newRefereeCmd(env Env) *cobra.Command {
	var a refereeArgs
	cmd := &cobra.Command{
		Use:               "referee",
		Short:             "serve a strict rate-limited API stand-in that counts violations (GET /stats)",
		Example:           "  sluice referee --limit '1/6s' --listen 127.0.0.1:8429\n  sluice referee --limit '60/m' --tokens '40000/m' --style openai",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(cmd *cobra.Command, _ []string) error { return runReferee(cmd.Context(), env, a) },
	}
	fs := cmd.Flags()
	fs.TextVar(&a.limits, "limit", sluice.MustParse("1/6s"), "the `limit` enforced per token (e.g. '1/6s', '4500/h', '100/s burst=20; 4500/h')")
	fs.StringVar(&a.listen, "listen", "127.0.0.1:8429", "`address` to listen on (loopback unless told otherwise)")
	fs.BoolVar(&a.dateRetry, "retry-after-date", false, "send Retry-After as an HTTP-date instead of seconds")
	fs.IntVar(&a.maxTokens, "max-tokens", referee.DefaultMaxTokens, "most tokens tracked; requests with new tokens past it get 503")
	fs.TextVar(&a.costs, "tokens", sluice.Limits(nil), "an LLM-style API: also limit what requests cost, a `limit` in tokens (e.g. '40000/m': tokens a minute), each request's cost read from its X-Cost header")
	fs.TextVar(&a.style, "style", referee.IETF, "the answers' header `fields`: ietf (RateLimit-Policy, RateLimit, RateLimit-Remaining), openai (x-ratelimit-*-requests and -tokens) anthropic (anthropic-ratelimit-*), heroku (RateLimit-Remaining alone) or bare (Retry-After alone, on a 429)")
	completeWith(cmd, "style", "ietf", "openai", "anthropic", "heroku", "bare")
	return cmd
}

// refereeArgs are the flags of sluice referee.
type refereeArgs struct {
	limits, costs sluice.Limits
	listen        string
	dateRetry     bool
	maxTokens     int
	style         referee.Style
}

func runReferee(ctx context.Context, env Env, a refereeArgs) error {
	opts := []referee.Option{referee.WithMaxTokens(a.maxTokens), referee.WithStyle(a.style)}
	if len(a.costs) > 0 {
		opts = append(opts, referee.WithCostLimits(a.costs))
	}
	if a.dateRetry {
		opts = append(opts, referee.WithDateRetryAfter())
	}
	ref, err := referee.New(a.limits, opts...)
	if err != nil {
		return usageError{err}
	}
	ln, err := net.Listen("tcp", a.listen)
	if err != nil {
		return fmt.Errorf("referee: %w", err)
	}
	srv := &http.Server{Handler: ref, ReadHeaderTimeout: 10 * time.Second}
	what := a.limits.String()
	if len(a.costs) > 0 {
		what += ", and " + a.costs.String() + " in tokens (X-Cost),"
	}
	fmt.Fprintf(env.Stderr, "sluice referee: %s per API token on http://%s, %s fields (GET /stats for counts)\n", what, ln.Addr(), a.style)
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
