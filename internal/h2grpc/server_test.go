package h2grpc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/poll"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testConfig() Config {
	return Config{MaxStreams: 64, MaxMessage: 64 << 10, MaxHeaderList: 16 << 10,
		IdleTimeout: time.Minute, WriteTimeout: 5 * time.Second, HandshakeTimeout: 5 * time.Second}
}

// echo answers /test/Echo with its request (a StringValue), /test/Big with a value of the
// request's length in bytes, /test/Fail with the request as a NotFound error, and
// /test/Block by waiting on block.
type echo struct {
	block    chan struct{}
	deadline chan time.Duration
}

func (e *echo) handle(ctx context.Context, c *Call, out []byte) ([]byte, error) {
	var req wrapperspb.StringValue
	if err := proto.Unmarshal(c.Message, &req); err != nil {
		return out, status.Error(codes.Internal, err.Error())
	}
	switch c.Method {
	case "/test/Echo":
		if d, ok := ctx.Deadline(); ok && e.deadline != nil {
			e.deadline <- time.Until(d)
		}
		return proto.MarshalOptions{}.MarshalAppend(out, wrapperspb.String(req.Value+" "+c.Authorization))
	case "/test/Big":
		var n int
		fmt.Sscan(req.Value, &n)
		return proto.MarshalOptions{}.MarshalAppend(out, wrapperspb.String(strings.Repeat("x", n)))
	case "/test/Fail":
		return out, status.Error(codes.NotFound, req.Value)
	case "/test/Block":
		<-e.block
		return proto.MarshalOptions{}.MarshalAppend(out, &req)
	}
	return out, status.Errorf(codes.Unimplemented, "unknown method %s", c.Method)
}

// forModes runs f with calls answered on workers, then inline.
func forModes(t *testing.T, f func(t *testing.T, cfg Config)) {
	for _, inline := range []bool{false, true} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) {
			cfg := testConfig()
			cfg.Inline = inline
			f(t, cfg)
		})
	}
}

// start serves h on loopback and returns the server, a client connection to it, and
// Serve's result.
func start(t *testing.T, cfg Config, h Handler) (*Server, *grpc.ClientConn, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg, h)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		s.Stop()
	})
	return s, cc, served
}

func call(ctx context.Context, cc *grpc.ClientConn, method, v string, opts ...grpc.CallOption) (string, error) {
	var resp wrapperspb.StringValue
	err := cc.Invoke(ctx, method, wrapperspb.String(v), &resp, opts...)
	return resp.Value, err
}

