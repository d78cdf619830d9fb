package hits

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/sluicehq/sluice/internal/classboard"

	"github.com/sluicehq/sluice/gcra"
)

// The wire form of a report, one codec for every transport (UDP packets, streams, the
// simulator's byte counts). A message is one or more parts back to back; each part is a
// report with some of the entries, complete in itself (counts are cumulative, so parts
// need no reassembly and a lost part loses nothing the next report does not carry):
//
//	version 1 | kind 1 | uvarint len, from | uvarint inc | uvarint seq | uvarint n | n entries
//	entry: uvarint len, tag | uvarint gen | uvarint hits | uvarint recent | uvarint demand | uvarint hold_ns
//
// A report with an owner's bookings (an entry whose Booked is set) is of kind 2, its
// entries each followed by uvarint booked_ns; a node that knows only kind 1 counts such a
// report as malformed (docs/gossip.md: upgrade a pool's daemons together).
//
// Over a tag's tree (pools of more than MeshMax nodes) a report is of kind 5 (up: a
// subtree's aggregates, to the tags' parent) or 6 (down: the pool's, from the tags' root),
// with the same header:
//
//	up entry:   uvarint len, tag | uvarint gen | uvarint hits | uvarint recent | uvarint hold_ns |
//	            uvarint n | n × (uvarint bin | uvarint count)
//	down entry: uvarint len, tag | uvarint root | uvarint gen | uvarint seq | uvarint hits |
//	            uvarint recent | uvarint hold_ns | uvarint booked_ns | uvarint level |
//	            uvarint demand | uvarint nodes
//
// A node of an earlier release counts them as malformed: docs/gossip.md says how to
// upgrade a pool of more than MeshMax daemons.
const (
	Version    = 1
	kindReport = 1
	kindBooked = 2
	// KindUp and KindDown are the kinds of a tree's reports (Report.Tree).
	KindUp   = 5
	KindDown = 6
	// maxBins bounds an up entry's histogram on the wire.
	maxBins = 4096

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
	kind := head[1]
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
		buf = appendEntry(buf[:0], &r.Entries[i], kind)
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
	kind := r.Tree
	if kind == 0 {
		kind = reportKind(r)
	}
	b = append(b, Version, kind)
	b = binary.AppendUvarint(b, uint64(len(from)))
	b = append(b, from...)
	b = binary.AppendUvarint(b, r.Inc)
	return binary.AppendUvarint(b, r.Seq)
}

// reportKind is kind 2 when an entry carries a booking, kind 1 otherwise.
func reportKind(r *Report) byte {
	for i := range r.Entries {
		if r.Entries[i].Booked > 0 {
			return kindBooked
		}
	}
	return kindReport
}

func appendEntry(b []byte, e *Entry, kind byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(e.Tag)))
	b = append(b, e.Tag...)
	switch kind {
	case KindUp:
		b = binary.AppendUvarint(b, e.Gen)
		b = binary.AppendUvarint(b, e.Hits)
		b = binary.AppendUvarint(b, e.Recent)
		b = binary.AppendUvarint(b, uint64(max(0, e.Hold)))
		b = binary.AppendUvarint(b, uint64(len(e.Bins)))
		for _, x := range e.Bins {
			b = binary.AppendUvarint(b, uint64(x.Idx))
			b = binary.AppendUvarint(b, uint64(x.Count))
		}
		return b
	case KindDown:
		for _, v := range []uint64{e.Root, e.Gen, e.Seq, e.Hits, e.Recent, uint64(max(0, e.Hold)), uint64(max(0, e.Booked)), e.Level, e.Demand, e.Nodes} {
			b = binary.AppendUvarint(b, v)
		}
		return b
	}
	b = binary.AppendUvarint(b, e.Gen)
	b = binary.AppendUvarint(b, e.Hits)
	b = binary.AppendUvarint(b, e.Recent)
	b = binary.AppendUvarint(b, e.Demand)
	b = binary.AppendUvarint(b, uint64(max(0, e.Hold)))
	if kind == kindBooked {
		b = binary.AppendUvarint(b, uint64(max(0, e.Booked)))
	}
	return b
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
	kind := b[1]
	if kind != kindReport && kind != kindBooked && kind != KindUp && kind != KindDown {
		return Report{}, nil, fmt.Errorf("%w: kind %d", ErrMalformed, b[1])
	}
	rd := reader{b: b[2:]}
	var r Report
	if kind == KindUp || kind == KindDown {
		r.Tree = kind
	}
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
		switch kind {
		case KindUp:
			decodeUp(&rd, &e)
			r.Entries = append(r.Entries, e)
			continue
		case KindDown:
			decodeDown(&rd, &e)
			r.Entries = append(r.Entries, e)
			continue
		}
		e.Gen = rd.uvarint()
		e.Hits = rd.uvarint()
		e.Recent = rd.uvarint()
		e.Demand = rd.uvarint()
		h := rd.uvarint()
		if h > 1<<62 {
			h = 1 << 62
		}
		e.Hold = int64(h)
		if kind == kindBooked {
			e.Booked = int64(min(rd.uvarint(), 1<<62))
		}
		r.Entries = append(r.Entries, e)
	}
	if rd.err != nil {
		return Report{}, nil, rd.err
	}
	return r, rd.b, nil
}

