package redis

import (
	"context"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/store"
)

func init() {
	store.Register(open, "redis", "rediss", "redis-cluster", SentinelScheme)
	store.RegisterParser(parse, "redis", "rediss", "redis-cluster", SentinelScheme)
}

// parse reads a URL as open does, making no client.
func parse(raw string) error {
	scheme, rest, _ := strings.Cut(raw, "://")
	switch scheme {
	case "redis-cluster":
		return store.CheckHosts(raw, rest, "redis-cluster://HOST:PORT[,HOST:PORT]")
	case SentinelScheme:
		_, err := FailoverOptions(raw, 0)
		return err
	}
	_, err := ClientOptions(raw, 0)
	return err
}

// handle is a Store that owns its client.
type handle struct {
	*Store
	client goredis.UniversalClient
}

func (h handle) Close() error { return h.client.Close() }

// open opens a store for store.Open: one Redis (redis://, rediss://), a Redis Cluster
// (redis-cluster://HOST:PORT,HOST:PORT) or a master found through Sentinel
// (redis-sentinel://), its client set as ClientOptions sets one.
func open(_ context.Context, raw string, cfg store.Config) (store.Handle, error) {
	var c goredis.UniversalClient
	scheme, rest, _ := strings.Cut(raw, "://")
	switch scheme {
	case "redis-cluster":
		o := &goredis.ClusterOptions{Addrs: strings.Split(store.Hosts(rest), ","), MaxRetries: -1,
			ContextTimeoutEnabled: true, DisableIdentity: true,
			DialTimeout: cfg.Timeout, ReadTimeout: cfg.Timeout, WriteTimeout: cfg.Timeout, PoolTimeout: cfg.Timeout}
		c = goredis.NewClusterClient(o)
	default:
		cl, err := NewClient(raw, cfg.Timeout)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", store.ErrBadURL, err)
		}
		c = cl
	}
	return handle{New(c, storeOptions(cfg)...), c}, nil
}

// storeOptions gives New the settings of cfg.
func storeOptions(cfg store.Config) []store.Option {
	opts := []store.Option{store.WithPrefix(cfg.Prefix), store.WithNow(cfg.Now)}
	if cfg.AssumeFresh {
		opts = append(opts, store.WithAssumeFresh())
	}
	return opts
}
