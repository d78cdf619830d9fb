package all_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/store"
	_ "github.com/sluicehq/sluice/store/all" // every store linked, as in the daemon
)

// TestCheckReadsAsOpenDoes: where every store is linked (here, as in the daemon), Check
// refuses, without reaching anything, every URL Open refuses for its form, each with what
// to write, and takes those Open takes.
func TestCheckReadsAsOpenDoes(t *testing.T) {
	for url, want := range map[string]string{
		"http://127.0.0.1:16379":       `unknown scheme "http"`,
		"127.0.0.1:16379":              "write redis://127.0.0.1:16379",
		"redis://127.0.0.1:notaport":   "invalid port",
		"redis-sentinel://127.0.0.1:1": "no master name",
		"redis-cluster://a:1,b":        `"b" is not HOST:PORT`,
		"etcd://":                      "no host",
		"etcd://h:0":                   "from 1 to 65535",
		"zk://h:x/p":                   `port "x"`,
	} {
		err := store.Check(url)
		if err == nil || !errors.Is(err, store.ErrBadURL) || !strings.Contains(err.Error(), want) || strings.Count(err.Error(), "sluice:") > 1 {
			t.Errorf("Check(%q) = %v, want ErrBadURL saying %q once prefixed", url, err, want)
		}
		if _, oerr := store.Open(t.Context(), url); oerr == nil || oerr.Error() != err.Error() {
			t.Errorf("Open(%q) = %v, Check says %v", url, oerr, err)
		}
	}
	for _, url := range []string{"memory://", "redis://127.0.0.1:1", "rediss://u:p@h:6380/2", "redis-sentinel://a,b:26380/mymaster",
		"redis-cluster://a:1,b:2", "etcd://a:2379,b:2379", "zk://a,b:2182/sluice"} {
		if err := store.Check(url); err != nil {
			t.Errorf("Check(%q) = %v, want nil", url, err)
		}
	}
}
