package redistest

import (
	"strings"
	"testing"
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
