package server

// The gRPC codec of Envoy's rate limit service: ShouldRateLimit's request decoded and its
// response encoded by hand, into messages kept from one call to the next, as vtprotobuf's
// generated code does; every other message (health, reflection) by the protobuf codec.
// The bytes are those of the protobuf library: rlscodec_test.go compares the two.

import (
	"context"
	"errors"
	"sync"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// rlsCodec is the server's gRPC codec (grpc.ForceServerCodecV2). It is safe for
// concurrent use.
type rlsCodec struct {
	proto encoding.CodecV2 // every other message
}

func newRLSCodec() rlsCodec { return rlsCodec{proto: encoding.GetCodecV2("proto")} }

func (rlsCodec) Name() string { return "proto" }

// Marshal encodes v. An *rlsAnswer is encoded as its response and then recycled: gRPC
// hands a response to the codec once, after the handler and its interceptors, and holds
// nothing of it after (the server has no stats handler when it answers with them: see
// rlsService.pooled).
func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	var resp *rls.RateLimitResponse
	a, pooled := v.(*rlsAnswer)
	switch m := v.(type) {
	case *rlsAnswer:
		resp = &m.resp
	case *rls.RateLimitResponse:
		resp = m
	default:
		return c.proto.Marshal(v)
	}
	if !plainResponse(resp) {
		out, err := c.proto.Marshal(resp)
		if pooled {
			a.release()
		}
		return out, err
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(responseSize(resp))
	*buf = appendResponse((*buf)[:0], resp)
	if pooled {
		a.release()
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes data into v: a *rls.RateLimitRequest by decodeRequest, anything else
// by the protobuf codec.
func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*rls.RateLimitRequest)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return decodeRequest(buf.ReadOnlyData(), req)
}

// appendAnswer answers a ShouldRateLimit request's bytes (the lean transport's path: see
// grpcServer.leanCall), appending the response's encoding to out. It fails as grpc-go's
// server does: Internal for bytes that do not decode, the answer's status otherwise.
func (r *rlsService) appendAnswer(ctx context.Context, msg, out []byte) ([]byte, error) {
	req := requests.Get().(*rls.RateLimitRequest)
	defer requests.Put(req) // the answer holds nothing of it
	if err := decodeRequest(msg, req); err != nil {
		return out, status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
	}
	a, err := r.answer(ctx, req)
	if err != nil {
		return out, err
	}
	defer a.release()
	if !plainResponse(&a.resp) {
		return proto.MarshalOptions{}.MarshalAppend(out, &a.resp)
	}
	return appendResponse(out, &a.resp), nil
}

// plainResponse reports whether appendResponse encodes resp: only the fields
// ShouldRateLimit sets.
func plainResponse(r *rls.RateLimitResponse) bool {
	if len(r.RequestHeadersToAdd) > 0 || len(r.RawBody) > 0 || r.DynamicMetadata != nil || r.Quota != nil {
		return false
	}
	for _, st := range r.Statuses {
		if st == nil || st.Quota != nil || (st.CurrentLimit != nil && st.CurrentLimit.UnitMultiplier != nil) {
			return false
		}
	}
	for _, h := range r.ResponseHeadersToAdd {
		if h == nil || len(h.RawValue) > 0 {
			return false
		}
	}
	return true
}

// responseSize is the size of resp's encoding (a plainResponse), or a bound on it.
func responseSize(r *rls.RateLimitResponse) int {
	n := 11 + 16*len(r.Statuses) + 16*len(r.ResponseHeadersToAdd)
	for _, st := range r.Statuses {
		n += 48
		if st.CurrentLimit != nil {
			n += len(st.CurrentLimit.Name)
		}
	}
	for _, h := range r.ResponseHeadersToAdd {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// appendResponse appends the encoding of r (a plainResponse), fields in number order as
// the protobuf library writes them.
func appendResponse(b []byte, r *rls.RateLimitResponse) []byte {
	b = appendVarintField(b, 1, uint64(r.OverallCode))
	for _, st := range r.Statuses {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(statusSize(st)))
		b = appendVarintField(b, 1, uint64(st.Code))
		if l := st.CurrentLimit; l != nil {
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(limitSize(l)))
			b = appendVarintField(b, 1, uint64(l.RequestsPerUnit))
			b = appendVarintField(b, 2, uint64(l.Unit))
			b = appendStringField(b, 3, l.Name)
		}
		b = appendVarintField(b, 3, uint64(st.LimitRemaining))
		if d := st.DurationUntilReset; d != nil {
			b = protowire.AppendTag(b, 4, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(durationSize(d)))
			b = appendVarintField(b, 1, uint64(d.Seconds))
			b = appendVarintField(b, 2, uint64(int64(d.Nanos)))
		}
	}
	for _, h := range r.ResponseHeadersToAdd {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(stringFieldSize(1, h.Key)+stringFieldSize(2, h.Value)))
		b = appendStringField(b, 1, h.Key)
		b = appendStringField(b, 2, h.Value)
	}
	return b
}

