//go:build linux && !msan && !asan

package strict

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/rawio"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// TestDialersRawIO: the clients ClientOptions and FailoverOptions make dial plain
// connections that do raw I/O (and a backend made by Dial decides through them), and a
// TLS connection as go-redis makes it, even when the TLS configuration is set after the
// options were made: the dialer must never send in plain text what go-redis would have
// encrypted.
func TestDialersRawIO(t *testing.T) {
	ctx := context.Background()
	o, err := redisstore.ClientOptions(shared.URL(), DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	c, err := o.Dialer(ctx, "tcp", shared.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, ok := c.(*rawio.Conn); !ok {
		t.Fatalf("ClientOptions' dialer made a %T, want a *rawio.Conn", c)
	}
	b, err := dialRedis(ctx, shared.URL(), WithPrefix(prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	slow := gcra.Limit{T: int64(time.Second), Tau: int64(time.Second)} // 1/s, burst 1
	if ok, err := b.AllowOne(ctx, "k", slow); !ok || err != nil {
		t.Fatalf("first allowance through raw I/O: %v, %v", ok, err)
	}
	if ok, err := b.AllowOne(ctx, "k", slow); ok || err != nil {
		t.Fatalf("second allowance (burst 1) through raw I/O: %v, %v", ok, err)
	}

	// A TLS server: the dialers must hand it a TLS connection (the handshake succeeds).
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes end unfinished
	srv.StartTLS()
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")
	insecure := &tls.Config{InsecureSkipVerify: true}
	tlsDial := func(name string, dial func(context.Context, string, string) (net.Conn, error)) {
		t.Helper()
		c, err := dial(ctx, "tcp", addr)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		defer c.Close()
		tc, ok := c.(*tls.Conn)
		if !ok {
			t.Fatalf("%s: dialled a %T to a TLS server, want a *tls.Conn", name, c)
		}
		if err := tc.HandshakeContext(ctx); err != nil {
			t.Fatalf("%s: handshake: %v", name, err)
		}
	}
	o, err = redisstore.ClientOptions("rediss://"+addr, redisstore.DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	o.TLSConfig = insecure // after the dialer was made
	tlsDial("rediss://", o.Dialer)
	o, err = redisstore.ClientOptions("redis://"+addr, redisstore.DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	o.TLSConfig = insecure
	tlsDial("redis:// with a TLSConfig added", o.Dialer)
	fo, err := redisstore.FailoverOptions(redisstore.SentinelScheme+"://"+addr+"/mymaster", redisstore.DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	fo.TLSConfig = insecure
	tlsDial("redis-sentinel:// with a TLSConfig added", fo.Dialer)
}
