package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/store"
	_ "github.com/sluicehq/sluice/store/all"
	"github.com/spf13/cobra"
)

// storeTimeout bounds each command a store's client sends.
const storeTimeout = 500 * time.Millisecond

// openStore opens the store a URL names (store.Open: memory://, redis://, rediss://,
// redis-cluster://, redis-sentinel://, etcd://, zk://), its records under prefix. For ""
// and memory:// it returns a nil store: the caller makes a store.Memory on its own clock.
// The returned func closes the client.
func openStore(raw, prefix string) (store.Store, func(), error) {
	if raw == "" || raw == "memory://" {
		return nil, func() {}, nil
	}
	h, err := store.Open(context.Background(), raw, store.WithPrefix(prefix), store.WithTimeout(storeTimeout))
	if err != nil {
		return nil, nil, usagef("store: %v", err)
	}
	return h, func() { h.Close() }, nil
}

func init() { register(newStoreCmd) }

// newStoreCmd is `sluice store`, the lease mode's store: `sluice store init URL` prepares a
// new store so that the daemons started on it after are not fenced.
func newStoreCmd(env Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "prepare the lease mode's store (sluice store init URL)",
		Args:  noArgs,
		RunE:  func(c *cobra.Command, _ []string) error { return usagef("store: want a subcommand: init") },
	}
	var prefix string
	var ttl, grace time.Duration
	initCmd := &cobra.Command{
		Use:   "init URL",
		Short: "mark a new lease store's incarnation and wait out its fence once, so that the daemons started on it after grant at once",
		Long: "A store seen for the first time (a new Redis, etcd or ZooKeeper; or one flushed, or restarted empty) cannot tell that no lease\n" +
			"was granted from it before, so it fences every limit it makes for TTL + grace. `sluice store init URL` reads it once (which\n" +
			"marks its incarnation) and waits that fence out, so that `sluice serve --backend lease --store URL` started after it\n" +
			"grants at once. It is idempotent, and a store that loses its data later is fenced again (its mark is gone with it).\n" +
			"A Redis Cluster keeps no such mark: each record it makes is fenced, whatever came before.",
		Example: "  sluice store init redis://127.0.0.1:6379",
		Args:    exactArgs(1, "store init: want the store's URL (redis://, redis-sentinel://, etcd://, zk://)"),
		RunE: func(c *cobra.Command, args []string) error {
			return runStoreInit(c.Context(), env, args[0], prefix, ttl, grace)
		},
	}
	fs := initCmd.Flags()
	fs.StringVar(&prefix, "prefix", "sluice:lease:", "the records' key `prefix` (the daemon's)")
	fs.DurationVar(&ttl, "lease-ttl", lease.DefaultConfig().TTL, "the TTL of the daemons' leases: a `duration`")
	fs.DurationVar(&grace, "lease-grace", lease.DefaultConfig().Grace, "the grace of the daemons' leases: a `duration`")
	cmd.AddCommand(initCmd)
	return cmd
}

func runStoreInit(ctx context.Context, env Env, url, prefix string, ttl, grace time.Duration) error {
	if strings.HasPrefix(url, "redis-cluster://") {
		return fmt.Errorf("store init: a Redis Cluster keeps no incarnation mark (one key cannot be read atomically with records on other nodes): each record it makes is fenced for TTL + grace, whatever is done before (docs/lease.md)")
	}
	if url == "" || url == "memory://" {
		return usagef("store init: %q: an in-memory store is new with each process and never fenced; want redis://, redis-sentinel://, etcd:// or zk://", url)
	}
	st, closeStore, err := openStore(url, prefix)
	if err != nil {
		return err
	}
	defer closeStore()
	cfg := lease.DefaultConfig()
	cfg.TTL, cfg.Grace = ttl, grace
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	ctx, cancel := context.WithTimeout(ctx, ttl+grace+10*time.Second)
	defer cancel()
	start := time.Now()
	if err := lease.WaitUnfenced(ctx, st, cfg); err != nil {
		return fmt.Errorf("store init: %s: %w", url, err)
	}
	if waited := time.Since(start); waited > 100*time.Millisecond {
		fmt.Fprintf(env.Stdout, "ok: %s marked and its fence waited out (%v): daemons started on it from now on are not fenced\n", url, waited.Round(10*time.Millisecond))
	} else {
		fmt.Fprintf(env.Stdout, "ok: %s was marked already and is not fenced\n", url)
	}
	return nil
}
