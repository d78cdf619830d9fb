// Package slowlink is a TCP proxy on a loopback port that delays every byte by a fixed
// time in each direction: a far data centre's link, for tests. Bytes keep their order and
// the link keeps its bandwidth (a chunk read is written once its delay has passed, while
// later chunks are read meanwhile).
package slowlink

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Link is a running proxy. Close stops it and its connections.
type Link struct {
	ln       net.Listener
	upstream string
	delay    time.Duration

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Start listens on a free loopback port and forwards each connection to upstream, each
// direction delayed by delay.
func Start(upstream string, delay time.Duration) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Link{ln: ln, upstream: upstream, delay: delay, conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr is the address to dial instead of upstream.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for the link's goroutines.
func (l *Link) Close() error {
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	err := l.ln.Close()
	l.wg.Wait()
	return err
}

// track records c for Close; false if the link is closed (c is closed then).
func (l *Link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.Close()
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		down, err := l.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", l.upstream)
		if err != nil {
			down.Close()
			continue
		}
		if !l.track(down) || !l.track(up) {
			down.Close()
			up.Close()
			return
		}
		l.wg.Add(2)
		go l.pipe(up, down)
		go l.pipe(down, up)
	}
}

type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies from src to dst, each chunk delayed; it closes both ends when either fails.
func (l *Link) pipe(dst, src net.Conn) {
	defer l.wg.Done()
	q := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.b); err != nil {
				src.Close()
				for range q {
				}
				return
			}
		}
		dst.Close()
	}()
	for {
		b := make([]byte, 32<<10)
		n, err := src.Read(b)
		if n > 0 {
			q <- chunk{b[:n], time.Now().Add(l.delay)}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				dst.Close()
			}
			break
		}
	}
	close(q)
	<-done
}
