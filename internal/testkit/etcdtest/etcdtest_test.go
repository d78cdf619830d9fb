package etcdtest

import (
	"io"
	"net/http"
	"strconv"
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

// TestSnapshotRewind: the data snapshotted comes back after Rewind and Restart, the keys
// written since are gone, and the revision goes back with them.
func TestSnapshotRewind(t *testing.T) {
	s := New(t)
	put(t, s, `{"key":"cg==","value":"dg=="}`) // r = v
	start := time.Now()
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot taken (the server paused) in %v", time.Since(start))
	before := revision(t, s)
	put(t, s, `{"key":"cw==","value":"dg=="}`) // s = v
	put(t, s, `{"key":"dA==","value":"dg=="}`) // t = v
	if c := count(t, s); !strings.Contains(c, `"count":"3"`) {
		t.Fatalf("after three puts: %s", c)
	}
	if err := s.Rewind(snap); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if c := count(t, s); !strings.Contains(c, `"count":"1"`) {
		t.Fatalf("after the rewind, want the one key of the snapshot: %s", c)
	}
	if after := revision(t, s); after != before {
		t.Fatalf("revision %d after the rewind, want the snapshot's %d", after, before)
	}
}

// revision is the store's current revision.
func revision(t *testing.T, s *Server) int64 {
	t.Helper()
	c := count(t, s)
	i := strings.Index(c, `"revision":"`)
	if i < 0 {
		t.Fatalf("no revision in %s", c)
	}
	rest := c[i+len(`"revision":"`):]
	n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, '"')], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
