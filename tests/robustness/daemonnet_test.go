package robustness

import (
	"io"
	"net"
	"testing"
	"time"
)

// udpNode is a stand-in for a daemon's membership socket: one UDP socket and a TCP
// listener on one bind address, as memberlist has.
type udpNode struct {
	udp  *net.UDPConn
	tcp  net.Listener
	addr string
}

func newUDPNode(t *testing.T) *udpNode {
	t.Helper()
	for range 20 {
		a, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		ua, _ := net.ResolveUDPAddr("udp", a)
		u, err := net.ListenUDP("udp", ua)
		if err != nil {
			continue
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			u.Close()
			continue
		}
		t.Cleanup(func() { u.Close(); l.Close() })
		return &udpNode{udp: u, tcp: l, addr: a}
	}
	t.Fatal("no free port")
	return nil
}

// recv reads one datagram within wait, or returns "" (nothing came).
func (u *udpNode) recv(wait time.Duration) (string, string) {
	buf := make([]byte, 1500)
	_ = u.udp.SetReadDeadline(time.Now().Add(wait))
	n, src, err := u.udp.ReadFromUDP(buf)
	if err != nil {
		return "", ""
	}
	return string(buf[:n]), src.String()
}

func (u *udpNode) sendTo(t *testing.T, addr, msg string) {
	t.Helper()
	ua, _ := net.ResolveUDPAddr("udp", addr)
	if _, err := u.udp.WriteToUDP([]byte(msg), ua); err != nil {
		t.Fatal(err)
	}
}

// TestDaemonNet: datagrams between two nodes through their proxies arrive, with their
// answers, unless the link cuts them (each direction on its own); a delayed link holds
// them at least its delay; a stream into a node passes unless every link into it is cut.
func TestDaemonNet(t *testing.T) {
	a, b, c := newUDPNode(t), newUDPNode(t), newUDPNode(t)
	n, err := NewDaemonNet([]string{a.addr, b.addr, c.addr}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	px := n.Addrs()
	const wait = 2 * time.Second // generous: the machine is loaded; nothing is asserted about speed

	a.sendTo(t, px[1], "ping")
	msg, from := b.recv(wait)
	if msg != "ping" {
		t.Fatalf("b got %q, want ping", msg)
	}
	// b answers where the datagram came from: it comes back to a, from b's proxy.
	b.sendTo(t, from, "ack")
	if msg, from := a.recv(wait); msg != "ack" || from != px[1] {
		t.Fatalf("a got %q from %s, want ack from b's proxy %s", msg, from, px[1])
	}

	// Cut a -> b: a's datagrams to b are lost, b's to a still arrive.
	links := [][]Link{make([]Link, 3), make([]Link, 3), make([]Link, 3)}
	links[0][1].Cut = true
	n.SetLinks(links)
	a.sendTo(t, px[1], "lost")
	if msg, _ := b.recv(300 * time.Millisecond); msg != "" {
		t.Fatalf("b got %q over a cut link", msg)
	}
	b.sendTo(t, px[0], "back")
	if msg, _ := a.recv(wait); msg != "back" {
		t.Fatalf("a got %q, want back (the other direction is not cut)", msg)
	}
	// c still reaches b.
	c.sendTo(t, px[1], "third")
	if msg, _ := b.recv(wait); msg != "third" {
		t.Fatalf("b got %q from c, want third", msg)
	}

	// A stream into a (no link into it cut) passes; one into b (a link into it cut) is
	// cut, whoever sends it (streams are not told apart).
	go func() {
		s, err := a.tcp.Accept()
		if err == nil {
			_, _ = io.WriteString(s, "hi")
			s.Close()
		}
	}()
	if got := readStream(t, px[0]); got != "hi" {
		t.Fatalf("stream into a: got %q, want hi", got)
	}
	if got := readStream(t, px[1]); got != "" {
		t.Fatalf("stream into b with a link into it cut: got %q", got)
	}

	// A delay of 150 ms on c -> a: the datagram arrives, no sooner than that.
	links = [][]Link{make([]Link, 3), make([]Link, 3), make([]Link, 3)}
	links[2][0].Delay = 150 * time.Millisecond
	n.SetLinks(links)
	sent := time.Now()
	c.sendTo(t, px[0], "late")
	if msg, _ := a.recv(wait); msg != "late" {
		t.Fatalf("a got %q, want late", msg)
	}
	if d := time.Since(sent); d < 150*time.Millisecond {
		t.Fatalf("a delayed datagram arrived after %v, before its 150 ms delay", d)
	}
}

// readStream dials addr and reads what comes until it closes ("" if nothing).
func readStream(t *testing.T, addr string) string {
	t.Helper()
	s, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return ""
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(3 * time.Second))
	b, _ := io.ReadAll(s)
	return string(b)
}
