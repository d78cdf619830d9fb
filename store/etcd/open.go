package etcd

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/store"
)

func init() {
	store.Register(open, "etcd")
	store.RegisterParser(parse, "etcd")
}

// parse reads a URL as open does, making no client.
func parse(raw string) error {
	_, rest, _ := strings.Cut(raw, "://")
	return store.CheckHosts(raw, rest, "etcd://HOST:PORT[,HOST:PORT]")
}

// handle is a Store that owns its client.
type handle struct {
	*Store
	client *clientv3.Client
}

func (h handle) Close() error { return h.client.Close() }

// open opens a store for store.Open: etcd://HOST:PORT[,HOST:PORT], any members of a
// cluster, dialled within cfg.Timeout.
func open(_ context.Context, raw string, cfg store.Config) (store.Handle, error) {
	_, rest, _ := strings.Cut(raw, "://")
	hosts := store.Hosts(rest)
	c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(hosts, ","), DialTimeout: cfg.Timeout,
		Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", store.ErrBadURL, raw, err)
	}
	return handle{New(c, store.WithPrefix(cfg.Prefix), store.WithNow(cfg.Now)), c}, nil
}
