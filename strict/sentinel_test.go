package strict

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/redistest"
)

func TestFailoverOptions(t *testing.T) {
	for i, c := range []struct {
		url                    string
		addrs                  []string
		master, user, pass     string
		db                     int
		sentinelUser, sentinel string
		err                    string
	}{
		{url: "redis-sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster", addrs: []string{"10.0.0.1:26379", "10.0.0.2:26380"}, master: "mymaster"},
		{url: "redis-sentinel://s1,s2:1/m/3", addrs: []string{"s1:26379", "s2:1"}, master: "m", db: 3},
		{url: "redis-sentinel://u:p%40ss@[::1]:5000/m", addrs: []string{"[::1]:5000"}, master: "m", user: "u", pass: "p@ss"},
		{url: "redis-sentinel://:pw@h:1/m?sentinel_password=sp&sentinel_username=su", addrs: []string{"h:1"}, master: "m", pass: "pw", sentinelUser: "su", sentinel: "sp"},
		{url: "redis-sentinel://h:1/", err: "no master name"},
		{url: "redis-sentinel://h:1", err: "no master name"},
		{url: "redis-sentinel:///m", err: "no sentinel address"},
		{url: "redis-sentinel://h:1,,h:2/m", err: "no sentinel address"},
		{url: "redis-sentinel://h:x/m", err: "want HOST:PORT"},
		{url: "redis-sentinel://h:70000/m", err: "want HOST:PORT"},
		{url: "redis-sentinel://h:1/m/x", err: "database"},
		{url: "redis-sentinel://h:1/m/1/2", err: "want /MASTER or /MASTER/DB"},
		{url: "redis-sentinel://h:1/m?db=2", err: `unknown parameter "db"`},
		{url: "redis://h:1/m", err: "scheme"},
	} {
		o, err := FailoverOptions(c.url, 0)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("step %d: %s: got %v, want an error with %q", i, c.url, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("step %d: %s: %v", i, c.url, err)
			continue
		}
		if !slices.Equal(o.SentinelAddrs, c.addrs) || o.MasterName != c.master || o.Username != c.user || o.Password != c.pass ||
			o.DB != c.db || o.SentinelUsername != c.sentinelUser || o.SentinelPassword != c.sentinel {
			t.Errorf("step %d: %s: got %+v", i, c.url, o)
		}
		if o.MaxRetries != -1 || !o.ContextTimeoutEnabled || o.ReadTimeout != DefaultTimeout {
			t.Errorf("step %d: %s: retries %d, context deadlines %v, read time-out %v: not the backend's settings",
				i, c.url, o.MaxRetries, o.ContextTimeoutEnabled, o.ReadTimeout)
		}
	}
}

func FuzzFailoverOptions(f *testing.F) {
	for _, s := range []string{"redis-sentinel://a:1,b:2/m", "redis-sentinel://u:p@[::1]:1/m/2?sentinel_password=x", "redis-sentinel://"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, url string) {
		o, err := FailoverOptions(url, time.Second)
		if err != nil {
			return
		}
		if o.MasterName == "" || len(o.SentinelAddrs) == 0 {
			t.Fatalf("%q: accepted with master %q and sentinels %v", url, o.MasterName, o.SentinelAddrs)
		}
	})
}

// TestSentinelFailover: a backend opened on a redis-sentinel:// URL decides on the master;
// after SENTINEL FAILOVER it follows the promoted replica by itself, where the key's state
// (replicated, in the same format) is found and the script, which replicas do not cache,
// is loaded again after NOSCRIPT.
func TestSentinelFailover(t *testing.T) {
	set := redistest.NewSentinels(t, redistest.SentinelConfig{})
	b, err := Dial(ctx, set.URL(), WithPrefix(prefix(t)), WithTimeout(2*time.Second), WithProbeEvery(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.client.(*goredis.Client); !ok {
		t.Fatalf("client %T, want the failover *goredis.Client (one script call per batch)", b.client)
	}
	ls := []gcra.Limit{{T: int64(time.Hour), Tau: int64(99 * time.Hour)}} // 1/h burst=100
	var first int64
	for i := range 5 {
		g, err := b.Decide(ctx, "k", backend.Request{Limits: ls, N: 1})
		if i == 0 {
			first = g.Remaining
		}
		if err != nil || !g.Allowed || g.Remaining != first-int64(i) {
			t.Fatalf("step %d, before the failover: %+v %v", i, g.Result, err)
		}
	}
	replica := newClient(t, set.Replica.URL())
	sha := goredis.NewScript(scriptSource).Hash()
	if ok, err := replica.ScriptExists(ctx, sha).Result(); err != nil || ok[0] {
		t.Fatalf("SCRIPT EXISTS on the replica: %v %v, want false (replicas do not cache scripts)", ok, err)
	}
	if got, _ := set.Replica.Do("GET", b.KeyName("k")); !strings.HasPrefix(got, "1 ") {
		t.Fatalf("the replica holds %q at %s, want the key's state", got, b.KeyName("k"))
	}
	old := set.Master.Addr()
	start := time.Now()
	if err := set.Failover(); err != nil {
		t.Fatal(err)
	}
	addr, err := set.WaitPromoted(old, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if addr != set.Replica.Addr() {
		t.Fatalf("promoted %s, want the replica %s", addr, set.Replica.Addr())
	}
	t.Logf("promoted in %v", time.Since(start))
	start = time.Now()
	// Decide until a grant comes: calls may fail (READONLY from the demoted master, a
	// connection closed when the client learns of the new master), which opens the
	// breaker until a probe answers.
	var g backend.Grant
	failures := 0
	for deadline := time.Now().Add(20 * time.Second); ; {
		g, err = b.Decide(ctx, "k", backend.Request{Limits: ls, N: 1})
		if err == nil {
			break
		}
		if !errors.Is(err, ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("after the failover: %v", err)
		}
		failures++
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("first grant %v after the sentinels named the new master, %d calls failed meanwhile", time.Since(start), failures)
	// The grant was decided by the new master on the replicated state: 5 taken before
	// (a state lost or misread would count from the first again).
	if !g.Allowed || g.Remaining != first-5 {
		t.Fatalf("first grant after the failover: %+v, want allowed with %d remaining", g.Result, first-5)
	}
	for i := range 3 {
		g, err := b.Decide(ctx, "k", backend.Request{Limits: ls, N: 1})
		if err != nil || !g.Allowed || g.Remaining != first-6-int64(i) {
			t.Fatalf("step %d, after the failover: %+v %v", i, g.Result, err)
		}
	}
	if ok, err := replica.ScriptExists(ctx, sha).Result(); err != nil || !ok[0] {
		t.Fatalf("SCRIPT EXISTS on the new master: %v %v, want true (loaded after NOSCRIPT)", ok, err)
	}
	if got, _ := set.Replica.Do("GET", b.KeyName("k")); !strings.HasPrefix(got, "1 ") {
		t.Fatalf("the new master holds %q", got)
	}
}
