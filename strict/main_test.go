package strict

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// shared is the redis-server most tests use; tests that kill a server start their own.
var shared *redistest.Server

// TestMain starts the shared redis-server (failing, never skipping, when redis-server is
// not installed), runs the worker of the multi-process tests when asked to, and fails the
// package if any test leaves a goroutine behind.
func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(workerMain())
	}
	srv, err := redistest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the redis tests need a real redis-server:", err)
		os.Exit(1)
	}
	shared = srv
	code := m.Run()
	srv.Close()
	if code == 0 {
		if err := waitNoLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// waitNoLeaks is goleak's check, given time for go-redis' own redial goroutine, which
// ends within a second of its pool's Close.
func waitNoLeaks() error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := goleak.Find()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		if !strings.Contains(err.Error(), "tryDial") {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newClient returns a client of srv set as the backend wants (no retries), with a
// generous time-out for the race detector on 2 cores; the test closes it.
func newClient(t testing.TB, url string) *goredis.Client {
	t.Helper()
	o, err := redisstore.ClientOptions(url, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// prefix returns a key prefix unique to the test, so tests sharing a server never share
// keys.
func prefix(t testing.TB) string {
	return fmt.Sprintf("t:%s:%d:", strings.ReplaceAll(t.Name(), "/", "."), time.Now().UnixNano())
}
