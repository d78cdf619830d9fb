package hits

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The wire form of a report, one codec for every transport (UDP packets, streams, the
// simulator's byte counts). A message is one or more parts back to back; each part is a
// report with some of the entries, complete in itself (counts are cumulative, so parts
// need no reassembly and a lost part loses nothing the next report does not carry):
//
//	version 1 | kind 1 | uvarint len, from | uvarint inc | uvarint seq | uvarint n | n entries
//	entry: uvarint len, tag | uvarint gen | uvarint hits | uvarint recent | uvarint demand | uvarint hold_ns
const (
	Version    = 1
	kindReport = 1

	// MaxName bounds a node's name on the wire.
	MaxName = 255
	// MaxTag bounds a tag on the wire (the daemon's longest query line).
	MaxTag = 1 << 20
	// minEntry is the smallest entry: six one-byte fields.
	minEntry = 6
)

// ErrMalformed is wrapped by the errors of Decode.
var ErrMalformed = errors.New("sluice: gossip: malformed message")

// Encode writes r as parts of at most max bytes each (the header repeated in each), so
// that a datagram carries a part whole. An entry too large for a part alone (a tag near
// max bytes) is left out and counted in skipped; the caller sends such a report over a
// stream with a larger max. max must hold a header (at least MaxName + 40 bytes).
func Encode(r *Report, max int) (parts [][]byte, skipped int) {
	head := appendHeader(nil, r)
	var cur []byte
	var n int
	var countAt int
	flush := func() {
		if n > 0 {
			parts = append(parts, patchCount(cur, countAt, n))
		}
		cur, n = nil, 0
	}
	start := func() {
		// Room for a datagram's worth: a stream's part (max of megabytes) grows as
		// entries come, instead of a buffer of max bytes zeroed for every report.
		cur = append(make([]byte, 0, min(max, 2048)), head...)
		countAt = len(cur)
		cur = append(cur, 0, 0, 0, 0, 0) // room for the count: a uvarint of up to 5 bytes
	}
	var buf []byte
	for i := range r.Entries {
		buf = appendEntry(buf[:0], &r.Entries[i])
		if len(head)+5+len(buf) > max {
			skipped++
			continue
		}
		if cur == nil {
			start()
		}
		if len(cur)+len(buf) > max {
			flush()
			start()
		}
		cur = append(cur, buf...)
		n++
	}
	if cur != nil || len(parts) == 0 {
		if cur == nil {
			start() // a report with no entries is a heartbeat
		}
		parts = append(parts, patchCount(cur, countAt, n))
	}
	return parts, skipped
}

func appendHeader(b []byte, r *Report) []byte {
	from := r.From
	if len(from) > MaxName {
		from = from[:MaxName]
	}
	b = append(b, Version, kindReport)
	b = binary.AppendUvarint(b, uint64(len(from)))
	b = append(b, from...)
	b = binary.AppendUvarint(b, r.Inc)
	return binary.AppendUvarint(b, r.Seq)
}

func appendEntry(b []byte, e *Entry) []byte {
	b = binary.AppendUvarint(b, uint64(len(e.Tag)))
	b = append(b, e.Tag...)
	b = binary.AppendUvarint(b, e.Gen)
	b = binary.AppendUvarint(b, e.Hits)
	b = binary.AppendUvarint(b, e.Recent)
	b = binary.AppendUvarint(b, e.Demand)
	return binary.AppendUvarint(b, uint64(max(0, e.Hold)))
}

// patchCount writes n into the 5 bytes reserved at at, as a padded uvarint (continuation
// bits on the leading bytes), so the part needs no copy.
func patchCount(b []byte, at, n int) []byte {
	v := uint64(n)
	for i := range 4 {
		b[at+i] = byte(v&0x7f) | 0x80
		v >>= 7
	}
	b[at+4] = byte(v & 0x7f)
	return b
}

// Decode reads a message: one or more parts. Entries' tags are copied out of b.
func Decode(b []byte) ([]Report, error) {
	var out []Report
	for len(b) > 0 {
		r, rest, err := decodePart(b)
		if err != nil {
			return out, err
		}
		out = append(out, r)
		b = rest
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrMalformed)
	}
	return out, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: bad number", ErrMalformed)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes(max uint64) string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > max || n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: string of %d bytes", ErrMalformed, n)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func decodePart(b []byte) (Report, []byte, error) {
	if len(b) < 2 {
		return Report{}, nil, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	if b[0] != Version {
		return Report{}, nil, fmt.Errorf("%w: version %d (this node speaks %d)", ErrMalformed, b[0], Version)
	}
	if b[1] != kindReport {
		return Report{}, nil, fmt.Errorf("%w: kind %d", ErrMalformed, b[1])
	}
	rd := reader{b: b[2:]}
	var r Report
	r.From = rd.bytes(MaxName)
	r.Inc = rd.uvarint()
	r.Seq = rd.uvarint()
	n := rd.uvarint()
	if rd.err == nil && n > uint64(len(rd.b)/minEntry) {
		return Report{}, nil, fmt.Errorf("%w: %d entries in %d bytes", ErrMalformed, n, len(rd.b))
	}
	if rd.err == nil && r.From == "" {
		return Report{}, nil, fmt.Errorf("%w: no sender", ErrMalformed)
	}
	if n > 0 {
		r.Entries = make([]Entry, 0, n)
	}
	for range n {
		if rd.err != nil {
			break
		}
		e := Entry{Tag: rd.bytes(MaxTag)}
		e.Gen = rd.uvarint()
		e.Hits = rd.uvarint()
		e.Recent = rd.uvarint()
		e.Demand = rd.uvarint()
		h := rd.uvarint()
		if h > 1<<62 {
			h = 1 << 62
		}
		e.Hold = int64(h)
		r.Entries = append(r.Entries, e)
	}
	if rd.err != nil {
		return Report{}, nil, rd.err
	}
	return r, rd.b, nil
}