func TestCalls(t *testing.T) {
	forModes(t, func(t *testing.T, cfg Config) {
		e := &echo{}
		_, cc, _ := start(t, cfg, e.handle)
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer tok")
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for g := range 32 {
			wg.Go(func() {
				for i := range 50 {
					want := fmt.Sprintf("g%d-%d", g, i)
					got, err := call(ctx, cc, "/test/Echo", want)
					if err != nil || got != want+" Bearer tok" {
						errs <- fmt.Errorf("goroutine %d call %d: got %q, %v, want %q", g, i, got, err, want+" Bearer tok")
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func TestErrors(t *testing.T) {
	forModes(t, func(t *testing.T, cfg Config) {
		_, cc, _ := start(t, cfg, (&echo{}).handle)
		ctx := context.Background()
		for i, c := range []struct {
			method, value string
			code          codes.Code
			msg           string
		}{
			{"/test/Fail", "no such key: 100% gone\nreally é", codes.NotFound, "no such key: 100% gone\nreally é"},
			{"/test/Nothing", "", codes.Unimplemented, "unknown method /test/Nothing"},
			{"/test/Echo", strings.Repeat("y", 70<<10), codes.ResourceExhausted, "grpc: received message larger than max (71684 vs. 65536)"},
		} {
			_, err := call(ctx, cc, c.method, c.value)
			if s := status.Convert(err); s.Code() != c.code || s.Message() != c.msg {
				t.Errorf("step %d: got %v %q, want %v %q", i, s.Code(), s.Message(), c.code, c.msg)
			}
		}
		// The connection still serves.
		if got, err := call(ctx, cc, "/test/Echo", "after"); err != nil || got != "after " {
			t.Errorf("after the errors: got %q, %v", got, err)
		}
	})
}

// A response larger than the client's windows and frames waits for its window updates.
func TestLargeResponses(t *testing.T) {
	forModes(t, func(t *testing.T, cfg Config) {
		_, cc, _ := start(t, cfg, (&echo{}).handle)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				n := 300<<10 + g
				got, err := call(context.Background(), cc, "/test/Big", fmt.Sprint(n), grpc.MaxCallRecvMsgSize(1<<20))
				if err != nil || len(got) != n {
					t.Errorf("goroutine %d: got %d bytes, %v, want %d", g, len(got), err, n)
				}
			})
		}
		wg.Wait()
	})
}

func TestDeadline(t *testing.T) {
	e := &echo{deadline: make(chan time.Duration, 1)}
	_, cc, _ := start(t, testConfig(), e.handle)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := call(ctx, cc, "/test/Echo", "x"); err != nil {
		t.Fatal(err)
	}
	if d := <-e.deadline; d <= 0 || d > time.Minute {
		t.Errorf("the handler's deadline is %v away, want within a minute", d)
	}
}

// More calls than MaxStreams wait for a stream; all are answered.
func TestMaxStreams(t *testing.T) {
	cfg := testConfig()
	cfg.MaxStreams = 2
	e := &echo{block: make(chan struct{})}
	_, cc, _ := start(t, cfg, e.handle)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if got, err := call(context.Background(), cc, "/test/Block", fmt.Sprint(i)); err != nil || got != fmt.Sprint(i) {
				t.Errorf("call %d: got %q, %v", i, got, err)
			}
		})
	}
	close(e.block)
	wg.Wait()
}

// GracefulStop answers the call in flight, then Serve returns nil.
func TestGracefulStop(t *testing.T) {
	e := &echo{block: make(chan struct{})}
	s, cc, served := start(t, testConfig(), e.handle)
	if _, err := call(context.Background(), cc, "/test/Echo", "warm"); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() {
		_, err := call(context.Background(), cc, "/test/Block", "in flight")
		answered <- err
	}()
	waitFor(t, "the call in flight", func() bool { return activeStreams(s) == 1 })
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	waitFor(t, "a GOAWAY on every connection", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for c := range s.conns {
			c.mu.Lock()
			g := c.goingAway
			c.mu.Unlock()
			if !g {
				return false
			}
		}
		return true
	})
	close(e.block)
	if err := <-answered; err != nil {
		t.Errorf("the call in flight: %v, want its answer", err)
	}
	<-stopped
	if err := <-served; err != nil {
		t.Errorf("Serve: %v, want nil", err)
	}
}

func activeStreams(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		n += int(c.active.Load())
	}
	return n
}

// A connection without calls for IdleTimeout is closed, with a GOAWAY first.
func TestIdleTimeout(t *testing.T) {
	cfg := testConfig()
	cfg.IdleTimeout = 50 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg, (&echo{}).handle)
	go s.Serve(ln)
	defer s.Stop()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	io.WriteString(nc, http2.ClientPreface)
	fr := http2.NewFramer(nc, nc)
	fr.WriteSettings()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var goAway bool
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		if g, ok := f.(*http2.GoAwayFrame); ok && g.ErrCode == http2.ErrCodeNo {
			goAway = true
		}
	}
	if !goAway {
		t.Error("the idle connection closed without a GOAWAY")
	}
}

// rawClient speaks HTTP/2 by hand, to send what grpc-go's client would not.
type rawClient struct {
	nc     net.Conn
	fr     *http2.Framer
	enc    *hpack.Encoder
	dec    *hpack.Decoder
	fields map[string]string // the last answer's header fields
	hb     bytes.Buffer
	id     uint32
}

func dialRaw(t testing.TB, addr string) *rawClient {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	c := &rawClient{nc: nc, fr: http2.NewFramer(nc, nc), id: 1}
	c.enc = hpack.NewEncoder(&c.hb)
	c.fields = map[string]string{}
	c.dec = hpack.NewDecoder(4096, func(f hpack.HeaderField) { c.fields[f.Name] = f.Value })
	c.fr.SetReuseFrames()
	io.WriteString(nc, http2.ClientPreface)
	c.fr.WriteSettings()
	return c
}

// headers sends a request's header block; fields are name, value pairs.
func (c *rawClient) headers(end bool, fields ...string) uint32 {
	c.hb.Reset()
	for i := 0; i < len(fields); i += 2 {
		c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	id := c.id
	c.id += 2
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hb.Bytes(), EndHeaders: true, EndStream: end})
	return id
}

var grpcHeaders = []string{":method", "POST", ":scheme", "http", ":path", "/test/Echo", ":authority", "x", "content-type", "application/grpc", "te", "trailers"}

