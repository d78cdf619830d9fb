package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (store.Store, func()) {
		s := store.NewMemory(nil)
		return s, s.Restart
	})
}

// TestOpenErrors: a URL Open cannot use is an ErrBadURL whose message says what to write;
// a scheme whose store is not linked names the package to import.
func TestOpenErrors(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"127.0.0.1:6379", "write redis://127.0.0.1:6379"},
		{"nonsense", "want SCHEME://"},
		{"mysql://x", `unknown scheme "mysql"`},
		{"etcd://127.0.0.1:2379", `import _ "github.com/sluicehq/sluice/store/etcd"`},
		{"zk://127.0.0.1:2181", `import _ "github.com/sluicehq/sluice/store/zk"`},
		{"redis://127.0.0.1:6379", `import _ "github.com/sluicehq/sluice/store/redis"`},
	} {
		_, err := store.Open(context.Background(), c.url)
		if !errors.Is(err, store.ErrBadURL) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%q): %v, want an ErrBadURL saying %q", c.url, err, c.want)
		}
	}
}

func TestOpenMemory(t *testing.T) {
	h, err := store.Open(context.Background(), "memory://")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.(interface{ Restart() }); !ok {
		t.Errorf("memory:// opened a %T, want a Memory", h)
	}
}

func TestHosts(t *testing.T) {
	for in, want := range map[string]string{
		"a:1,b:2":            "a:1,b:2",
		"u:p@a:1/path?x=1":   "a:1",
		"a:1?dial_timeout=1": "a:1",
	} {
		if got := store.Hosts(in); got != want {
			t.Errorf("Hosts(%q) = %q, want %q", in, got, want)
		}
	}
}
