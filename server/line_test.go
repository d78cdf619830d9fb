package server

// Tests of the line protocol's connections: bad input, a client that never reads, the
// bounds on connections and idle time. The helpers (start, dial, exchange) are in
// server_test.go.

import (
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/clock"
)

func TestBadInputHasDefinedAnswers(t *testing.T) {
	clk := clock.NewVirtual()
	s := start(t, testConfig("api=10/s", "~x=1/h"), WithClock(clk))
	c := dial(t, s)
	steps := []struct{ in, want string }{
		{"\n", "NO\n"},                 // empty tag
		{"\xff\xfe\n", "NO\n"},         // not UTF-8
		{"a\x00b\n", "NO\n"},           // a control character
		{"api\r\n", "OK\n"},            // CRLF: the \r is dropped
		{"~~x\n", "OK\n"},              // an escaped tag that begins with ~ ...
		{"~~x\n", "NO\n"},              // ... has its own rule (1/h)
		{"~n=3 api\n", "OK\n"},         // a weight
		{"~v api\n", "OK r=5 t=500\n"}, // details
		{"~n=20,v api\n", "ER cost exceeds the burst: it can never be granted\n"},
		{"~w=1000,v api\n", "OK d=0 r=4 t=600\n"},
		{"~n=x api\n", "ER bad options: want ~OPTS TAG with OPTS such as n=5,v or w=500 or p=1000 or c=critical\n"},
		{"~v\n", "ER no tag after the options\n"},
		{"~v \n", "ER bad tag: empty, not UTF-8, or with control characters\n"},
		{"~ api\n", "ER bad options: want ~OPTS TAG with OPTS such as n=5,v or w=500 or p=1000 or c=critical\n"},
		{"~p=2000 api\n", "OK\n"},
		{"api\n", "NO\n"}, // penalized for 2 s
	}
	for i, st := range steps {
		if got := exchange(t, c, st.in, len(st.want)); got != st.want {
			t.Errorf("step %d %q: got %q, want %q", i, st.in, got, st.want)
		}
	}
	// An over-long line is answered NO and the connection closed.
	c2 := dial(t, s)
	c2.Write([]byte(strings.Repeat("x", 5000) + "\n"))
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	all, _ := io.ReadAll(c2)
	if string(all) != "NO\n" {
		t.Errorf("over-long line: got %q, want \"NO\\n\" then close", all)
	}
	// A last line with no newline is not a query: nothing is answered, the connection ends.
	c3 := dial(t, s)
	c3.Write([]byte("api\napi"))
	c3.(*net.TCPConn).CloseWrite()
	c3.SetReadDeadline(time.Now().Add(5 * time.Second))
	all, _ = io.ReadAll(c3)
	if len(all) != 3 {
		t.Errorf("a final line without newline: got %q, want one answer", all)
	}
	bad := testutil.ToFloat64(s.m.badInput.WithLabelValues("bad_tag")) + testutil.ToFloat64(s.m.badInput.WithLabelValues("too_long"))
	if bad != 4 {
		t.Errorf("bad input counted %v, want 4", bad)
	}
}

// TestClientThatNeverReads: a client that sends and never reads is dropped once its
// answers fill the buffer; other clients are unaffected.
func TestClientThatNeverReads(t *testing.T) {
	cfg := testConfig("api=1000000/s")
	cfg.MaxPending = 4096
	cfg.WriteTimeout = 200 * 1e6
	s := start(t, cfg)
	// A small receive window, so the answers back up quickly.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return serr
	}}
	hog, err := d.Dial("tcp", s.LineAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close()
	done := make(chan error, 1)
	go func() {
		chunk := []byte(strings.Repeat("api\n", 4096))
		for {
			hog.SetWriteDeadline(time.Now().Add(60 * time.Second))
			if _, err := hog.Write(chunk); err != nil {
				done <- err
				return
			}
		}
	}()
	good := dial(t, s)
	if got := exchange(t, good, "api\n", 3); got != "OK\n" {
		t.Errorf("another client: %q", got)
	}
	// Liveness guards, not speed bounds: alone this takes 5 s under -race, and more than
	// 30 s with two make test runs on the machine (the hog must push megabytes of queries
	// through before the buffers fill).
	deadline := time.Now().Add(120 * time.Second)
	for testutil.ToFloat64(s.m.connsDropped.WithLabelValues("not_reading")) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("a client that never reads was never dropped")
		}
		time.Sleep(10 * time.Millisecond) // wait for the condition
	}
	select {
	case <-done: // the hog's writes fail once it is dropped
	case <-time.After(120 * time.Second):
		t.Fatal("the dropped client can still write")
	}
	if got := exchange(t, good, "api\n", 3); got != "OK\n" {
		t.Errorf("another client after the drop: %q", got)
	}
}

func TestMaxConnectionsAndIdleTimeout(t *testing.T) {
	cfg := testConfig("api=10/s")
	cfg.MaxConnections = 2
	cfg.IdleTimeout = 300 * 1e6
	s := start(t, cfg)
	a, b := dial(t, s), dial(t, s)
	exchange(t, a, "api\n", 3)
	exchange(t, b, "api\n", 3)
	c := dial(t, s)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("a third connection past max_connections 2 was served (%d bytes)", n)
	}
	// Idle connections are closed.
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := a.Read(make([]byte, 1)); err == nil {
		t.Errorf("an idle connection was not closed")
	}
}

// TestLinePriorities: c=CLASS on the line protocol. On api=10/s burst=10 (virtual time,
// nothing refills), a critical query takes a permit; a sheddable flood then leaves 4 of the
// 9 left (40% of the burst, issue [24]), which critical queries take; a bad class is an ER.
func TestLinePriorities(t *testing.T) {
	clk := clock.NewVirtual()
	s := start(t, testConfig("api=10/s"), WithClock(clk))
	c := dial(t, s)
	if got := exchange(t, c, "~c=critical api\n", 3); got != "OK\n" {
		t.Fatalf("critical: %q", got)
	}
	shed := 0
	for range 20 {
		if exchange(t, c, "~c=sheddable api\n", 3) == "OK\n" {
			shed++
		}
	}
	crit := 0
	for range 6 {
		if exchange(t, c, "~c=critical api\n", 3) == "OK\n" {
			crit++
		}
	}
	if shed != 5 || crit != 4 {
		t.Errorf("sheddable flood granted %d, critical after it %d; want 5 and the 4 kept", shed, crit)
	}
	want := "ER bad options: want ~OPTS TAG with OPTS such as n=5,v or w=500 or p=1000 or c=critical\n"
	if got := exchange(t, c, "~c=urgent api\n", len(want)); got != want {
		t.Errorf("a bad class: %q", got)
	}
}