// answer reads frames until stream id ends, and returns its header fields (valid until
// the next answer) and its RST_STREAM code (or -1).
func (c *rawClient) answer(t testing.TB, id uint32) (map[string]string, int) {
	t.Helper()
	clear(c.fields)
	fields := c.fields
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("stream %d: %v", id, err)
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if f.StreamID != id {
				c.dec.SetEmitEnabled(false)
			}
			_, err := c.dec.Write(f.HeaderBlockFragment())
			if err == nil {
				err = c.dec.Close()
			}
			c.dec.SetEmitEnabled(true)
			if err != nil {
				t.Fatal(err)
			}
			if f.StreamID == id && f.StreamEnded() {
				return fields, -1
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				return fields, int(f.ErrCode)
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.fr.WriteSettingsAck()
			}
		}
	}
}

// Requests grpc-go's client never sends are refused, and the connection serves on.
func TestBadRequests(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.MaxHeaderList = 8 << 10
	s := New(cfg, (&echo{}).handle)
	go s.Serve(ln)
	defer s.Stop()
	c := dialRaw(t, ln.Addr().String())
	msg := func(flag byte, body []byte) []byte {
		return append([]byte{flag, 0, 0, 0, byte(len(body))}, body...)
	}
	req, _ := proto.Marshal(wrapperspb.String("hi"))
	for i, step := range []struct {
		headers []string
		data    []byte // nil: the HEADERS end the stream
		status  string // grpc-status, or "" when the stream is reset
		rst     int
	}{
		{grpcHeaders, msg(0, req), "0", -1},
		{grpcHeaders, nil, "13", -1},                                          // no message
		{grpcHeaders, msg(0, req)[:4], "13", -1},                              // a message cut short
		{grpcHeaders, append(msg(0, req), msg(0, req)...), "13", -1},          // two messages
		{grpcHeaders, msg(1, req), "13", -1},                                  // compressed without an encoding
		{append(grpcHeaders, "grpc-encoding", "gzip"), msg(1, req), "12", -1}, // compressed
		{append(grpcHeaders, "grpc-timeout", "soon"), msg(0, req), "13", -1},
		{append(slicesClone(grpcHeaders)[:8], "content-type", "text/plain"), msg(0, req), "13", -1},
		{append([]string{":method", "GET"}, grpcHeaders[2:]...), msg(0, req), "", int(http2.ErrCodeProtocol)},
		{append(grpcHeaders, "x-big", strings.Repeat("z", 9<<10)), msg(0, req), "8", -1},
		{grpcHeaders, msg(0, req), "0", -1},
	} {
		id := c.headers(step.data == nil, step.headers...)
		if step.data != nil {
			c.fr.WriteData(id, true, step.data)
		}
		fields, rst := c.answer(t, id)
		if fields["grpc-status"] != step.status || rst != step.rst {
			t.Errorf("step %d: got grpc-status %q (%s), RST_STREAM %d, want %q, %d", i, fields["grpc-status"], fields["grpc-message"], rst, step.status, step.rst)
		}
	}
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// A connection that breaks the protocol is closed with a GOAWAY of the error's code.
func TestProtocolErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(testConfig(), (&echo{}).handle)
	go s.Serve(ln)
	defer s.Stop()
	for i, step := range []struct {
		send func(c *rawClient)
		code http2.ErrCode
	}{
		{func(c *rawClient) { c.fr.WriteData(7, true, []byte{0}) }, http2.ErrCodeProtocol},        // data on a stream never opened
		{func(c *rawClient) { c.id = 2; c.headers(true, grpcHeaders...) }, http2.ErrCodeProtocol}, // an even stream
		{func(c *rawClient) {
			c.fr.WriteRawFrame(http2.FrameHeaders, http2.FlagHeadersEndHeaders, 1, []byte{0xff, 0xff, 0xff, 0xff})
		}, http2.ErrCodeCompression},
		{func(c *rawClient) { c.fr.WriteWindowUpdate(0, 1<<31-1) }, http2.ErrCodeFlowControl},
		{func(c *rawClient) { c.fr.WriteRawFrame(http2.FramePing, 0, 0, make([]byte, 16385)) }, http2.ErrCodeFrameSize},
	} {
		c := dialRaw(t, ln.Addr().String())
		step.send(c)
		var got *http2.GoAwayFrame
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				break
			}
			if g, ok := f.(*http2.GoAwayFrame); ok {
				got = g
			}
		}
		if got == nil || got.ErrCode != step.code {
			t.Errorf("step %d: got GOAWAY %v, want one of %v", i, got, step.code)
		}
	}
}

