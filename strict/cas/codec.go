package cas

import (
	"encoding/binary"
	"fmt"

	"github.com/sluicehq/sluice/internal/classboard"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/store"
)

// FormatVersion is the version of a key's record, its first byte after the magic. A
// release that changes the format changes it (and the record names' prefix), so that
// processes of two releases never read each other's state.
const FormatVersion = 1

// magic opens every record: a record that does not begin with it is not this mode's.
const magic = 's'

// state is one key's GCRA state: the end of its latest penalty (0 if none) and one TAT
// per limit, by position (a key's first limit is its first TAT, whatever the others).
type state struct {
	hold int64
	tats []int64
}

// headerLen is the magic, the version and the number of TATs.
const headerLen = 3

// marshal writes st as a record: 's', FormatVersion, the number of TATs, then the hold
// and each TAT as big-endian int64s. The one writer of the format; unmarshal the reader.
func marshal(st state) []byte {
	b := make([]byte, headerLen+8*(1+len(st.tats)))
	b[0], b[1], b[2] = magic, FormatVersion, byte(len(st.tats))
	binary.BigEndian.PutUint64(b[headerLen:], uint64(st.hold))
	for i, t := range st.tats {
		binary.BigEndian.PutUint64(b[headerLen+8*(1+i):], uint64(t))
	}
	return b
}

// unmarshal reads a record that marshal wrote, or fails with store.ErrBadRecord.
func unmarshal(b []byte) (state, error) {
	if len(b) < headerLen || b[0] != magic {
		return state{}, fmt.Errorf("%w: not a strict-mode record (%d bytes)", store.ErrBadRecord, len(b))
	}
	if b[1] != FormatVersion {
		return state{}, fmt.Errorf("%w: record format %d, this release reads %d", store.ErrBadRecord, b[1], FormatVersion)
	}
	k := int(b[2])
	if k > gcra.MaxLimits || len(b) != headerLen+8*(1+k) {
		return state{}, fmt.Errorf("%w: a record of %d TATs in %d bytes", store.ErrBadRecord, k, len(b))
	}
	st := state{hold: int64(binary.BigEndian.Uint64(b[headerLen:])), tats: make([]int64, k)}
	for i := range st.tats {
		st.tats[i] = int64(binary.BigEndian.Uint64(b[headerLen+8*(1+i):]))
	}
	return st, nil
}

// latest is the last time the state holds (its hold or a TAT): after it the key decides
// as a fresh one.
func (st state) latest() int64 {
	l := st.hold
	for _, t := range st.tats {
		l = max(l, t)
	}
	return l
}

// fit makes st hold exactly k TATs: missing ones are fresh (0), extra ones are dropped (a
// key's limits changed: those of a limit it no longer has are forgotten).
func (st *state) fit(k int) {
	for len(st.tats) < k {
		st.tats = append(st.tats, 0)
	}
	st.tats = st.tats[:k]
}

// boardMagic opens every board of classes' record (classes.go): a record that does not
// begin with it is not a board.
const boardMagic = 'c'

// boardLen is a board's record: the magic, the version, and each class's post.
const boardLen = 2 + 16*len(classboard.Classes)

// marshalBoard writes bd as a record: 'c', FormatVersion, then for the critical and the
// standard class the store's time of its last post and how long the post lasts, as
// big-endian int64s (0 and 0: not posted). The one writer of the format; unmarshalBoard
// the reader.
func marshalBoard(bd board) []byte {
	b := make([]byte, boardLen)
	b[0], b[1] = boardMagic, FormatVersion
	for i, p := range bd {
		binary.BigEndian.PutUint64(b[2+16*i:], uint64(p.At))
		binary.BigEndian.PutUint64(b[2+16*i+8:], uint64(p.Lasts))
	}
	return b
}

// unmarshalBoard reads a record that marshalBoard wrote, or fails with
// store.ErrBadRecord.
func unmarshalBoard(b []byte) (board, error) {
	if len(b) < 2 || b[0] != boardMagic {
		return board{}, fmt.Errorf("%w: not a board of classes (%d bytes)", store.ErrBadRecord, len(b))
	}
	if b[1] != FormatVersion {
		return board{}, fmt.Errorf("%w: board format %d, this release reads %d", store.ErrBadRecord, b[1], FormatVersion)
	}
	if len(b) != boardLen {
		return board{}, fmt.Errorf("%w: a board of %d bytes, want %d", store.ErrBadRecord, len(b), boardLen)
	}
	var bd board
	for i := range bd {
		bd[i] = classboard.Post{At: int64(binary.BigEndian.Uint64(b[2+16*i:])), Lasts: int64(binary.BigEndian.Uint64(b[2+16*i+8:]))}
	}
	return bd, nil
}
