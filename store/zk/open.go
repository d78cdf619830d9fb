package zk

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	gozk "github.com/go-zookeeper/zk"

	"github.com/sluicehq/sluice/internal/zkclient"
	"github.com/sluicehq/sluice/store"
)

func init() {
	store.Register(open, "zk")
	store.RegisterParser(parse, "zk")
}

// parse reads a URL as open does, making no client.
func parse(raw string) error {
	_, rest, _ := strings.Cut(raw, "://")
	hosts, _, _ := strings.Cut(rest, "/")
	// The client gives a host without a port ZooKeeper's, 2181.
	withPorts := strings.Split(hosts, ",")
	for i, h := range withPorts {
		if _, _, err := net.SplitHostPort(h); err != nil && h != "" && !strings.Contains(h, ":") {
			withPorts[i] = net.JoinHostPort(h, "2181")
		}
	}
	return store.CheckHosts(raw, strings.Join(withPorts, ","), "zk://HOST[:PORT][,HOST[:PORT]][/PATH]")
}

// SessionTimeout is the ZooKeeper session time-out of the clients store.Open makes.
const SessionTimeout = 4 * time.Second

// handle is a Store that owns its client.
type handle struct {
	*Store
	close func()
}

func (h handle) Close() error { h.close(); return nil }

// open opens a store for store.Open: zk://HOST:PORT[,HOST:PORT][/PATH], the records under
// PATH (or under cfg.Prefix made a path). It waits up to two seconds (or ctx's end) for a
// session, so that the first requests do not fail while the client connects; a store that
// is down by then is not an error (its members' fail mode answers).
func open(ctx context.Context, raw string, cfg store.Config) (store.Handle, error) {
	_, rest, _ := strings.Cut(raw, "://")
	hosts, path, _ := strings.Cut(rest, "/")
	if path != "" {
		cfg.Prefix = path
	}
	c, events, err := zkclient.Connect(strings.Split(hosts, ","), SessionTimeout, quiet{})
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", store.ErrBadURL, raw, err)
	}
	deadline := time.NewTimer(2 * time.Second)
	defer deadline.Stop()
wait:
	for {
		select {
		case e := <-events:
			if e.State == gozk.StateHasSession {
				break wait
			}
		case <-deadline.C:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	go func() { // the client blocks on a full event channel: drain it until it closes
		for range events {
		}
	}()
	return handle{New(c.Conn, store.WithPrefix(cfg.Prefix), store.WithNow(cfg.Now)), c.Close}, nil
}

// quiet drops the ZooKeeper client's log lines (each reconnection); the store's errors
// say what failed.
type quiet struct{}

func (quiet) Printf(string, ...any) {}
