package h2grpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	connWindow = 1 << 20 // the connection's receive window, given back as data arrives
	maxOut     = 1 << 20 // bytes waiting to be written before a writer waits for room
	minBatch   = 1000    // bytes below which the writer yields once before writing
	// maxHeaderBlock bounds the encoded bytes of one header block (HEADERS and its
	// CONTINUATION frames): a peer that sends more is cut off.
	maxHeaderBlock = 1 << 16
)

// conn is one client connection. Its reader goroutine (serve) owns the plain fields
// above mu; the atomics, the idle timer and the fields below mu are shared with the
// writer goroutine, the calls' goroutines and the server.
type conn struct {
	s      *Server
	nc     net.Conn
	ctx    context.Context // ends when the connection closes
	cancel context.CancelFunc
	br     *bufio.Reader
	fr     *http2.Framer
	dec    *hpack.Decoder

	streams   map[uint32]*stream // streams whose request is still arriving
	lastID    uint32             // the highest stream the peer opened
	hdr       *stream            // the stream whose header block is being read
	hdrEnd    bool               // its HEADERS frame ended the stream
	hdrSize   uint32             // bytes of its header list so far
	hdrBlock  int                // encoded bytes of its header block so far
	recvAcked int                // data bytes received and not yet given back
	streamWin int                // the receive window of a stream, as the settings sent say
	active    atomic.Int32       // streams open: from their HEADERS to their answer
	idleSince atomic.Int64       // when active last fell to 0 (Unix nanoseconds)
	idle      *time.Timer
	written   chan struct{} // closed when the writer has stopped

	mu        sync.Mutex
	wake      sync.Cond // the writer waits for frames
	room      sync.Cond // a call's goroutine waits for room in out
	out       []byte    // frames to write
	spare     []byte    // the writer's last buffer, kept for the next swap
	enc       *hpack.Encoder
	hbuf      bytes.Buffer // the encoder's output
	sendConn  int64        // the peer's connection window
	sendInit  int64        // the peer's initial stream window
	maxFrame  int          // the peer's largest frame
	pending   []*pendingData
	accepted  uint32 // the highest stream accepted (what a GOAWAY names)
	goingAway bool   // a GOAWAY was sent: no stream after accepted is served
	shut      bool   // close once out is written
	closed    bool
}

// pendingData is an answer's message waiting for the peer's windows.
type pendingData struct {
	id      uint32
	buf     []byte // the length-prefixed message
	off     int    // bytes of buf sent
	updates int64  // the stream's WINDOW_UPDATEs
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, streams: map[uint32]*stream{}, sendConn: 65535, sendInit: 65535, maxFrame: 16384,
		written: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.br = bufio.NewReaderSize(nc, 32<<10)
	c.fr = http2.NewFramer(io.Discard, c.br)
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(16384) // HTTP/2's default, which the settings sent keep: a larger frame ends the connection
	c.dec = hpack.NewDecoder(4096, c.onField)
	// A field past MaxHeaderList refuses its stream (onField); a string past the block's
	// own bound would end the connection.
	c.dec.SetMaxStringLength(2 * maxHeaderBlock)
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.wake.L, c.room.L = &c.mu, &c.mu
	// A stream's window holds the largest message and a frame more: a larger message
	// is seen, and refused, without waiting for a window update that never comes.
	c.streamWin = min(s.cfg.MaxMessage+5+16384, math.MaxInt32)
	c.idleSince.Store(time.Now().UnixNano())
	// The server's preface: its settings, and the connection's window raised.
	c.out = appendFrameHeader(c.out, 3*6, http2.FrameSettings, 0, 0)
	for _, st := range []http2.Setting{
		{ID: http2.SettingMaxConcurrentStreams, Val: s.cfg.MaxStreams},
		{ID: http2.SettingInitialWindowSize, Val: uint32(c.streamWin)},
		{ID: http2.SettingMaxHeaderListSize, Val: s.cfg.MaxHeaderList},
	} {
		c.out = binary.BigEndian.AppendUint16(c.out, uint16(st.ID))
		c.out = binary.BigEndian.AppendUint32(c.out, st.Val)
	}
	c.out = appendWindowUpdate(c.out, 0, connWindow-65535)
	return c
}

