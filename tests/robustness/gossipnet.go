package robustness

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Link is what a gossip member's traffic to one peer suffers: cut (every datagram lost,
// streams refused or broken), a share of its datagrams lost, or each datagram and stream
// delayed. The zero Link lets everything through at once.
type Link struct {
	Cut    bool
	Loss   float64       // the chance a datagram is lost, 0 to 1
	Delay  time.Duration // each datagram and each stream dial is held this long
	Jitter time.Duration // plus up to this, at random, for each datagram
}

// ErrCut is the error of a stream dialled, written or read over a cut link.
var ErrCut = errors.New("robust: link cut")

// FaultTransport wraps a gossip member's memberlist transport (gossip.Config's
// WrapTransport): real datagrams and streams go through the real UDP and TCP transport
// underneath, unless the Link to their peer (by address, host:port) drops, delays or cuts
// them. It acts on what the member sends: a fault on both directions of a link is set at
// both ends. Its methods are safe for concurrent use; Shutdown stops its timers and shuts
// the real transport down.
type FaultTransport struct {
	memberlist.NodeAwareTransport

	mu     sync.Mutex
	links  map[string]Link
	rng    *rand.Rand
	timers map[*time.Timer]struct{} // datagrams held back, not sent yet
	wg     sync.WaitGroup           // their sends running
	closed bool
}

var _ memberlist.NodeAwareTransport = (*FaultTransport)(nil)

// NewFaultTransport wraps t; seed seeds the losses' random draws. t may be nil and set
// (NodeAwareTransport) before the transport is used: its links can be set before.
func NewFaultTransport(t memberlist.NodeAwareTransport, seed uint64) *FaultTransport {
	return &FaultTransport{NodeAwareTransport: t, links: map[string]Link{}, rng: rand.New(rand.NewPCG(seed, 0x9055)),
		timers: map[*time.Timer]struct{}{}}
}

// SetLink sets what traffic to the peer at addr suffers from now on (the zero Link: none).
func (f *FaultTransport) SetLink(addr string, l Link) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l == (Link{}) {
		delete(f.links, addr)
		return
	}
	f.links[addr] = l
}

func (f *FaultTransport) link(addr string) Link {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.links[addr]
}

// WriteToAddress sends a datagram, or loses it (reporting it sent, as UDP would), or
// sends a copy of it later.
func (f *FaultTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	f.mu.Lock()
	l := f.links[a.Addr]
	lost := l.Cut || (l.Loss > 0 && f.rng.Float64() < l.Loss)
	d := l.Delay
	if l.Jitter > 0 {
		d += time.Duration(f.rng.Int64N(int64(l.Jitter)))
	}
	if lost || f.closed {
		f.mu.Unlock()
		return time.Now(), nil
	}
	if d <= 0 {
		f.mu.Unlock()
		return f.NodeAwareTransport.WriteToAddress(b, a)
	}
	// memberlist may reuse b once this returns.
	msg := append([]byte(nil), b...)
	f.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer f.wg.Done()
		f.mu.Lock()
		delete(f.timers, t)
		f.mu.Unlock()
		_, _ = f.NodeAwareTransport.WriteToAddress(msg, a)
	})
	f.timers[t] = struct{}{}
	f.mu.Unlock()
	return time.Now(), nil
}

// WriteTo is WriteToAddress without a node name.
func (f *FaultTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return f.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// DialAddressTimeout dials a stream after the link's delay (within timeout), or refuses
// one over a cut link; a stream dialled breaks once its link is cut.
func (f *FaultTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	l := f.link(a.Addr)
	if l.Cut {
		return nil, fmt.Errorf("dial %s: %w", a.Addr, ErrCut)
	}
	if l.Delay > 0 {
		d := min(l.Delay, timeout)
		time.Sleep(d)
		timeout -= d
		if timeout <= 0 {
			return nil, fmt.Errorf("dial %s: i/o timeout (link delayed %v)", a.Addr, l.Delay)
		}
	}
	c, err := f.NodeAwareTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return &faultConn{Conn: c, f: f, addr: a.Addr}, nil
}

// DialTimeout is DialAddressTimeout without a node name.
func (f *FaultTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return f.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// Shutdown drops the datagrams held back, waits for those being sent, and shuts the real
// transport down.
func (f *FaultTransport) Shutdown() error {
	f.mu.Lock()
	f.closed = true
	for t := range f.timers {
		if t.Stop() {
			f.wg.Done()
		}
		delete(f.timers, t)
	}
	f.mu.Unlock()
	f.wg.Wait()
	return f.NodeAwareTransport.Shutdown()
}

// faultConn is a stream the member dialled: it breaks (closed, ErrCut) once its link is
// cut.
type faultConn struct {
	net.Conn
	f    *FaultTransport
	addr string
}

func (c *faultConn) Read(b []byte) (int, error) {
	if c.f.link(c.addr).Cut {
		c.Conn.Close()
		return 0, ErrCut
	}
	return c.Conn.Read(b)
}

func (c *faultConn) Write(b []byte) (int, error) {
	if c.f.link(c.addr).Cut {
		c.Conn.Close()
		return 0, ErrCut
	}
	return c.Conn.Write(b)
}

// The control lines the runner writes to a gossip member's standard input, one per link
// it changes:
//
//	link ADDR CUT LOSS DELAY JITTER
//
// (CUT 0 or 1, LOSS 0 to 1, DELAY and JITTER in nanoseconds); the zero values heal it.
func (l Link) line(addr string) string {
	cut := 0
	if l.Cut {
		cut = 1
	}
	return fmt.Sprintf("link %s %d %g %d %d\n", addr, cut, l.Loss, int64(l.Delay), int64(l.Jitter))
}

// parseLink reads a control line.
func parseLink(s string) (string, Link, error) {
	f := strings.Fields(s)
	bad := fmt.Errorf("robust: bad control line %q", s)
	if len(f) != 6 || f[0] != "link" {
		return "", Link{}, bad
	}
	loss, err1 := strconv.ParseFloat(f[3], 64)
	d, err2 := strconv.ParseInt(f[4], 10, 64)
	j, err3 := strconv.ParseInt(f[5], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil || (f[2] != "0" && f[2] != "1") || loss < 0 || loss > 1 || d < 0 || j < 0 {
		return "", Link{}, bad
	}
	return f[1], Link{Cut: f[2] == "1", Loss: loss, Delay: time.Duration(d), Jitter: time.Duration(j)}, nil
}
