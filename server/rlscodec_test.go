package server

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// randomResponse is a response of the shapes ShouldRateLimit answers with.
func randomResponse(rng *rand.Rand) *rls.RateLimitResponse {
	words := []string{"", "a", "api", "edge/remote_address=10.0.0.1", strings.Repeat("x", 200), "é"}
	r := &rls.RateLimitResponse{OverallCode: rls.RateLimitResponse_Code(rng.IntN(3))}
	for range rng.IntN(4) {
		st := &rls.RateLimitResponse_DescriptorStatus{Code: rls.RateLimitResponse_Code(rng.IntN(3)), LimitRemaining: rng.Uint32() >> rng.IntN(33)}
		if rng.IntN(3) > 0 {
			st.CurrentLimit = &rls.RateLimitResponse_RateLimit{Name: words[rng.IntN(len(words))],
				RequestsPerUnit: rng.Uint32() >> rng.IntN(33), Unit: rls.RateLimitResponse_RateLimit_Unit(rng.IntN(8))}
		}
		if rng.IntN(3) > 0 {
			st.DurationUntilReset = &durationpb.Duration{Seconds: rng.Int64N(1<<40) - 1<<20, Nanos: rng.Int32N(2e9) - 1e9}
		}
		r.Statuses = append(r.Statuses, st)
	}
	for range rng.IntN(3) {
		r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, &corev3.HeaderValue{Key: words[rng.IntN(len(words))], Value: words[rng.IntN(len(words))]})
	}
	return r
}

// TestResponseEncoding: the codec writes ShouldRateLimit's responses byte for byte as the
// protobuf library does, recycled answers included, and hands other messages to it.
func TestResponseEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := newRLSCodec()
	for i := 0; i < 20_000; i++ {
		r := randomResponse(rng)
		want, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if !plainResponse(r) {
			t.Fatalf("step %d: %v is not plain", i, r)
		}
		if got := appendResponse(nil, r); !bytes.Equal(got, want) {
			t.Fatalf("step %d: %v\ngot  %x\nwant %x", i, r, got, want)
		}
		if n := responseSize(r); n < len(want) {
			t.Fatalf("step %d: size bound %d, encoding %d bytes", i, n, len(want))
		}
		a := newAnswer(len(r.Statuses))
		for j, st := range r.Statuses {
			a.resp.Statuses[j].Code, a.resp.Statuses[j].LimitRemaining = st.Code, st.LimitRemaining
			if st.CurrentLimit != nil {
				l := a.limits[j]
				l.Name, l.RequestsPerUnit, l.Unit = st.CurrentLimit.Name, st.CurrentLimit.RequestsPerUnit, st.CurrentLimit.Unit
				a.resp.Statuses[j].CurrentLimit = l
			}
			if st.DurationUntilReset != nil {
				d := a.resets[j]
				d.Seconds, d.Nanos = st.DurationUntilReset.Seconds, st.DurationUntilReset.Nanos
				a.resp.Statuses[j].DurationUntilReset = d
			}
		}
		a.resp.OverallCode, a.resp.ResponseHeadersToAdd = r.OverallCode, r.ResponseHeadersToAdd
		out, err := c.Marshal(a)
		if err != nil || !bytes.Equal(out.Materialize(), want) {
			t.Fatalf("step %d: a recycled answer of %v: %x %v, want %x", i, r, out.Materialize(), err, want)
		}
		out.Free()
	}
	// Fields ShouldRateLimit never sets: the protobuf library writes them.
	r := &rls.RateLimitResponse{RawBody: []byte("x"), Statuses: []*rls.RateLimitResponse_DescriptorStatus{{Code: 1}}}
	want, _ := proto.Marshal(r)
	if out, err := c.Marshal(r); err != nil || !bytes.Equal(out.Materialize(), want) {
		t.Errorf("a response with a raw body: %x %v, want %x", out.Materialize(), err, want)
	}
	// Another message: the protobuf codec.
	w := wrapperspb.String("x")
	want, _ = proto.Marshal(w)
	if out, err := c.Marshal(w); err != nil || !bytes.Equal(out.Materialize(), want) {
		t.Errorf("another message: %x %v, want %x", out.Materialize(), err, want)
	}
}

