package strict

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/testkit/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// TestCountKeys counts the keys of one prefix, on one Redis and across a Cluster's
// masters, ignoring the keys of another prefix and other data.
func TestCountKeys(t *testing.T) {
	ctx := context.Background()
	// A key lives until its TAT passes: one decision on an hourly limit keeps it an hour,
	// longer than any fill takes (on a 1/s limit the first keys expired while a loaded
	// machine filled the rest: 897 of 2,500 left in one CI run).
	lim := []gcra.Limit{{T: int64(time.Hour), Tau: int64(time.Hour)}}
	fill := func(t *testing.T, b *Backend, n int) {
		for i := range n {
			if _, err := b.Decide(ctx, fmt.Sprintf("k%d", i), backend.Request{Limits: lim, N: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("single", func(t *testing.T) {
		srv := redistest.New(t)
		o, _ := redisstore.ClientOptions(srv.URL(), time.Second)
		client := goredis.NewClient(o)
		defer client.Close()
		b, other := New(client, WithPrefix("a*[x]:"), WithTimeout(10*time.Second)), New(client, WithPrefix("a:"), WithTimeout(10*time.Second))
		defer b.Close()
		defer other.Close()
		fill(t, b, 2500) // more than one SCAN step
		fill(t, other, 7)
		if _, err := srv.Do("SET", "unrelated", "1"); err != nil {
			t.Fatal(err)
		}
		for i, c := range []struct {
			b    *Backend
			want int64
		}{{b, 2500}, {other, 7}} {
			if got, err := c.b.CountKeys(ctx); err != nil || got != c.want {
				t.Errorf("step %d: got %d keys (%v), want %d", i, got, err, c.want)
			}
		}
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.NewCluster(t)
		client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs()})
		defer client.Close()
		b := New(client, WithPrefix(prefix(t)), WithTimeout(10*time.Second))
		defer b.Close()
		fill(t, b, 300)
		if got, err := b.CountKeys(ctx); err != nil || got != 300 {
			t.Errorf("got %d keys (%v), want 300", got, err)
		}
	})
}

// TestUnavailableSaysWhenToRetry: while Redis is down, a failure carries the prober's
// interval as its retry hint, so that a caller does not spin.
func TestUnavailableSaysWhenToRetry(t *testing.T) {
	srv := redistest.New(t)
	o, _ := redisstore.ClientOptions(srv.URL(), 100*time.Millisecond)
	client := goredis.NewClient(o)
	defer client.Close()
	b := New(client, WithTimeout(100*time.Millisecond), WithProbeEvery(750*time.Millisecond), WithPrefix(prefix(t)))
	defer b.Close()
	srv.Kill()
	lim := []gcra.Limit{{T: int64(time.Second), Tau: int64(time.Second)}}
	for step := range 2 { // the failure that opens the breaker, then one while it is open
		_, err := b.Decide(context.Background(), "k", backend.Request{Limits: lim, N: 1})
		d, ok := backend.RetryAfter(err)
		if !errors.Is(err, backend.ErrUnavailable) || !ok || d != 750*time.Millisecond {
			t.Errorf("step %d: got %v, hint %v %v; want backend.ErrUnavailable with a hint of 750ms", step, err, d, ok)
		}
	}
}
