package cli

import (
	"flag"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/zkclient"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/strict"
)

// storeTimeout bounds each command a lease store's client sends.
const storeTimeout = 500 * time.Millisecond

// openLeaseStore opens the lease store a URL names, its keys under prefix:
//
//	"" or memory://                       in process (nil: the caller makes a MemStore)
//	redis://[user:pass@]host:port[/db]    one Redis
//	redis-cluster://host:port,host:port   a Redis Cluster (any of its nodes)
//	redis-sentinel://host:port,host:port/MASTER[/DB]  a master found through Sentinel
//	                                      (strict.SentinelScheme)
//	etcd://host:port,host:port            an etcd cluster (any of its members)
//	zk://host:port,host:port[/path]       a ZooKeeper ensemble (records under path, or
//	                                      under the prefix made a path)
//
// The returned func closes the client.
func openLeaseStore(raw, prefix string) (lease.Store, func(), error) {
	nop := func() {}
	scheme, rest, _ := strings.Cut(raw, "://")
	opt := lease.WithRedisPrefix(prefix)
	switch scheme {
	case "", "memory":
		return nil, nop, nil
	case "redis", "rediss":
		o, err := strict.ClientOptions(raw, storeTimeout)
		if err != nil {
			return nil, nil, usagef("store %q: %v", raw, err)
		}
		c := goredis.NewClient(o)
		return lease.NewRedisStore(c, opt), func() { c.Close() }, nil
	case "redis-cluster":
		o := &goredis.ClusterOptions{Addrs: strings.Split(hostsOf(rest), ","), MaxRetries: -1,
			ContextTimeoutEnabled: true, DisableIdentity: true}
		timeouts(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout)
		c := goredis.NewClusterClient(o)
		return lease.NewRedisStore(c, opt), func() { c.Close() }, nil
	case strict.SentinelScheme:
		o, err := strict.FailoverOptions(raw, storeTimeout)
		if err != nil {
			return nil, nil, usagef("store: %v", err)
		}
		c := goredis.NewFailoverClient(o)
		return lease.NewRedisStore(c, opt), func() { c.Close() }, nil
	case "etcd":
		hosts := hostsOf(rest)
		if hosts == "" {
			return nil, nil, usagef("store %q: want etcd://HOST:PORT[,HOST:PORT]", raw)
		}
		c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(hosts, ","), DialTimeout: storeTimeout,
			Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, usagef("store %q: %v", raw, err)
		}
		return lease.NewEtcdStore(c, lease.WithEtcdPrefix(prefix)), func() { c.Close() }, nil
	case "zk":
		hosts, path, _ := strings.Cut(rest, "/")
		if hosts == "" {
			return nil, nil, usagef("store %q: want zk://HOST:PORT[,HOST:PORT][/PATH]", raw)
		}
		if path == "" {
			path = strings.ReplaceAll(strings.Trim(prefix, ":"), ":", "/")
		}
		c, events, err := zkclient.Connect(strings.Split(hosts, ","), 4*time.Second, quietZK{})
		if err != nil {
			return nil, nil, usagef("store %q: %v", raw, err)
		}
		// The first requests would fail while the client connects: wait a little for a
		// session (a store that is down is the members' fail mode's, not an error).
		deadline := time.After(2 * time.Second)
	wait:
		for {
			select {
			case e := <-events:
				if e.State == zk.StateHasSession {
					break wait
				}
			case <-deadline:
				break wait
			}
		}
		go func() { // the client blocks on a full event channel: drain it
			for range events {
			}
		}()
		return lease.NewZKStore(c.Conn, lease.WithZKPath(path)), c.Close, nil
	}
	return nil, nil, usagef("store %q: want memory://, redis://, redis-cluster://, redis-sentinel://, etcd:// or zk://", raw)
}

func timeouts(ds ...*time.Duration) {
	for _, d := range ds {
		*d = storeTimeout
	}
}

// hostsOf is the host list of a URL's rest (before any path or query).
func hostsOf(rest string) string {
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	return rest
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// quietZK drops the ZooKeeper client's log lines (each reconnection), which would
// interleave with the command's output; the store's errors say what failed.
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}
