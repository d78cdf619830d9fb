package etcdtest

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// put and get go through etcd's JSON gateway, so that this package needs no client.
func put(t *testing.T, s *Server, body string) {
	t.Helper()
	r, err := http.Post("http://"+s.Addr()+"/v3/kv/put", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("put: %s", r.Status)
	}
}

func count(t *testing.T, s *Server) string {
	t.Helper()
	r, err := http.Post("http://"+s.Addr()+"/v3/kv/range", "application/json", strings.NewReader(`{"key":"AA==","range_end":"AA==","count_only":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

func TestKillRestartWipe(t *testing.T) {
	s := New(t)
	put(t, s, `{"key":"aw==","value":"dg=="}`) // k = v
	if c := count(t, s); !strings.Contains(c, `"count":"1"`) {
		t.Fatalf("after a put: %s", c)
	}
	s.Kill()
	if _, err := http.Get("http://" + s.Addr() + "/health"); err == nil {
		t.Fatal("etcd answered after Kill")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if c := count(t, s); !strings.Contains(c, `"count":"1"`) {
		t.Fatalf("the key was lost in a restart: %s", c)
	}
	if err := s.Wipe(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if c := count(t, s); strings.Contains(c, `"count"`) {
		t.Fatalf("a key survived the wipe: %s", c)
	}
}