// connError is a connection error: the connection is closed with a GOAWAY of its code.
type connError http2.ErrCode

func (e connError) Error() string { return "h2grpc: connection error " + http2.ErrCode(e).String() }

func (c *conn) serve() {
	defer c.s.connDone(c)
	go c.writeLoop()
	c.idle = time.AfterFunc(time.Hour, c.checkIdle) // set before it can fire
	c.idle.Reset(c.s.cfg.IdleTimeout)
	defer c.idle.Stop()
	err := c.read()
	var ce connError
	var fe http2.ConnectionError
	switch {
	case errors.As(err, &ce):
		c.goAwayCode(http2.ErrCode(ce))
	case errors.As(err, &fe):
		c.goAwayCode(http2.ErrCode(fe))
	case errors.Is(err, http2.ErrFrameTooLarge):
		c.goAwayCode(http2.ErrCodeFrameSize)
	default:
		c.close()
		return
	}
	c.finish()
	// The writer closes the connection once the GOAWAY is out (or WriteTimeout has
	// passed); the reader waits for that, so a stopping server waits for it too.
	<-c.written
}

func (c *conn) read() error {
	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.HandshakeTimeout))
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		return io.ErrUnexpectedEOF
	}
	f, err := c.fr.ReadFrame()
	if err != nil {
		return err
	}
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		return connError(http2.ErrCodeProtocol)
	}
	if err := c.handle(f); err != nil {
		return err
	}
	c.nc.SetReadDeadline(time.Time{})
	for {
		if c.s.cfg.Inline && c.br.Buffered() == 0 {
			c.wake.Signal() // the answers to everything read so far
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.resetStream(se.StreamID, se.Code)
				continue
			}
			return err
		}
		if err := c.handle(f); err != nil {
			return err
		}
	}
}

func (c *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.HeadersFrame:
		return c.onHeaders(f)
	case *http2.ContinuationFrame:
		return c.onHeaderBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.PingFrame:
		if !f.IsAck() {
			c.mu.Lock()
			c.waitRoom()
			c.out = appendFrameHeader(c.out, 8, http2.FramePing, http2.FlagPingAck, 0)
			c.out = append(c.out, f.Data[:]...)
			c.wake.Signal()
			c.mu.Unlock()
		}
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		if st := c.streams[f.StreamID]; st != nil { // a call in flight is answered all the same
			delete(c.streams, f.StreamID)
			c.release(st)
		}
	case *http2.PushPromiseFrame:
		return connError(http2.ErrCodeProtocol)
	}
	return nil // GOAWAY (the calls in flight are answered), PRIORITY, unknown frames
}

func (c *conn) onHeaders(f *http2.HeadersFrame) error {
	id := f.StreamID
	if st := c.streams[id]; st != nil {
		// Trailers of a request: they end it; their fields are read and dropped.
		if !f.StreamEnded() {
			return connError(http2.ErrCodeProtocol)
		}
		st.trailers = true
		c.hdr, c.hdrEnd, c.hdrSize = st, true, 0
		return c.onHeaderBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	}
	if id%2 == 0 || id <= c.lastID {
		return connError(http2.ErrCodeProtocol)
	}
	c.lastID = id
	c.hdr, c.hdrEnd, c.hdrSize = getStream(c, id), f.StreamEnded(), 0
	return c.onHeaderBlock(f.HeaderBlockFragment(), f.HeadersEnded())
}

// onField takes one decoded header field of the stream being read.
func (c *conn) onField(f hpack.HeaderField) {
	st := c.hdr
	if st == nil || st.trailers {
		return
	}
	c.hdrSize += f.Size()
	if c.hdrSize > c.s.cfg.MaxHeaderList {
		st.tooLarge = true
		return
	}
	switch f.Name {
	case ":path":
		st.call.Method = f.Value
	case ":method":
		st.post = f.Value == "POST"
	case "content-type":
		st.grpcType = isGRPCType(f.Value)
	case "grpc-timeout":
		st.timeout, st.badTimeout = parseTimeout(f.Value)
	case "grpc-encoding":
		st.encoding = f.Value
	case "authorization":
		st.call.Authorization = f.Value
	}
}

