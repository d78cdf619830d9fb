package robustness

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// DaemonNet is the network between gossip daemons (`sluice serve --backend gossip`),
// which have no transport hook: each daemon binds its membership's UDP and TCP listeners
// to its own address (--gossip-bind) and advertises its proxy's (--gossip-advertise),
// where its peers reach it. A proxy forwards to its daemon what it receives, and drops,
// delays or cuts it as the Link from the sender to the daemon says: the same vocabulary as
// FaultTransport's.
//
// Datagrams are told apart by sender: memberlist sends every datagram of a daemon from
// its one UDP socket, so the source address is the sender's bind address. Each sender's
// datagrams reach the daemon from a socket of the proxy's own for that sender (answers to
// it come back through the proxy, under the link back). TCP streams come from ephemeral
// ports and cannot be told apart: a stream into a daemon suffers the worst of what the
// links into it suffer (a cut of one link into it cuts every stream into it, the third
// daemon's too; a loss does not touch streams). Memberlist's streams carry its state
// syncs and probe fallbacks; the gossip reports and the probes are datagrams.
//
// Its methods are safe for concurrent use. Close stops every proxy and its goroutines.
type DaemonNet struct {
	binds   []string // each slot's daemon's bind address
	proxies []*daemonProxy

	mu     sync.Mutex
	links  [][]Link // links[i][j]: what slot i's traffic to slot j suffers
	rng    *rand.Rand
	timers map[*time.Timer]struct{}
	closed bool
	wg     sync.WaitGroup
}

type daemonProxy struct {
	slot int
	udp  *net.UDPConn
	tcp  net.Listener
	mu   sync.Mutex
	up   map[string]*net.UDPConn // by sender: the socket its datagrams reach the daemon from
	tcps map[net.Conn]struct{}
}

// NewDaemonNet starts a proxy (UDP and TCP on one loopback port) for each of binds, the
// daemons' bind addresses, in slot order; seed seeds the losses' random draws.
func NewDaemonNet(binds []string, seed uint64) (*DaemonNet, error) {
	n := &DaemonNet{binds: binds, rng: rand.New(rand.NewPCG(seed, 0xdae)), timers: map[*time.Timer]struct{}{}}
	n.links = make([][]Link, len(binds))
	for i := range binds {
		n.links[i] = make([]Link, len(binds))
	}
	for slot := range binds {
		p, err := n.listen(slot)
		if err != nil {
			n.Close()
			return nil, err
		}
		n.proxies = append(n.proxies, p)
	}
	for _, p := range n.proxies {
		n.wg.Add(2)
		go n.serveUDP(p)
		go n.serveTCP(p)
	}
	return n, nil
}

// listen opens slot's proxy on a loopback port free for both UDP and TCP.
func (n *DaemonNet) listen(slot int) (*daemonProxy, error) {
	var last error
	for range 20 {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		ua, _ := net.ResolveUDPAddr("udp", a)
		u, err := net.ListenUDP("udp", ua)
		if err != nil {
			last = err
			continue
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			u.Close()
			last = err
			continue
		}
		return &daemonProxy{slot: slot, udp: u, tcp: l, up: map[string]*net.UDPConn{}, tcps: map[net.Conn]struct{}{}}, nil
	}
	return nil, last
}

// Addrs returns each slot's proxy address: the one its daemon advertises.
func (n *DaemonNet) Addrs() []string {
	out := make([]string, len(n.proxies))
	for i, p := range n.proxies {
		out[i] = p.udp.LocalAddr().String()
	}
	return out
}

// SetLinks sets what each slot's traffic to each other suffers from now on
// (links[i][j], as runner.links computes them). Streams already open go on.
func (n *DaemonNet) SetLinks(links [][]Link) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := range n.links {
		copy(n.links[i], links[i])
	}
}

// slotOf is the slot whose daemon binds addr, or -1.
func (n *DaemonNet) slotOf(addr string) int {
	for i, b := range n.binds {
		if b == addr {
			return i
		}
	}
	return -1
}