func capped(rd *reader) int64 { return int64(min(rd.uvarint(), 1<<62)) }

func decodeUp(rd *reader, e *Entry) {
	e.Gen = rd.uvarint()
	e.Hits = rd.uvarint()
	e.Recent = rd.uvarint()
	e.Hold = capped(rd)
	k := rd.uvarint()
	if rd.err == nil && (k > maxBins || k > uint64(len(rd.b)/2)) {
		rd.err = fmt.Errorf("%w: %d bins", ErrMalformed, k)
	}
	for range k {
		if rd.err != nil {
			return
		}
		idx, c := rd.uvarint(), rd.uvarint()
		if rd.err == nil && (idx > math.MaxUint32 || c > math.MaxUint32) {
			rd.err = fmt.Errorf("%w: bin %d of %d", ErrMalformed, idx, c)
		}
		e.Bins = append(e.Bins, Bin{Idx: uint32(idx), Count: uint32(c)})
	}
	if rd.err == nil && !slices.IsSortedFunc(e.Bins, func(a, b Bin) int { return int(a.Idx) - int(b.Idx) }) {
		rd.err = fmt.Errorf("%w: bins out of order", ErrMalformed)
	}
}

func decodeDown(rd *reader, e *Entry) {
	e.Root = rd.uvarint()
	e.Gen = rd.uvarint()
	e.Seq = rd.uvarint()
	e.Hits = rd.uvarint()
	e.Recent = rd.uvarint()
	e.Hold = capped(rd)
	e.Booked = capped(rd)
	e.Level = rd.uvarint()
	e.Demand = rd.uvarint()
	e.Nodes = rd.uvarint()
}

// Forwarded decisions (Policy Owner and Auto): a node asks a tag's owner, the owner
// answers. A message carries the asks a node had for one owner at once, and the owner
// answers them in one message; each fits a datagram unless a tag is long:
//
//	asks:    version 1 | kind 3 | uvarint len, from | uvarint n | n asks
//	ask:     uvarint id | uvarint len, tag | uvarint n | uvarint max_delay_ns | uvarint k |
//	         k × (uvarint t_ns | uvarint tau_ns)
//	answers: version 1 | kind 4 | uvarint n | n answers
//	answer:  uvarint id | byte outcome | uvarint delay_ns | uvarint retry_after_ns |
//	         uvarint remaining | uvarint reset_after_ns
//
// Asks of which one keeps part of the burst for a higher class (Ask.Kept) are of kind 8,
// each ask followed by what it keeps of each limit's burst:
//
//	ask, kind 8: ask | k × uvarint keep_ns (Limits[i].Tau - Kept[i].Tau; 0: none)
//
// A node of an earlier release counts kind 8 as malformed: a node sends it only to a peer
// that says it reads it (package gossip: the membership's node meta).
const (
	KindAsk    = 3
	KindAnswer = 4
	// KindAskKept is asks of which some keep part of the burst (Ask.Kept).
	KindAskKept = 8
)