// appendVarintField appends field num as a varint, unless v is 0 (proto3's default, not
// written).
func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func varintFieldSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func stringFieldSize(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func limitSize(l *rls.RateLimitResponse_RateLimit) int {
	return varintFieldSize(1, uint64(l.RequestsPerUnit)) + varintFieldSize(2, uint64(l.Unit)) + stringFieldSize(3, l.Name)
}

func durationSize(d *durationpb.Duration) int {
	return varintFieldSize(1, uint64(d.Seconds)) + varintFieldSize(2, uint64(int64(d.Nanos)))
}

func statusSize(st *rls.RateLimitResponse_DescriptorStatus) int {
	n := varintFieldSize(1, uint64(st.Code)) + varintFieldSize(3, uint64(st.LimitRemaining))
	if l := st.CurrentLimit; l != nil {
		n += protowire.SizeTag(2) + protowire.SizeBytes(limitSize(l))
	}
	if d := st.DurationUntilReset; d != nil {
		n += protowire.SizeTag(4) + protowire.SizeBytes(durationSize(d))
	}
	return n
}

// errBadRequest is a request that is not a valid encoding of RateLimitRequest.
var errBadRequest = errors.New("sluice: ShouldRateLimit: the request is not a valid RateLimitRequest")

// decodeRequest decodes b into req as proto.Unmarshal does for the fields ShouldRateLimit
// reads (unknown fields, and known ones of another wire type, are skipped: the protobuf
// library keeps them aside), reusing req's descriptors, entries and strings: a string
// equal to the one req held is kept, not made again. It fails where proto.Unmarshal does
// (malformed wire data, a string that is not UTF-8).
func decodeRequest(b []byte, req *rls.RateLimitRequest) error {
	ds := req.Descriptors[:0]
	req.HitsAddend = 0
	domain := false
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errBadRequest
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !utf8.Valid(v) {
				return errBadRequest
			}
			req.Domain, domain = keepString(req.Domain, v), true
			b = b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errBadRequest
			}
			var d *rlcommon.RateLimitDescriptor
			if len(ds) < cap(ds) && ds[:len(ds)+1][len(ds)] != nil {
				d = ds[:len(ds)+1][len(ds)]
				d.Entries, d.Limit, d.HitsAddend, d.IsNegativeHits = d.Entries[:0], nil, nil, false
			} else {
				d = &rlcommon.RateLimitDescriptor{}
			}
			ds = append(ds, d)
			if err := decodeDescriptor(v, d); err != nil {
				return err
			}
			b = b[n:]
		case num == 3 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errBadRequest
			}
			req.HitsAddend = uint32(v)
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return errBadRequest
			}
			b = b[n:]
		}
	}
	if !domain {
		req.Domain = ""
	}
	req.Descriptors = ds // the spare descriptors beyond it are kept for the next call
	return nil
}

