package redis

import (
	"slices"
	"strings"
	"testing"
	"time"
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
