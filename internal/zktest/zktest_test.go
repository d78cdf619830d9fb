package zktest

import (
	"testing"
	"time"
)

func TestKillRestartWipe(t *testing.T) {
	start := time.Now()
	s := New(t)
	t.Logf("started in %v", time.Since(start))
	if !ruok(s.Addr()) {
		t.Fatal("no imok after New")
	}
	s.Kill()
	if ruok(s.Addr()) {
		t.Fatal("imok after Kill")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := s.Wipe(); err != nil {
		t.Fatal(err)
	}
	if ruok(s.Addr()) {
		t.Fatal("imok after Wipe")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
}

// TestPauseResume: a paused ZooKeeper does not answer ruok; resumed, it does.
func TestPauseResume(t *testing.T) {
	s := New(t)
	s.Pause()
	if ruok(s.Addr()) {
		t.Fatal("imok from a paused server")
	}
	s.Resume()
	if !ruok(s.Addr()) {
		t.Fatal("no imok after Resume")
	}
}
