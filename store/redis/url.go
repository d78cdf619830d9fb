package redis

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/rawio"
)

// SentinelScheme is the URL scheme that names a Redis master through its Sentinels:
//
//	redis-sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB][?sentinel_username=U&sentinel_password=P]
//
// HOST:PORT are sentinels (any of them; the port defaults to 26379), MASTER is the name
// they monitor the master under, USER and PASSWORD authenticate to the master (and its
// replicas), sentinel_username and sentinel_password to the sentinels.
const SentinelScheme = "redis-sentinel"

// DefaultTimeout is the time-out ClientOptions and FailoverOptions set when given none: a
// Redis that answers at all answers within it.
const DefaultTimeout = 100 * time.Millisecond

// DefaultSentinelPort is the port of a sentinel named without one.
const DefaultSentinelPort = "26379"

// FailoverOptions returns go-redis options for the Sentinel set a redis-sentinel:// URL
// names (see SentinelScheme), set as ClientOptions sets a single Redis' (no retries,
// time-outs of timeout, context deadlines honoured, raw I/O on plain connections, to
// the sentinels and to the master alike). goredis.NewFailoverClient makes of
// them a client that asks the sentinels for the master and follows it when they promote
// a replica.
func FailoverOptions(rawURL string, timeout time.Duration) (*goredis.FailoverOptions, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("sluice: bad redis url %q: %s (want %s://HOST:PORT[,HOST:PORT...]/MASTER[/DB])",
			rawURL, fmt.Sprintf(format, a...), SentinelScheme)
	}
	rest, ok := strings.CutPrefix(rawURL, SentinelScheme+"://")
	if !ok {
		return nil, bad("the scheme is not %s", SentinelScheme)
	}
	rest, rawQuery, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	o := &goredis.FailoverOptions{}
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		user, pass, _ := strings.Cut(authority[:i], ":")
		var err1, err2 error
		o.Username, err1 = url.PathUnescape(user)
		o.Password, err2 = url.PathUnescape(pass)
		if err1 != nil || err2 != nil {
			return nil, bad("user or password badly escaped")
		}
		authority = authority[i+1:]
	}
	for _, h := range strings.Split(authority, ",") {
		if h == "" {
			return nil, bad("no sentinel address")
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			if strings.Contains(err.Error(), "missing port") {
				host, port = strings.Trim(h, "[]"), DefaultSentinelPort
			} else {
				return nil, bad("sentinel %q: %v", h, err)
			}
		}
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 || host == "" {
			return nil, bad("sentinel %q: want HOST:PORT", h)
		}
		o.SentinelAddrs = append(o.SentinelAddrs, net.JoinHostPort(host, port))
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case parts[0] == "":
		return nil, bad("no master name")
	case len(parts) > 2:
		return nil, bad("path %q: want /MASTER or /MASTER/DB", path)
	case len(parts) == 2:
		db, err := strconv.Atoi(parts[1])
		if err != nil || db < 0 {
			return nil, bad("database %q: want a number", parts[1])
		}
		o.DB = db
	}
	var err error
	if o.MasterName, err = url.PathUnescape(parts[0]); err != nil {
		return nil, bad("master name badly escaped")
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, bad("query: %v", err)
	}
	for k, v := range q {
		switch k {
		case "sentinel_username":
			o.SentinelUsername = v[len(v)-1]
		case "sentinel_password":
			o.SentinelPassword = v[len(v)-1]
		default:
			return nil, bad("unknown parameter %q (known: sentinel_username, sentinel_password)", k)
		}
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	o.MaxRetries = -1
	o.DialTimeout = timeout
	o.ReadTimeout = timeout
	o.WriteTimeout = timeout
	o.PoolTimeout = timeout
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	o.Dialer = rawDialer(func() *goredis.Options {
		return &goredis.Options{DialTimeout: o.DialTimeout, TLSConfig: o.TLSConfig}
	})
	return o, nil
}

// NewClient returns a go-redis client for url, with the settings of ClientOptions: one
// Redis for redis:// and rediss://, or for redis-sentinel:// (SentinelScheme) the master
// its sentinels name, followed across failovers. It fails only on a bad URL; it does not
// connect.
func NewClient(rawURL string, timeout time.Duration) (*goredis.Client, error) {
	if strings.HasPrefix(rawURL, SentinelScheme+"://") {
		o, err := FailoverOptions(rawURL, timeout)
		if err != nil {
			return nil, err
		}
		return goredis.NewFailoverClient(o), nil
	}
	o, err := ClientOptions(rawURL, timeout)
	if err != nil {
		return nil, err
	}
	return goredis.NewClient(o), nil
}

// ClientOptions returns go-redis options for url (redis://[user:pass@]host:port[/db],
// or rediss://) set as the backend wants them: no retries (a retried script may be
// charged twice, and retries pile up while Redis is down), dial, read and write
// time-outs of timeout, context deadlines honoured, and go-redis' own dialer with raw
// I/O on its plain TCP and Unix connections (see rawDialer).
func ClientOptions(url string, timeout time.Duration) (*goredis.Options, error) {
	o, err := goredis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("sluice: bad redis url: %w", err)
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	o.MaxRetries = -1
	o.DialTimeout = timeout
	o.ReadTimeout = timeout
	o.WriteTimeout = timeout
	o.PoolTimeout = timeout
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	o.Dialer = rawDialer(func() *goredis.Options { return o })
	return o, nil
}

// rawDialer is go-redis' own dialer (goredis.NewDialer: the dial time-out, TCP
// keep-alives, TLS) for the options opts returns when it dials. So settings changed after
// the dialer was made (a TLSConfig added) still apply. The plain TCP and Unix connections
// it makes do their reads and writes as raw system calls, without the Go scheduler's
// bookkeeping of a call that might block: their descriptors never block. A TLS connection
// is left as go-redis made it. SLUICE_RAW_IO=off turns raw I/O off. docs/strict.md,
// "Throughput: batches" ("Raw I/O"), says what the bookkeeping costs on a virtual machine.
func rawDialer(opts func() *goredis.Options) rawio.Dial {
	return rawio.Dialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		return goredis.NewDialer(opts())(ctx, network, addr)
	})
}