func (c *conn) onHeaderBlock(frag []byte, ended bool) error {
	c.hdrBlock += len(frag)
	if c.hdrBlock > maxHeaderBlock {
		return connError(http2.ErrCodeEnhanceYourCalm)
	}
	if _, err := c.dec.Write(frag); err != nil {
		return connError(http2.ErrCodeCompression)
	}
	if !ended {
		return nil
	}
	if err := c.dec.Close(); err != nil {
		return connError(http2.ErrCodeCompression)
	}
	st, end := c.hdr, c.hdrEnd
	c.hdr, c.hdrBlock = nil, 0
	if st.trailers {
		delete(c.streams, st.id)
		c.endRequest(st)
		return nil
	}
	c.mu.Lock()
	refused := c.goingAway || c.closed || uint32(c.active.Load()) >= c.s.cfg.MaxStreams
	if !refused {
		c.accepted = st.id
		c.active.Add(1)
	}
	c.mu.Unlock()
	switch {
	case refused:
		putStream(st)
		c.resetStream(st.id, http2.ErrCodeRefusedStream)
	case !st.post || st.call.Method == "":
		c.releaseReset(st, http2.ErrCodeProtocol)
	case !st.grpcType:
		c.reject(st, !end, 415, codes.Internal, "h2grpc: content-type: want application/grpc")
	case st.tooLarge:
		c.reject(st, !end, 200, codes.ResourceExhausted, "h2grpc: the header list is larger than "+strconv.Itoa(int(c.s.cfg.MaxHeaderList))+" bytes")
	case st.badTimeout:
		c.reject(st, !end, 200, codes.Internal, "h2grpc: malformed grpc-timeout")
	case end:
		c.endRequest(st)
	default:
		c.streams[st.id] = st
	}
	return nil
}

func (c *conn) onData(f *http2.DataFrame) error {
	n := int(f.Header().Length)
	c.recvAcked += n
	if c.recvAcked >= connWindow/4 {
		c.mu.Lock()
		c.waitRoom()
		c.out = appendWindowUpdate(c.out, 0, uint32(c.recvAcked))
		c.wake.Signal()
		c.mu.Unlock()
		c.recvAcked = 0
	}
	st := c.streams[f.StreamID]
	if st == nil {
		if f.StreamID > c.lastID {
			return connError(http2.ErrCodeProtocol) // data on a stream never opened
		}
		return nil // a stream answered, refused or reset: its data are dropped
	}
	st.recv += n
	switch {
	case st.recv > c.streamWin:
		delete(c.streams, st.id)
		c.releaseReset(st, http2.ErrCodeFlowControl)
		return nil
	case len(st.msg)+len(f.Data()) > 5+c.s.cfg.MaxMessage || declaredLen(st.msg, f.Data()) > c.s.cfg.MaxMessage:
		delete(c.streams, st.id)
		n := max(declaredLen(st.msg, f.Data()), len(st.msg)+len(f.Data())-5)
		// grpc-go's words, which clients may match
		c.reject(st, !f.StreamEnded(), 200, codes.ResourceExhausted,
			"grpc: received message larger than max ("+strconv.Itoa(n)+" vs. "+strconv.Itoa(c.s.cfg.MaxMessage)+")")
		return nil
	}
	st.msg = append(st.msg, f.Data()...)
	if f.StreamEnded() {
		delete(c.streams, st.id)
		c.endRequest(st)
	}
	return nil
}

// declaredLen is the message length a request's prefix declares, once its 5 bytes are
// in (sofar, and the data frame that follows), or 0 before.
func declaredLen(sofar, next []byte) int {
	if len(sofar)+len(next) < 5 {
		return 0
	}
	var p [5]byte
	n := copy(p[:], sofar)
	copy(p[n:], next)
	return int(binary.BigEndian.Uint32(p[1:]))
}

