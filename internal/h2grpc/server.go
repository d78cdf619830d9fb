package h2grpc

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"time"
)

// Config bounds a Server. Every duration and bound must be set (above zero).
type Config struct {
	MaxStreams       uint32        // concurrent calls on one connection; more are refused
	MaxMessage       int           // bytes in one request message; a larger one is answered ResourceExhausted
	MaxHeaderList    uint32        // bytes of one request's header list (names, values and 32 a field)
	IdleTimeout      time.Duration // a connection without a call for this long is closed
	WriteTimeout     time.Duration // a peer that takes no frames for this long is dropped
	HandshakeTimeout time.Duration // the client's preface and settings arrive within this
	// Inline answers each call on its connection's reader goroutine, as soon as its
	// request has arrived, and writes the answers once the reader has nothing more to
	// read: for a handler that never blocks (it decides in process), whose context then
	// carries no deadline (a grpc-timeout is not read). Otherwise calls are answered on
	// worker goroutines, each call's wait its own.
	Inline bool
}

// Call is one unary call.
type Call struct {
	Method        string // the :path, "/package.Service/Method"
	Authorization string // the authorization header's value, "" if none
	Message       []byte // the request message; valid until the handler returns
}

// Handler answers a call: it appends the response message to out and returns it, or
// returns an error whose status (status.Convert) is the answer. ctx ends at the call's
// deadline (grpc-timeout) or when its connection closes. A handler may block; it is
// called on many goroutines at once.
type Handler func(ctx context.Context, c *Call, out []byte) ([]byte, error)

// ErrServerStopped is returned by Serve after Stop or GracefulStop.
var ErrServerStopped = errors.New("h2grpc: the server has stopped")

// Server serves unary gRPC calls on the listeners given to Serve. Its methods are safe
// for concurrent use.
type Server struct {
	cfg   Config
	h     Handler
	calls chan *stream // to the workers

	mu       sync.Mutex
	lns      map[net.Listener]struct{}
	conns    map[*conn]struct{}
	stopping bool
	conn     sync.WaitGroup // one per connection's reader
	start    sync.Once
	end      sync.Once
}

// New returns a server that answers calls with h.
func New(cfg Config, h Handler) *Server {
	return &Server{cfg: cfg, h: h, calls: make(chan *stream), lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}}
}

// workersPerCPU is how many goroutines per CPU wait for calls; a call that finds them
// all busy (as while a back end waits for Redis) gets a goroutine of its own.
const workersPerCPU = 4

// Serve accepts connections on ln until ln is closed or the server stops; it returns nil
// after Stop or GracefulStop, ErrServerStopped if called after them. A failure to accept
// that may pass is waited out.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		ln.Close()
		return ErrServerStopped
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	s.start.Do(func() {
		for range workersPerCPU * runtime.GOMAXPROCS(0) {
			go func() {
				for st := range s.calls {
					st.c.run(st)
				}
			}()
		}
	})
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.stopping
			if stopping || errors.Is(err, net.ErrClosed) {
				delete(s.lns, ln)
			}
			s.mu.Unlock()
			if stopping {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Any other failure may pass (out of file descriptors, a connection reset
			// before it was taken): wait, longer each time, and accept again. ln stays
			// in lns, so a stop meanwhile closes it.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			time.Sleep(delay)
			continue
		}
		delay = 0
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		c := newConn(s, nc)
		s.conns[c] = struct{}{}
		s.conn.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// dispatch hands a call to a waiting worker, or to a goroutine of its own.
func (s *Server) dispatch(st *stream) {
	select {
	case s.calls <- st:
	default:
		go st.c.run(st)
	}
}

func (s *Server) connDone(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.conn.Done()
}

// GracefulStop stops accepting connections, sends GOAWAY on every connection, and
// returns once the calls in flight are answered and every connection has closed.
func (s *Server) GracefulStop() { s.stop(false) }

// Stop closes the listeners and every connection at once.
func (s *Server) Stop() { s.stop(true) }

func (s *Server) stop(now bool) {
	s.mu.Lock()
	s.stopping = true
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		if now {
			c.close()
		} else {
			c.goAway()
		}
	}
	s.mu.Unlock()
	s.conn.Wait()
	// No reader is left to dispatch a call: the workers can go.
	s.end.Do(func() { close(s.calls) })
}