func decodeDescriptor(b []byte, d *rlcommon.RateLimitDescriptor) error {
	es := d.Entries
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errBadRequest
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errBadRequest
			}
			var e *rlcommon.RateLimitDescriptor_Entry
			if len(es) < cap(es) && es[:len(es)+1][len(es)] != nil {
				e = es[:len(es)+1][len(es)]
			} else {
				e = &rlcommon.RateLimitDescriptor_Entry{}
			}
			es = append(es, e)
			if err := decodeEntry(v, e); err != nil {
				return err
			}
			b = b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errBadRequest
			}
			if d.Limit == nil {
				d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, d.Limit); err != nil {
				return errBadRequest
			}
			b = b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errBadRequest
			}
			if d.HitsAddend == nil {
				d.HitsAddend = &wrapperspb.UInt64Value{}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, d.HitsAddend); err != nil {
				return errBadRequest
			}
			b = b[n:]
		case num == 4 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errBadRequest
			}
			d.IsNegativeHits = protowire.DecodeBool(v)
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return errBadRequest
			}
			b = b[n:]
		}
	}
	d.Entries = es
	return nil
}

func decodeEntry(b []byte, e *rlcommon.RateLimitDescriptor_Entry) error {
	key, value := false, false
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errBadRequest
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !utf8.Valid(v) {
				return errBadRequest
			}
			if num == 1 {
				e.Key, key = keepString(e.Key, v), true
			} else {
				e.Value, value = keepString(e.Value, v), true
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return errBadRequest
		}
		b = b[n:]
	}
	if !key {
		e.Key = ""
	}
	if !value {
		e.Value = ""
	}
	return nil
}

// consumeTag reads a field's tag as the protobuf library does: a field number from 1 to
// protowire.MaxValidNumber.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	v, n := protowire.ConsumeVarint(b)
	if n < 0 || v>>3 < uint64(protowire.MinValidNumber) || v>>3 > uint64(protowire.MaxValidNumber) {
		return 0, 0, -1
	}
	return protowire.Number(v >> 3), protowire.Type(v & 7), n
}

// keepString returns old if it holds the bytes v, else v as a new string.
func keepString(old string, v []byte) string {
	if old == string(v) { // compared without a conversion
		return old
	}
	return string(v)
}

// rlsAnswer is a response of ShouldRateLimit with its statuses' parts, kept from one call
// to the next in a pool: the codec recycles an answer once it has encoded it (see
// rlsService.handle).
type rlsAnswer struct {
	resp     rls.RateLimitResponse
	statuses []*rls.RateLimitResponse_DescriptorStatus // made once each, with their parts
	limits   []*rls.RateLimitResponse_RateLimit
	resets   []*durationpb.Duration
}

var answers = sync.Pool{New: func() any { return new(rlsAnswer) }}

// newAnswer returns an answer of n statuses, each OK without a limit, the response OK.
func newAnswer(n int) *rlsAnswer {
	a := answers.Get().(*rlsAnswer)
	for len(a.statuses) < n {
		a.statuses = append(a.statuses, &rls.RateLimitResponse_DescriptorStatus{})
		a.limits = append(a.limits, &rls.RateLimitResponse_RateLimit{})
		a.resets = append(a.resets, &durationpb.Duration{})
	}
	a.resp.OverallCode = rls.RateLimitResponse_OK
	a.resp.Statuses = a.statuses[:n]
	for _, st := range a.resp.Statuses {
		st.Code, st.CurrentLimit, st.LimitRemaining, st.DurationUntilReset = rls.RateLimitResponse_OK, nil, 0, nil
	}
	return a
}

// release puts a back in the pool.
func (a *rlsAnswer) release() {
	a.resp.ResponseHeadersToAdd = nil
	answers.Put(a)
}