// endRequest takes a stream whose request has ended: one message, which a call answers.
func (c *conn) endRequest(st *stream) {
	m := st.msg
	switch {
	case len(m) < 5 || int(binary.BigEndian.Uint32(m[1:5])) != len(m)-5:
		c.reject(st, false, 200, codes.Internal, "h2grpc: the request is not one length-prefixed message")
	case m[0] == 1 && st.encoding != "" && st.encoding != "identity":
		c.reject(st, false, 200, codes.Unimplemented, "h2grpc: compression is not supported (grpc-encoding "+st.encoding+")")
	case m[0] != 0:
		c.reject(st, false, 200, codes.Internal, "h2grpc: the request message is marked compressed")
	default:
		st.call.Message = m[5:]
		if c.s.cfg.Inline {
			c.run(st)
			return
		}
		c.s.dispatch(st)
	}
}

// run answers a call, on a worker's goroutine or, inline, on the reader's.
func (c *conn) run(st *stream) {
	ctx, cancel := c.ctx, context.CancelFunc(nil)
	if st.timeout > 0 && !c.s.cfg.Inline { // inline, the handler never waits for it
		ctx, cancel = context.WithTimeout(ctx, st.timeout)
	}
	out, err := c.s.h(ctx, &st.call, st.out[:0])
	if cancel != nil {
		cancel()
	}
	st.out = out
	c.mu.Lock()
	c.waitRoom()
	switch {
	case c.closed:
	case err != nil:
		s := status.Convert(err)
		c.appendTrailersOnly(st.id, 200, s.Code(), s.Message())
	default:
		c.appendAnswer(st.id, out)
	}
	if !c.s.cfg.Inline {
		c.wake.Signal() // inline, the reader wakes the writer once it has read all it has
	}
	c.mu.Unlock()
	c.release(st)
}

// reject answers a stream with an error, trailers only, and asks the peer to stop
// sending (RST_STREAM NO_ERROR) when its request has not ended.
func (c *conn) reject(st *stream, open bool, httpStatus int, code codes.Code, msg string) {
	c.mu.Lock()
	c.waitRoom()
	c.appendTrailersOnly(st.id, httpStatus, code, msg)
	if open {
		c.out = appendRSTStream(c.out, st.id, http2.ErrCodeNo)
	}
	c.wake.Signal()
	c.mu.Unlock()
	c.release(st)
}

func (c *conn) releaseReset(st *stream, code http2.ErrCode) {
	c.resetStream(st.id, code)
	c.release(st)
}

func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.mu.Lock()
	c.waitRoom()
	c.out = appendRSTStream(c.out, id, code)
	c.wake.Signal()
	c.mu.Unlock()
}

// release ends an accepted stream.
func (c *conn) release(st *stream) {
	putStream(st)
	if c.active.Add(-1) == 0 {
		c.idleSince.Store(time.Now().UnixNano())
		c.mu.Lock()
		if c.goingAway {
			c.shutLocked()
		}
		c.mu.Unlock()
	}
}

func (c *conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			c.sendInit = int64(s.Val)
		case http2.SettingMaxFrameSize:
			c.maxFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			c.enc.SetMaxDynamicTableSizeLimit(s.Val)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.waitRoom()
	c.out = appendFrameHeader(c.out, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
	c.sendPending()
	c.wake.Signal()
	return nil
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		if c.sendConn+inc > math.MaxInt32 {
			return connError(http2.ErrCodeFlowControl)
		}
		c.sendConn += inc
	} else {
		for _, p := range c.pending {
			if p.id == f.StreamID {
				p.updates += inc
			}
		}
	}
	c.sendPending()
	c.wake.Signal()
	return nil
}

// appendAnswer appends an answer's frames, or as many as the peer's windows take (under
// mu).
func (c *conn) appendAnswer(id uint32, msg []byte) {
	c.hbuf.Reset()
	c.enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	c.enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	c.appendHeaderBlock(id, false)
	n := 5 + len(msg)
	if len(c.pending) == 0 && int64(n) <= c.sendConn && int64(n) <= c.sendInit && n <= c.maxFrame {
		c.sendConn -= int64(n)
		c.out = appendFrameHeader(c.out, n, http2.FrameData, 0, id)
		c.out = append(c.out, 0)
		c.out = binary.BigEndian.AppendUint32(c.out, uint32(len(msg)))
		c.out = append(c.out, msg...)
		c.appendTrailers(id)
		return
	}
	p := &pendingData{id: id, buf: make([]byte, 5, n)}
	binary.BigEndian.PutUint32(p.buf[1:], uint32(len(msg)))
	p.buf = append(p.buf, msg...)
	c.pending = append(c.pending, p)
	c.sendPending()
}