// Ask is a request forwarded to a tag's owner: Decide's arguments but now, which is the
// owner's. Its limits are GCRA limits (no window: Route keeps windowed limits here).
type Ask struct {
	ID       uint64 // the asker's, echoed in the answer
	Tag      string
	N        int64
	MaxDelay int64
	Limits   []gcra.Limit
	// Kept, if set, are the limits the decision is made under (DecideKept): Limits with
	// part of each burst kept for a higher class. nil: Limits.
	Kept []gcra.Limit
}

// Outcomes of an Answer.
const (
	Denied    = 0 // not granted (Result.RetryAfter says when to ask again)
	Granted   = 1
	TooMany   = 2 // the owner holds MaxTags: ErrTooManyTags
	Malformed = 3 // the owner refused the ask's arguments (bad limits or cost)
)

// Answer is an owner's decision of an Ask.
type Answer struct {
	ID      uint64
	Outcome byte
	Result  gcra.Result // Allowed is Outcome == Granted; Delay counts from the owner's decision
}

// MessageKind returns the kind of message b is: a report's (1, 2, 5 or 6), asks (3 or
// 8), answers (4) or classes (7); 0 if it is none.
func MessageKind(b []byte) byte {
	if len(b) < 2 || b[0] != Version {
		return 0
	}
	return b[1]
}

// AsksHeader is the bytes of an asks message before its asks, for a sender name of n
// bytes (at most): a sender packs asks while the message fits a datagram.
func AsksHeader(n int) int { return 2 + 2 + n + 5 }

// AppendAsk appends one ask's wire form to b (for sizing a batch: AsksHeader plus the
// asks' forms is the message's size), in a message of kind 8 if it keeps part of the
// burst (Kept). In a message of kind 8 an ask that keeps nothing takes a byte more per
// limit.
func AppendAsk(b []byte, a *Ask) []byte { return appendAsk(b, a, a.Kept != nil) }

func appendAsk(b []byte, a *Ask, kept bool) []byte {
	b = binary.AppendUvarint(b, a.ID)
	b = binary.AppendUvarint(b, uint64(len(a.Tag)))
	b = append(b, a.Tag...)
	b = binary.AppendUvarint(b, uint64(max(0, a.N)))
	b = binary.AppendUvarint(b, uint64(max(0, a.MaxDelay)))
	b = binary.AppendUvarint(b, uint64(len(a.Limits)))
	for _, l := range a.Limits {
		b = binary.AppendUvarint(b, uint64(l.T))
		b = binary.AppendUvarint(b, uint64(l.Tau))
	}
	if kept {
		for i, l := range a.Limits {
			var keep int64
			if i < len(a.Kept) {
				keep = max(0, l.Tau-a.Kept[i].Tau)
			}
			b = binary.AppendUvarint(b, uint64(keep))
		}
	}
	return b
}

// EncodeAsks writes asks from the node named from as one message: of kind 8 if one of
// them keeps part of the burst (Kept), of kind 3 otherwise.
func EncodeAsks(from string, asks []Ask) []byte {
	kind := byte(KindAsk)
	for i := range asks {
		if asks[i].Kept != nil {
			kind = KindAskKept
		}
	}
	b := make([]byte, 0, AsksHeader(len(from))+32*len(asks))
	b = append(b, Version, kind)
	b = binary.AppendUvarint(b, uint64(len(from)))
	b = append(b, from...)
	b = binary.AppendUvarint(b, uint64(len(asks)))
	for i := range asks {
		b = appendAsk(b, &asks[i], kind == KindAskKept)
	}
	return b
}