// requestSeeds are encodings of requests: Envoy's usual ones and the fields ShouldRateLimit
// refuses.
func requestSeeds() [][]byte {
	reqs := []*rls.RateLimitRequest{
		{Domain: "edge", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}},
		{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "a", Value: "1"}, {Key: "b"}}, HitsAddend: wrapperspb.UInt64(7)},
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "c", Value: "é"}}, IsNegativeHits: true,
				Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}}}},
		{},
	}
	var out [][]byte
	for _, r := range reqs {
		b, _ := proto.Marshal(r)
		out = append(out, b)
	}
	return append(out, []byte{0x0a, 0x02, 0xff, 0xfe}, []byte{0x08, 0x01, 0x12, 0x00, 0x18, 0x80, 0x01})
}

// FuzzRequestDecoding: the codec decodes any bytes as the protobuf library does, for the
// fields ShouldRateLimit reads: it fails where the library fails, and where it succeeds the
// fields are equal; into a request that held another one (the pooled ones), too.
func FuzzRequestDecoding(f *testing.F) {
	seeds := requestSeeds()
	for _, s := range seeds {
		f.Add(s, 0)
	}
	c := newRLSCodec()
	f.Fuzz(func(t *testing.T, b []byte, prev int) {
		want := &rls.RateLimitRequest{}
		wantErr := proto.Unmarshal(b, want)
		got := &rls.RateLimitRequest{}
		if err := decodeRequest(seeds[uint(prev)%uint(len(seeds))], got); err != nil && uint(prev)%uint(len(seeds)) < 3 {
			t.Fatalf("seed %d: %v", prev, err)
		}
		err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%x: error %v, the protobuf library's %v", b, err, wantErr)
		}
		if err != nil {
			return
		}
		if got.Domain != want.Domain || got.HitsAddend != want.HitsAddend || len(got.Descriptors) != len(want.Descriptors) {
			t.Fatalf("%x: got %v, want %v", b, got, want)
		}
		for i, d := range want.Descriptors {
			g := got.Descriptors[i]
			if len(g.Entries) != len(d.Entries) || g.IsNegativeHits != d.IsNegativeHits ||
				(g.Limit == nil) != (d.Limit == nil) || (g.Limit != nil && !proto.Equal(g.Limit, d.Limit)) ||
				(g.HitsAddend == nil) != (d.HitsAddend == nil) || (g.HitsAddend != nil && g.HitsAddend.Value != d.HitsAddend.Value) {
				t.Fatalf("%x: descriptor %d: got %v, want %v", b, i, g, d)
			}
			for j, e := range d.Entries {
				if g.Entries[j].Key != e.Key || g.Entries[j].Value != e.Value {
					t.Fatalf("%x: descriptor %d, entry %d: got %v, want %v", b, i, j, g.Entries[j], e)
				}
			}
		}
	})
}

// TestShouldRateLimitAllocs bounds what the lean transport's handler allocates to answer
// ShouldRateLimit on the local back end, from the request's bytes to the response's: a
// descriptor's tag, and its bucket's key (a pattern rule's).
func TestShouldRateLimitAllocs(t *testing.T) {
	cfg := envoyTestConfig(t, "domain: edge\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n")
	s := start(t, cfg)
	msg, err := proto.Marshal(&rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", "k1")}})
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	answer := func() {
		out, err = s.grpc.svc.appendAnswer(context.Background(), msg, out[:0])
		var resp rls.RateLimitResponse
		if err != nil || proto.Unmarshal(out, &resp) != nil || resp.OverallCode != rls.RateLimitResponse_OK {
			t.Fatalf("got %v, %v", &resp, err)
		}
	}
	answer()
	out = out[:0]
	got := testing.AllocsPerRun(500, func() {
		out, err = s.grpc.svc.appendAnswer(context.Background(), msg, out[:0])
	})
	bound := 2.0
	if raceEnabled {
		bound = 6 // and a request, an answer and its parts when the pools miss
	}
	t.Logf("%.1f allocations a call", got)
	if got > bound || err != nil {
		t.Errorf("%.1f allocations a call (%v), want at most %v", got, err, bound)
	}
}