// sendPending sends what the windows allow of the answers waiting for them (under mu).
func (c *conn) sendPending() {
	kept := c.pending[:0]
	for _, p := range c.pending {
		for p.off < len(p.buf) {
			win := min(c.sendConn, c.sendInit+p.updates-int64(p.off))
			if win <= 0 {
				break
			}
			n := int(min(win, int64(len(p.buf)-p.off), int64(c.maxFrame)))
			c.out = appendFrameHeader(c.out, n, http2.FrameData, 0, p.id)
			c.out = append(c.out, p.buf[p.off:p.off+n]...)
			p.off += n
			c.sendConn -= int64(n)
		}
		if p.off < len(p.buf) {
			kept = append(kept, p)
			continue
		}
		c.appendTrailers(p.id)
	}
	clear(c.pending[len(kept):])
	c.pending = kept
}

func (c *conn) appendTrailers(id uint32) {
	c.hbuf.Reset()
	c.enc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"})
	c.appendHeaderBlock(id, true)
}

// appendTrailersOnly appends an error's answer: one header block that ends the stream.
func (c *conn) appendTrailersOnly(id uint32, httpStatus int, code codes.Code, msg string) {
	c.hbuf.Reset()
	c.enc.WriteField(hpack.HeaderField{Name: ":status", Value: strconv.Itoa(httpStatus)})
	c.enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	c.enc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: strconv.Itoa(int(code))})
	if msg != "" {
		c.enc.WriteField(hpack.HeaderField{Name: "grpc-message", Value: encodeGRPCMessage(msg)})
	}
	c.appendHeaderBlock(id, true)
}

// appendHeaderBlock appends the block in hbuf as HEADERS and, past the peer's frame
// size, CONTINUATION frames.
func (c *conn) appendHeaderBlock(id uint32, endStream bool) {
	b := c.hbuf.Bytes()
	typ, flags := http2.FrameHeaders, http2.Flags(0)
	if endStream {
		flags = http2.FlagHeadersEndStream
	}
	for {
		n := min(len(b), c.maxFrame)
		f := flags
		if n == len(b) {
			f |= http2.FlagHeadersEndHeaders // the same bit as CONTINUATION's END_HEADERS
		}
		c.out = appendFrameHeader(c.out, n, typ, f, id)
		c.out = append(c.out, b[:n]...)
		b = b[n:]
		if len(b) == 0 {
			return
		}
		typ, flags = http2.FrameContinuation, 0
	}
}

// waitRoom waits while out is full (under mu), the writer woken first: inline answers
// wake it only once their batch is read.
func (c *conn) waitRoom() {
	for len(c.out) > maxOut && !c.closed {
		c.wake.Signal()
		c.room.Wait()
	}
}

// writeLoop writes the frames in out, each batch with one write.
func (c *conn) writeLoop() {
	c.mu.Lock()
	for {
		for len(c.out) == 0 && !c.closed && !c.shut {
			c.wake.Wait()
		}
		if c.closed || len(c.out) == 0 {
			break // closed, or shut with everything written
		}
		if len(c.out) < minBatch && !c.shut {
			// A small batch: let the calls about to answer add theirs first, one write
			// for all (as grpc-go's writer does).
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
			if c.closed {
				break
			}
		}
		b := c.out
		c.out = c.spare[:0]
		c.mu.Unlock()
		c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
		_, err := c.nc.Write(b)
		c.mu.Lock()
		if cap(b) <= 4*maxOut {
			c.spare = b[:0]
		}
		c.room.Broadcast()
		if err != nil {
			break
		}
	}
	c.mu.Unlock()
	c.close()
	close(c.written)
}

// goAway sends a GOAWAY naming the last stream accepted: the streams after it are
// refused, those up to it answered, and the connection closes when none is left.
func (c *conn) goAway() {
	c.goAwayCode(http2.ErrCodeNo)
	c.mu.Lock()
	if c.active.Load() == 0 {
		c.shutLocked()
	}
	c.mu.Unlock()
}

