package redistest

import (
	"strings"
	"testing"
	"time"
)

func TestSingleKillRestart(t *testing.T) {
	s := New(t)
	if _, err := s.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Do("GET", "k"); v != "v" {
		t.Fatalf("GET k = %q", v)
	}
	s.Kill()
	if err := ping(s.Addr()); err == nil {
		t.Fatal("PING answered after Kill")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Do("GET", "k"); v != "" {
		t.Fatalf("data survived kill -9 without persistence: %q", v)
	}
}

func TestCluster(t *testing.T) {
	c := NewCluster(t)
	if len(c.Nodes) != 3 {
		t.Fatalf("%d nodes", len(c.Nodes))
	}
	nodes, err := c.Nodes[0].Do("CLUSTER", "NODES")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(nodes, "master"); n != 3 {
		t.Fatalf("%d masters: %s", n, nodes)
	}
}

// TestSentinels: the set starts with every sentinel knowing the master and the replica;
// after SENTINEL FAILOVER the sentinels name the replica, which answers as a master.
func TestSentinels(t *testing.T) {
	start := time.Now()
	s := NewSentinels(t, SentinelConfig{})
	t.Logf("set up in %v", time.Since(start))
	old, err := s.MasterAddr()
	if err != nil {
		t.Fatal(err)
	}
	if old != s.Master.Addr() {
		t.Fatalf("master at %s, want %s", old, s.Master.Addr())
	}
	if _, err := s.Master.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := s.Failover(); err != nil {
		t.Fatal(err)
	}
	addr, err := s.WaitPromoted(old, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failed over in %v", time.Since(start))
	if addr != s.Replica.Addr() {
		t.Fatalf("promoted %s, want the replica %s", addr, s.Replica.Addr())
	}
	if v, _ := s.Replica.Do("GET", "k"); v != "v" {
		t.Fatalf("GET k on the new master = %q, want v (replicated)", v)
	}
}
