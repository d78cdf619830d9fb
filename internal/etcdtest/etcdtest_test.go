package etcdtest

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
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

// TestPauseResume: a paused etcd does not answer (a request times out); resumed, it does,
// with its data.
func TestPauseResume(t *testing.T) {
	s := New(t)
	put(t, s, `{"key":"cA==","value":"dg=="}`) // p = v
	s.Pause()
	c := &http.Client{Timeout: 300 * time.Millisecond}
	if r, err := c.Get("http://" + s.Addr() + "/health"); err == nil {
		r.Body.Close()
		t.Fatal("a paused etcd answered")
	}
	s.Resume()
	if c := count(t, s); !strings.Contains(c, `"count":"1"`) {
		t.Fatalf("after Resume: %s", c)
	}
}