// DecodeAsks reads an asks message, of kind 3 or 8: its sender and asks (their limits are
// checked by the owner's Decide). An ask of kind 8 that keeps nothing has no Kept.
func DecodeAsks(b []byte) (from string, asks []Ask, err error) {
	kind := MessageKind(b)
	if kind != KindAsk && kind != KindAskKept {
		return "", nil, fmt.Errorf("%w: not asks", ErrMalformed)
	}
	rd := reader{b: b[2:]}
	from = rd.bytes(MaxName)
	n := rd.uvarint()
	if rd.err == nil && (from == "" || n == 0 || n > uint64(len(rd.b)/minAsk)) {
		return "", nil, fmt.Errorf("%w: %d asks in %d bytes", ErrMalformed, n, len(rd.b))
	}
	for range n {
		if rd.err != nil {
			break
		}
		var a Ask
		a.ID = rd.uvarint()
		a.Tag = rd.bytes(MaxTag)
		a.N = int64(min(rd.uvarint(), 1<<62))
		a.MaxDelay = int64(min(rd.uvarint(), 1<<62))
		k := rd.uvarint()
		if rd.err == nil && (k < 1 || k > gcra.MaxLimits) {
			return "", nil, fmt.Errorf("%w: %d limits", ErrMalformed, k)
		}
		for range k {
			if rd.err != nil {
				break
			}
			a.Limits = append(a.Limits, gcra.Limit{T: int64(min(rd.uvarint(), 1<<62)), Tau: int64(min(rd.uvarint(), 1<<62))})
		}
		if kind == KindAskKept {
			a.Kept = decodeKept(&rd, a.Limits)
		}
		asks = append(asks, a)
	}
	if rd.err == nil && len(rd.b) != 0 {
		return "", nil, fmt.Errorf("%w: %d bytes after the asks", ErrMalformed, len(rd.b))
	}
	if rd.err != nil {
		return "", nil, rd.err
	}
	return from, asks, nil
}

// minAsk is the smallest ask: five one-byte fields and one limit of two.
const minAsk = 7

// EncodeAnswers writes answers as one message.
func EncodeAnswers(as []Answer) []byte {
	b := make([]byte, 0, 8+24*len(as))
	b = append(b, Version, KindAnswer)
	b = binary.AppendUvarint(b, uint64(len(as)))
	for i := range as {
		a := &as[i]
		b = binary.AppendUvarint(b, a.ID)
		b = append(b, a.Outcome)
		r := &a.Result
		b = binary.AppendUvarint(b, uint64(max(0, r.Delay)))
		b = binary.AppendUvarint(b, uint64(max(0, r.RetryAfter)))
		b = binary.AppendUvarint(b, uint64(max(0, r.Remaining)))
		b = binary.AppendUvarint(b, uint64(max(0, r.ResetAfter)))
	}
	return b
}

// DecodeAnswers reads an answers message.
func DecodeAnswers(b []byte) ([]Answer, error) {
	if MessageKind(b) != KindAnswer {
		return nil, fmt.Errorf("%w: not answers", ErrMalformed)
	}
	rd := reader{b: b[2:]}
	n := rd.uvarint()
	if rd.err == nil && (n == 0 || n > uint64(len(rd.b)/minAnswer)) {
		return nil, fmt.Errorf("%w: %d answers in %d bytes", ErrMalformed, n, len(rd.b))
	}
	var out []Answer
	for range n {
		if rd.err != nil {
			break
		}
		var a Answer
		a.ID = rd.uvarint()
		if rd.err == nil {
			if len(rd.b) == 0 {
				rd.err = fmt.Errorf("%w: answer", ErrMalformed)
				break
			}
			a.Outcome = rd.b[0]
			rd.b = rd.b[1:]
		}
		a.Result.Allowed = a.Outcome == Granted
		a.Result.Delay = int64(min(rd.uvarint(), 1<<62))
		a.Result.RetryAfter = int64(min(rd.uvarint(), 1<<62))
		a.Result.Remaining = int64(min(rd.uvarint(), 1<<62))
		a.Result.ResetAfter = int64(min(rd.uvarint(), 1<<62))
		if rd.err == nil && a.Outcome > Malformed {
			return nil, fmt.Errorf("%w: outcome %d", ErrMalformed, a.Outcome)
		}
		out = append(out, a)
	}
	if rd.err == nil && len(rd.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the answers", ErrMalformed, len(rd.b))
	}
	if rd.err != nil {
		return nil, rd.err
	}
	return out, nil
}

// minAnswer is the smallest answer: six one-byte fields.
const minAnswer = 6

