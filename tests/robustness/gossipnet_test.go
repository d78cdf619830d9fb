package robustness

import (
	"errors"
	"io"
	"log"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// netTransport is memberlist's real UDP and TCP transport on a free loopback port.
func netTransport(t *testing.T) *memberlist.NetTransport {
	t.Helper()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	return nt
}

func addrOf(nt *memberlist.NetTransport) string {
	return "127.0.0.1:" + strconv.Itoa(nt.GetAutoBindPort())
}

// next is the next datagram the receiver gets (10 s at most: a loose bound).
func next(t *testing.T, rx *memberlist.NetTransport) *memberlist.Packet {
	t.Helper()
	select {
	case p := <-rx.PacketCh():
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no datagram within 10 s")
		return nil
	}
}

// TestFaultTransport: real datagrams and streams between two of memberlist's UDP and TCP
// transports on loopback, through a FaultTransport at the sender, as its links say.
func TestFaultTransport(t *testing.T) {
	rx := netTransport(t)
	defer rx.Shutdown()
	ft := NewFaultTransport(netTransport(t), 1)
	to := addrOf(rx)
	send := func(s string) {
		t.Helper()
		if _, err := ft.WriteTo([]byte(s), to); err != nil {
			t.Fatal(err)
		}
	}

	send("plain")
	if p := next(t, rx); string(p.Buf) != "plain" {
		t.Fatalf("got %q, want the datagram through an untouched link", p.Buf)
	}

	// Cut: the datagram is lost at the sender, so the next one to arrive is the one sent
	// after the link healed.
	ft.SetLink(to, Link{Cut: true})
	send("lost")
	ft.SetLink(to, Link{})
	send("healed")
	if p := next(t, rx); string(p.Buf) != "healed" {
		t.Fatalf("got %q first, want %q (the one sent over the cut link lost)", p.Buf, "healed")
	}

	// Loss: about half of 400 lost (the count between 100 and 300 fails once in 10^23).
	ft.SetLink(to, Link{Loss: 0.5})
	for range 400 {
		send("maybe")
	}
	ft.SetLink(to, Link{})
	send("end")
	got := 0
	for p := next(t, rx); string(p.Buf) != "end"; p = next(t, rx) {
		got++
	}
	if got < 100 || got > 300 {
		t.Fatalf("%d of 400 datagrams arrived at 50%% loss, want 100 to 300", got)
	}

	// Delay: a datagram held 150 ms arrives no sooner, after one sent later without delay.
	ft.SetLink(to, Link{Delay: 150 * time.Millisecond})
	sent := time.Now()
	send("late")
	ft.SetLink(to, Link{})
	send("early")
	if p := next(t, rx); string(p.Buf) != "early" {
		t.Fatalf("got %q first, want the datagram that was not held back", p.Buf)
	}
	if p := next(t, rx); string(p.Buf) != "late" || p.Timestamp.Sub(sent) < 150*time.Millisecond {
		t.Fatalf("got %q %v after it was sent, want %q no sooner than 150ms", p.Buf, p.Timestamp.Sub(sent), "late")
	}

	// Streams: refused over a cut link; one dialled before the cut breaks with it.
	c, err := ft.DialTimeout(to, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	in := <-rx.StreamCh()
	defer in.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	ft.SetLink(to, Link{Cut: true})
	if _, err := c.Write([]byte("y")); !errors.Is(err, ErrCut) {
		t.Fatalf("write over a cut link: got %v, want ErrCut", err)
	}
	if _, err := ft.DialTimeout(to, time.Second); !errors.Is(err, ErrCut) {
		t.Fatalf("dial over a cut link: got %v, want ErrCut", err)
	}

	// Shutdown drops what is held back: the datagram never arrives, and no timer or
	// goroutine is left (the package's leak check).
	ft.SetLink(to, Link{Delay: time.Hour})
	send("never")
	if err := ft.Shutdown(); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-rx.PacketCh():
		t.Fatalf("got %q after Shutdown, want nothing", p.Buf)
	default:
	}
}

// TestLinkLines: the runner's control lines round-trip, and a bad one is an error.
func TestLinkLines(t *testing.T) {
	for _, l := range []Link{{}, {Cut: true}, {Loss: 0.35}, {Delay: 120 * time.Millisecond, Jitter: 7 * time.Millisecond}} {
		addr, got, err := parseLink(l.line("127.0.0.1:7946"))
		if err != nil || addr != "127.0.0.1:7946" || got != l {
			t.Fatalf("%+v: got %s %+v, %v", l, addr, got, err)
		}
	}
	for _, bad := range []string{"", "link", "link a 2 0 0 0", "link a 0 1.5 0 0", "link a 0 0 -1 0", "link a 0 0 0 x", "cut a 0 0 0 0"} {
		if _, _, err := parseLink(bad); err == nil {
			t.Fatalf("%q: no error", bad)
		}
	}
}
