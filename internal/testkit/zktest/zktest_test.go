package zktest

import (
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
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

// TestSnapshotRewind: the znodes snapshotted come back after Rewind and Restart, with
// their data and zxids; those made since are gone.
func TestSnapshotRewind(t *testing.T) {
	s := New(t)
	c := Conn(t, s.Addr())
	if _, err := c.Create("/a", []byte("1"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	_, old, err := c.Get("/a")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot taken (the server paused) in %v", time.Since(start))
	if _, err := c.Set("/a", []byte("2"), -1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create("/b", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if err := s.Rewind(snap); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	c2 := Conn(t, s.Addr())
	data, st, err := c2.Get("/a")
	if err != nil || string(data) != "1" || st.Mzxid != old.Mzxid {
		t.Fatalf("/a after the rewind: %q (mzxid %d) %v, want \"1\" (mzxid %d)", data, st.Mzxid, err, old.Mzxid)
	}
	if ok, _, err := c2.Exists("/b"); ok || err != nil {
		t.Fatalf("/b after the rewind: exists %v, %v", ok, err)
	}
}