// send sends b (a copy) with w, or loses it, or sends it later, as the link from slot
// from to slot to says (a sender of no slot: at once).
func (n *DaemonNet) send(from, to int, b []byte, w func([]byte)) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	var l Link
	if from >= 0 && to >= 0 {
		l = n.links[from][to]
	}
	lost := l.Cut || (l.Loss > 0 && n.rng.Float64() < l.Loss)
	d := l.Delay
	if l.Jitter > 0 {
		d += time.Duration(n.rng.Int64N(int64(l.Jitter)))
	}
	if lost {
		n.mu.Unlock()
		return
	}
	if d <= 0 {
		n.mu.Unlock()
		w(b)
		return
	}
	c := append([]byte(nil), b...)
	var t *time.Timer
	n.wg.Add(1)
	t = time.AfterFunc(d, func() {
		defer n.wg.Done()
		n.mu.Lock()
		_, live := n.timers[t]
		delete(n.timers, t)
		n.mu.Unlock()
		if live {
			w(c)
		}
	})
	n.timers[t] = struct{}{}
	n.mu.Unlock()
}

// serveUDP forwards the datagrams sent to p's daemon.
func (n *DaemonNet) serveUDP(p *daemonProxy) {
	defer n.wg.Done()
	target, _ := net.ResolveUDPAddr("udp", n.binds[p.slot])
	buf := make([]byte, 64<<10)
	for {
		k, src, err := p.udp.ReadFromUDP(buf)
		if err != nil {
			return
		}
		up, err := n.upstream(p, src, target)
		if err != nil {
			continue
		}
		n.send(n.slotOf(src.String()), p.slot, buf[:k], func(b []byte) { _, _ = up.Write(b) })
	}
}

// upstream is the socket src's datagrams reach p's daemon from, made at its first, with
// the goroutine that carries the daemon's answers on it back to src.
func (n *DaemonNet) upstream(p *daemonProxy, src, target *net.UDPAddr) (*net.UDPConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if up := p.up[src.String()]; up != nil {
		return up, nil
	}
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return nil, net.ErrClosed
	}
	up, err := net.DialUDP("udp", nil, target)
	if err != nil {
		return nil, err
	}
	p.up[src.String()] = up
	from := n.slotOf(src.String())
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			k, err := up.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // an ICMP error from a daemon down: it may come back
			}
			n.send(p.slot, from, buf[:k], func(b []byte) { _, _ = p.udp.WriteToUDP(b, src) })
		}
	}()
	return up, nil
}

// tcpLink is what a stream into slot's daemon suffers: the worst of what the links into
// it suffer (its sender cannot be told).
func (n *DaemonNet) tcpLink(slot int) Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	var l Link
	for from := range n.links {
		if from != slot {
			x := n.links[from][slot]
			l.Cut = l.Cut || x.Cut
			l.Delay = max(l.Delay, x.Delay)
		}
	}
	return l
}

// serveTCP forwards the streams to p's daemon.
func (n *DaemonNet) serveTCP(p *daemonProxy) {
	defer n.wg.Done()
	for {
		c, err := p.tcp.Accept()
		if err != nil {
			return
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.pipe(p, c)
		}()
	}
}

// pipe carries one stream to p's daemon and back, unless the link cuts it.
func (n *DaemonNet) pipe(p *daemonProxy, c net.Conn) {
	defer c.Close()
	l := n.tcpLink(p.slot)
	if l.Cut {
		return
	}
	if l.Delay > 0 {
		time.Sleep(l.Delay)
	}
	d, err := net.DialTimeout("tcp", n.binds[p.slot], time.Second)
	if err != nil {
		return
	}
	defer d.Close()
	p.mu.Lock()
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		p.mu.Unlock()
		return
	}
	p.tcps[c], p.tcps[d] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(d, c); d.Close(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, d); c.Close(); done <- struct{}{} }()
	<-done
	<-done
	p.mu.Lock()
	delete(p.tcps, c)
	delete(p.tcps, d)
	p.mu.Unlock()
}

// Close stops every proxy, its held datagrams and its streams, and waits for their
// goroutines.
func (n *DaemonNet) Close() {
	n.mu.Lock()
	n.closed = true
	for t := range n.timers {
		if t.Stop() {
			n.wg.Done()
		}
	}
	n.timers = map[*time.Timer]struct{}{}
	n.mu.Unlock()
	for _, p := range n.proxies {
		p.udp.Close()
		p.tcp.Close()
		p.mu.Lock()
		for _, up := range p.up {
			up.Close()
		}
		for c := range p.tcps {
			c.Close()
		}
		p.mu.Unlock()
	}
	n.wg.Wait()
}