func TestParseTimeout(t *testing.T) {
	for i, c := range []struct {
		in  string
		d   time.Duration
		bad bool
	}{
		{"20m", 20 * time.Millisecond, false},
		{"1S", time.Second, false},
		{"99999999H", 1<<63 - 1, false},
		{"5u", 5 * time.Microsecond, false},
		{"7n", 7, false},
		{"2M", 2 * time.Minute, false},
		{"m", 0, true},
		{"123456789m", 0, true},
		{"-1m", 0, true},
		{"10x", 0, true},
	} {
		d, bad := parseTimeout(c.in)
		if d != c.d || bad != c.bad {
			t.Errorf("step %d: parseTimeout(%q) = %v, %v, want %v, %v", i, c.in, d, bad, c.d, c.bad)
		}
	}
}

// FuzzConn feeds a connection arbitrary frames after a valid start: the server never
// panics, and the connection ends.
func FuzzConn(f *testing.F) {
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 0, 4, 8, 0, 0, 0, 0, 0, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		s := New(testConfig(), (&echo{}).handle)
		server, client := net.Pipe()
		s.mu.Lock()
		c := newConn(s, server)
		s.conns[c] = struct{}{}
		s.conn.Add(1)
		s.mu.Unlock()
		go c.serve()
		go io.Copy(io.Discard, client)
		client.Write([]byte(http2.ClientPreface))
		client.Write([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0}) // SETTINGS
		client.Write(b)
		client.Close()
		s.Stop()
	})
}

// waitFor yields until cond holds (a condition, never a sleep).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, 10*time.Second, 0, cond)
}

// TestAllocs bounds what a call allocates, inline and on workers: the server's request
// HEADERS frame, and the raw client's two answer HEADERS frames.
func TestAllocs(t *testing.T) {
	req, _ := proto.Marshal(wrapperspb.String("hi"))
	body := append([]byte{0, 0, 0, 0, byte(len(req))}, req...)
	for _, inline := range []bool{true, false} {
		cfg := testConfig()
		cfg.Inline = inline
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := New(cfg, func(_ context.Context, c *Call, out []byte) ([]byte, error) {
			return append(out, c.Message...), nil
		})
		go s.Serve(ln)
		c := dialRaw(t, ln.Addr().String())
		exchange := func() {
			id := c.headers(false, grpcHeaders...)
			c.fr.WriteData(id, true, body)
			if fields, rst := c.answer(t, id); fields["grpc-status"] != "0" || rst != -1 {
				t.Fatalf("inline %v: got %v, RST_STREAM %d", inline, fields, rst)
			}
		}
		exchange() // the header tables filled, the pools warm
		got := testing.AllocsPerRun(200, exchange)
		t.Logf("inline %v: %.1f allocations a call", inline, got)
		bound := 3.0
		if raceEnabled {
			bound = 4 // and a stream when the pool misses
		}
		if got > bound {
			t.Errorf("inline %v: %.1f allocations a call, want at most %v", inline, got, bound)
		}
		c.nc.Close()
		s.Stop()
	}
}

// A stream past MaxStreams is refused (REFUSED_STREAM) while the others are answered.
func TestRefusedStream(t *testing.T) {
	cfg := testConfig()
	cfg.MaxStreams = 1
	e := &echo{block: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg, e.handle)
	go s.Serve(ln)
	defer s.Stop()
	c := dialRaw(t, ln.Addr().String())
	req, _ := proto.Marshal(wrapperspb.String("hi"))
	body := append([]byte{0, 0, 0, 0, byte(len(req))}, req...)
	block := append(slicesClone(grpcHeaders)[:4], ":path", "/test/Block")
	block = append(block, grpcHeaders[6:]...)
	first := c.headers(false, block...)
	c.fr.WriteData(first, true, body)
	second := c.headers(false, grpcHeaders...)
	if _, rst := c.answer(t, second); rst != int(http2.ErrCodeRefusedStream) {
		t.Errorf("the second stream: RST_STREAM %d, want REFUSED_STREAM", rst)
	}
	close(e.block)
	if fields, rst := c.answer(t, first); fields["grpc-status"] != "0" || rst != -1 {
		t.Errorf("the first stream: %v, RST_STREAM %d, want its answer", fields, rst)
	}
}