// decodeKept reads an ask's keeps (kind 8) and returns its kept limits, nil if it keeps
// nothing. A keep that leaves less than one permit of a burst is malformed.
func decodeKept(rd *reader, limits []gcra.Limit) []gcra.Limit {
	var kept []gcra.Limit
	for i, l := range limits {
		keep := int64(min(rd.uvarint(), 1<<62))
		if rd.err != nil {
			return nil
		}
		if keep == 0 {
			continue
		}
		if keep > l.Tau-l.T {
			rd.err = fmt.Errorf("%w: keep %d of tau %d", ErrMalformed, keep, l.Tau)
			return nil
		}
		if kept == nil {
			kept = slices.Clone(limits)
		}
		kept[i].Tau -= keep
	}
	return kept
}

// The board of classes (classes.go): a message of posts of a node's callers' classes to
// tags' boards' owners, of reads of those boards, or of an owner's replies:
//
//	classes: version 1 | kind 7 | uvarint len, from | uvarint n | n entries
//	entry:   uvarint len, tag | byte flags | for each class flag set (critical, then
//	         standard): uvarint ago_ns | uvarint lasts_ns
//
// A node of an earlier release counts it as malformed, and ignores it: a node sends it
// only to a peer that says it reads it (package gossip: the membership's node meta).
const KindClasses = 7

// ClassesHeader is the bytes of a classes message before its entries, for a sender name
// of n bytes (at most).
func ClassesHeader(n int) int { return 2 + 2 + n + 5 }

// AppendClassEntry appends one entry's wire form to b (for sizing a batch).
func AppendClassEntry(b []byte, e *ClassEntry) []byte {
	b = binary.AppendUvarint(b, uint64(len(e.Tag)))
	b = append(b, e.Tag...)
	b = append(b, e.Flags&flagsKnown)
	for i := range classboard.Classes {
		if e.Flags&(1<<i) != 0 {
			b = binary.AppendUvarint(b, uint64(max(0, e.Ago[i])))
			b = binary.AppendUvarint(b, uint64(max(0, e.Lasts[i])))
		}
	}
	return b
}

// EncodeClasses writes entries from the node named from as one message.
func EncodeClasses(from string, entries []ClassEntry) []byte {
	b := make([]byte, 0, ClassesHeader(len(from))+24*len(entries))
	b = append(b, Version, KindClasses)
	b = binary.AppendUvarint(b, uint64(len(from)))
	b = append(b, from...)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for i := range entries {
		b = AppendClassEntry(b, &entries[i])
	}
	return b
}

// DecodeClasses reads a classes message: its sender and entries.
func DecodeClasses(b []byte) (from string, entries []ClassEntry, err error) {
	if MessageKind(b) != KindClasses {
		return "", nil, fmt.Errorf("%w: not classes", ErrMalformed)
	}
	rd := reader{b: b[2:]}
	from = rd.bytes(MaxName)
	n := rd.uvarint()
	if rd.err == nil && (from == "" || n == 0 || n > uint64(len(rd.b)/minClassEntry)) {
		return "", nil, fmt.Errorf("%w: %d class entries in %d bytes", ErrMalformed, n, len(rd.b))
	}
	for range n {
		if rd.err != nil {
			break
		}
		e := ClassEntry{Tag: rd.bytes(MaxTag)}
		if rd.err == nil {
			if len(rd.b) == 0 {
				rd.err = fmt.Errorf("%w: class entry", ErrMalformed)
				break
			}
			e.Flags = rd.b[0]
			rd.b = rd.b[1:]
			if e.Flags&^flagsKnown != 0 {
				rd.err = fmt.Errorf("%w: class flags %#x", ErrMalformed, e.Flags)
				break
			}
		}
		for i := range classboard.Classes {
			if e.Flags&(1<<i) != 0 {
				e.Ago[i] = int64(min(rd.uvarint(), 1<<62))
				e.Lasts[i] = int64(min(rd.uvarint(), 1<<62))
			}
		}
		entries = append(entries, e)
	}
	if rd.err == nil && len(rd.b) != 0 {
		return "", nil, fmt.Errorf("%w: %d bytes after the class entries", ErrMalformed, len(rd.b))
	}
	if rd.err != nil {
		return "", nil, rd.err
	}
	return from, entries, nil
}

// minClassEntry is the smallest class entry: a tag's length and the flags.
const minClassEntry = 2