func (c *conn) goAwayCode(code http2.ErrCode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.goingAway || c.closed {
		return
	}
	c.goingAway = true
	c.out = appendFrameHeader(c.out, 8, http2.FrameGoAway, 0, 0)
	c.out = binary.BigEndian.AppendUint32(c.out, c.accepted)
	c.out = binary.BigEndian.AppendUint32(c.out, uint32(code))
	c.wake.Signal()
}

// finish closes the connection once its frames are written.
func (c *conn) finish() {
	c.mu.Lock()
	c.shutLocked()
	c.mu.Unlock()
}

func (c *conn) shutLocked() {
	c.shut = true
	c.wake.Signal()
}

// close closes the connection at once.
func (c *conn) close() {
	c.mu.Lock()
	c.closed = true
	c.wake.Broadcast()
	c.room.Broadcast()
	c.mu.Unlock()
	c.cancel()
	c.nc.Close()
}

// checkIdle closes the connection when it has had no call for IdleTimeout.
func (c *conn) checkIdle() {
	idle := c.s.cfg.IdleTimeout
	if c.active.Load() > 0 {
		c.idle.Reset(idle)
		return
	}
	if left := idle - time.Duration(time.Now().UnixNano()-c.idleSince.Load()); left > 0 {
		c.idle.Reset(left)
		return
	}
	c.goAway()
}

func appendFrameHeader(b []byte, length int, typ http2.FrameType, flags http2.Flags, id uint32) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), byte(typ), byte(flags),
		byte(id>>24)&0x7f, byte(id>>16), byte(id>>8), byte(id))
}

func appendWindowUpdate(b []byte, id, inc uint32) []byte {
	b = appendFrameHeader(b, 4, http2.FrameWindowUpdate, 0, id)
	return binary.BigEndian.AppendUint32(b, inc)
}

func appendRSTStream(b []byte, id uint32, code http2.ErrCode) []byte {
	b = appendFrameHeader(b, 4, http2.FrameRSTStream, 0, id)
	return binary.BigEndian.AppendUint32(b, uint32(code))
}

// isGRPCType reports whether a content-type is gRPC's: application/grpc, alone or with
// a subtype after '+' or ';'.
func isGRPCType(v string) bool {
	const t = "application/grpc"
	return len(v) >= len(t) && v[:len(t)] == t && (len(v) == len(t) || v[len(t)] == '+' || v[len(t)] == ';')
}

// parseTimeout reads a grpc-timeout: up to 8 digits and a unit (H, M, S, m, u, n). It
// reports a malformed value as bad.
func parseTimeout(v string) (d time.Duration, bad bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, true
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, true
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, true
	}
	if n > math.MaxInt64/int64(unit) {
		return math.MaxInt64, false
	}
	return time.Duration(n) * unit, false
}

// encodeGRPCMessage percent-encodes a grpc-message as gRPC's HTTP/2 mapping says: every
// byte outside printable ASCII, and '%'.
func encodeGRPCMessage(s string) string {
	const hex = "0123456789ABCDEF"
	if len(s) > 1024 {
		s = s[:1024]
	}
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c <= 0x7e && c != '%' {
			if b != nil {
				b = append(b, c)
			}
			continue
		}
		if b == nil {
			b = append(make([]byte, 0, len(s)+16), s[:i]...)
		}
		b = append(b, '%', hex[c>>4], hex[c&15])
	}
	if b == nil {
		return s
	}
	return string(b)
}

// stream is one call's state, recycled.
type stream struct {
	c          *conn
	id         uint32
	call       Call
	post       bool
	grpcType   bool
	tooLarge   bool
	trailers   bool
	badTimeout bool
	timeout    time.Duration
	encoding   string
	recv       int    // data bytes received
	msg        []byte // the length-prefixed request
	out        []byte // the answer's message
}

var streams = sync.Pool{New: func() any { return new(stream) }}

func getStream(c *conn, id uint32) *stream {
	st := streams.Get().(*stream)
	msg, out := st.msg[:0], st.out[:0]
	*st = stream{c: c, id: id, msg: msg, out: out}
	return st
}

func putStream(st *stream) {
	if cap(st.msg) > 64<<10 {
		st.msg = nil
	}
	if cap(st.out) > 64<<10 {
		st.out = nil
	}
	st.c, st.call = nil, Call{}
	streams.Put(st)
}
