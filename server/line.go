package server

// The line protocol (docs/protocol.md): the accept loop, each connection's queries
// answered in order, and a close that lets the client read every answer sent.

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"time"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/priority"
)

type conn struct {
	s *Server
	c net.Conn
}

func (s *Server) acceptLoop(ln net.Listener) {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Error("accept", "err", err)
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff) // e.g. out of file descriptors: do not spin
			continue
		}
		backoff = 0
		if s.nconns.Add(1) > int64(s.Config().MaxConnections) {
			s.nconns.Add(-1)
			s.m.connsRefused.Inc()
			c.Close()
			continue
		}
		cn := &conn{s: s, c: c}
		s.conns.Store(cn, struct{}{})
		s.m.conns.Inc()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				// Out of conns first: Shutdown wakes the connections in conns with a read
				// deadline, which would cut this one's linger short (and reset it under
				// answers its client has not read yet).
				s.conns.Delete(cn)
				lingeringClose(c)
				s.nconns.Add(-1)
				s.m.conns.Dec()
			}()
			cn.serve()
		}()
	}
}

// serve answers queries in order until the client closes, breaks a rule of the protocol,
// stops reading, idles too long, or the server shuts down.
func (cn *conn) serve() {
	s := cn.s
	cfg := s.Config()
	r := bufio.NewReaderSize(cn.c, cfg.MaxLine)
	w := bufio.NewWriterSize(&deadlineWriter{c: cn.c, timeout: cfg.WriteTimeout.D()}, cfg.MaxPending)
	ctx := context.Background()
	var out []byte
	for {
		if r.Buffered() == 0 {
			// Nothing left to answer from what was read: send the answers, then wait.
			if w.Buffered() > 0 {
				if err := w.Flush(); err != nil {
					s.m.connsDropped.WithLabelValues("not_reading").Inc()
					return
				}
			}
			if s.closing.Load() {
				return
			}
			cn.c.SetReadDeadline(time.Now().Add(cfg.IdleTimeout.D()))
		}
		line, err := r.ReadSlice('\n')
		if err != nil {
			switch {
			case errors.Is(err, bufio.ErrBufferFull):
				// Over-long: answer NO and close, never buffer without bound.
				s.m.badInput.WithLabelValues("too_long").Inc()
				w.WriteString("NO\n")
				w.Flush()
				s.m.connsDropped.WithLabelValues("line_too_long").Inc()
			case errors.Is(err, os.ErrDeadlineExceeded):
				if !s.closing.Load() {
					s.m.connsDropped.WithLabelValues("idle").Inc()
				}
				w.Flush()
			default:
				// EOF or a reset: a final line without '\n' is not a query.
				if len(line) > 0 {
					s.m.badInput.WithLabelValues("no_newline").Inc()
				}
				w.Flush()
			}
			return
		}
		q, ok, perr := wire.ParseQuery(line[:len(line)-1])
		out = out[:0]
		switch {
		case perr != nil:
			s.m.badInput.WithLabelValues("bad_extension").Inc()
			out = wire.AppendRefusal(out, perr.Error())
		case !ok:
			s.m.badInput.WithLabelValues("bad_tag").Inc()
			out = append(out, "NO\n"...)
		case q.Expired:
			s.ReportExpired(string(q.Tag), q.N)
			out = append(out, "OK\n"...)
		case q.PenaltyMs > 0:
			if _, err := s.Penalize(ctx, string(q.Tag), time.Duration(q.PenaltyMs)*time.Millisecond); errors.Is(err, ErrPenaltyRefused) {
				out = wire.AppendRefusal(out, "penalties are off for this tag's rule")
			} else {
				out = append(out, "OK\n"...)
			}
		default:
			dctx := ctx
			if q.Priority != 0 {
				dctx = priority.With(ctx, priority.Class(q.Priority))
			}
			d, err := s.decide(dctx, string(q.Tag), q.N, time.Duration(q.WaitMs)*time.Millisecond, q.Stamp)
			if errors.Is(err, gcra.ErrCostExceedsBurst) {
				s.m.badInput.WithLabelValues("cost_over_burst").Inc()
				out = wire.AppendRefusal(out, "cost exceeds the burst: it can never be granted")
				break
			}
			a := wire.Answer{Allowed: d.Allowed && err == nil, DelayMs: -1, Verbose: q.Verbose, Remaining: d.Remaining,
				RetryMs: ceilMs(d.RetryAfter), ResetMs: ceilMs(d.ResetAfter), At: d.Slot}
			if q.Verbose {
				a.Why = d.why(err)
			}
			if q.WaitMs > 0 {
				a.DelayMs = ceilMs(d.Delay)
			}
			out = wire.AppendAnswer(out, a)
		}
		if _, err := w.Write(out); err != nil {
			s.m.connsDropped.WithLabelValues("not_reading").Inc()
			return
		}
	}
}

// lingerTime is how long a closing connection keeps reading (and discarding) what its
// client still sends.
const lingerTime = time.Second

// lingeringClose closes a connection so that the client reads every answer sent: it
// sends FIN first, then reads and discards what the client still sends until the client
// closes too or lingerTime passes, and only then closes. Closing a socket with unread
// input makes the kernel send RST, and the client's stack may then drop answers it had
// received but not yet read. The drain is bounded in time, and reads into a small buffer.
func lingeringClose(c net.Conn) {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := c.(closeWriter); ok && cw.CloseWrite() == nil {
		c.SetReadDeadline(time.Now().Add(lingerTime))
		var buf [4096]byte
		for {
			if _, err := c.Read(buf[:]); err != nil {
				break
			}
		}
	}
	c.Close()
}

func ceilMs(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// deadlineWriter gives every write a deadline, so a client that stops reading is dropped
// once its answers have filled the buffer and the socket.
type deadlineWriter struct {
	c       net.Conn
	timeout time.Duration
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	d.c.SetWriteDeadline(time.Now().Add(d.timeout))
	return d.c.Write(p)
}
