package robustness

import (
	"context"
	"fmt"
	"io"
	"log"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/testkit/etcdtest"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	"github.com/sluicehq/sluice/internal/testkit/zktest"
	"github.com/sluicehq/sluice/internal/zkclient"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/store"
	etcdstore "github.com/sluicehq/sluice/store/etcd"
	redisstore "github.com/sluicehq/sluice/store/redis"
	zkstore "github.com/sluicehq/sluice/store/zk"
)

// storeServer is the real server a run's members share: redis-server, etcd or ZooKeeper
// (internal/testkit/redistest, etcdtest, zktest). Kill and Restart: Redis comes back empty (no
// persistence), etcd and ZooKeeper with their data (a crash); wipe, where a server has
// it, deletes the data first (a cluster rebuilt from nothing).
type storeServer interface {
	Addr() string
	Pause()
	Resume()
	Kill()
	Restart() error
	Close()
}

var (
	_ storeServer = (*redistest.Server)(nil)
	_ storeServer = (*etcdtest.Server)(nil)
	_ storeServer = (*zktest.Server)(nil)
)

// wiper is a storeServer whose data can be deleted while it is down.
type wiper interface{ Wipe() error }

// rewinder is a storeServer whose data can be copied now and put back later (etcd,
// ZooKeeper: their data directories).
type rewinder interface {
	Snapshot() (string, error)
	Rewind(snap string) error
}

var (
	_ rewinder = (*etcdtest.Server)(nil)
	_ rewinder = (*zktest.Server)(nil)
)

// startStore starts the store the mode runs on: none for gossip.
func startStore(mode Mode) (storeServer, error) {
	switch mode {
	case ModeGossip:
		return nil, nil
	case ModeLeaseEtcd:
		s, err := etcdtest.Start()
		if err != nil {
			return nil, fmt.Errorf("robust: the lease-etcd runs need a real etcd (Debian package etcd-server): %w", err)
		}
		return s, nil
	case ModeLeaseZK:
		s, err := zktest.Start()
		if err != nil {
			return nil, fmt.Errorf("robust: the lease-zk runs need a real ZooKeeper (Debian package zookeeperd): %w", err)
		}
		return s, nil
	}
	s, err := redistest.Start()
	if err != nil {
		return nil, fmt.Errorf("robust: the runs need a real redis-server (Debian package redis-server): %w", err)
	}
	return s, nil
}

// leaseStore opens the lease mode's store at addr (the member's proxy, or the server
// itself) for mode, under prefix, and returns it with the function that closes its
// client. Calls to it are bounded by the lease backend's store time-out; the clients' own
// time-outs are short, so that a fault is seen as one.
func leaseStore(mode Mode, addr, prefix string) (store.Store, func(), error) {
	switch mode {
	case ModeLeaseEtcd:
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 300 * time.Millisecond, Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, fmt.Errorf("robust: etcd client: %w", err)
		}
		return etcdstore.New(c, store.WithPrefix(prefix)), func() { c.Close() }, nil
	case ModeLeaseZK:
		c, _, err := zkclient.Connect([]string{addr}, 4*time.Second, log.New(io.Discard, "", 0))
		if err != nil {
			return nil, nil, fmt.Errorf("robust: ZooKeeper client: %w", err)
		}
		return zkstore.New(c.Conn, store.WithPrefix("/"+strings.TrimSuffix(prefix, ":"))), c.Close, nil
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DisableIdentity: true,
		DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	return redisstore.New(c, store.WithPrefix(prefix)), func() { c.Close() }, nil
}

// waitUnfenced waits out a new store's fence (lease.WaitUnfenced) before the members
// start, as a deploy would; a store not answering yet (ZooKeeper's client connects in
// the background) is asked again for up to 30 s.
func waitUnfenced(ctx context.Context, mode Mode, addr, prefix string) error {
	st, closeStore, err := leaseStore(mode, addr, prefix)
	if err != nil {
		return err
	}
	defer closeStore()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return lease.WaitUnfenced(ctx, st, lease.DefaultConfig())
}

// isLease reports whether mode is the lease mode, on any store.
func isLease(mode Mode) bool {
	return mode == ModeLease || mode == ModeLeaseEtcd || mode == ModeLeaseZK
}
