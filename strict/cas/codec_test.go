package cas

import (
	"errors"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/store"
)

func TestCodecRoundTrip(t *testing.T) {
	for i, st := range []state{
		{},
		{hold: 5, tats: []int64{1}},
		{hold: -1, tats: []int64{gcra.MaxTAT, 0, -7, 1 << 62}},
	} {
		got, err := unmarshal(marshal(st))
		if err != nil || got.hold != st.hold || !slices.Equal(got.tats, st.tats) && len(st.tats) > 0 {
			t.Errorf("step %d: got %+v %v, want %+v", i, got, err, st)
		}
	}
}

func TestCodecRefusesOthers(t *testing.T) {
	good := marshal(state{hold: 1, tats: []int64{2, 3}})
	bad := [][]byte{
		nil,
		[]byte("s"),
		[]byte("hello world, not a record"),
		append([]byte{magic, FormatVersion + 1}, good[2:]...),
		good[:len(good)-1],
		append(slices.Clone(good), 0),
		{magic, FormatVersion, gcra.MaxLimits + 1},
	}
	for i, b := range bad {
		if _, err := unmarshal(b); !errors.Is(err, store.ErrBadRecord) {
			t.Errorf("step %d: %q: got %v, want ErrBadRecord", i, b, err)
		}
	}
}

func FuzzCodec(f *testing.F) {
	f.Add(marshal(state{hold: 1, tats: []int64{2, 3}}))
	f.Add([]byte{})
	f.Add([]byte{magic, FormatVersion, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := unmarshal(b)
		if err != nil {
			if !errors.Is(err, store.ErrBadRecord) {
				t.Fatalf("%q: %v, not ErrBadRecord", b, err)
			}
			return
		}
		if again := marshal(st); !slices.Equal(again, b) {
			t.Fatalf("%q read as %+v, written back as %q", b, st, again)
		}
	})
}

func TestBoardCodecRoundTrip(t *testing.T) {
	for i, bd := range []board{
		{},
		{{At: 5, Lasts: 1}},
		{{At: -1, Lasts: 1 << 62}, {At: 1 << 62, Lasts: 7}},
	} {
		got, err := unmarshalBoard(marshalBoard(bd))
		if err != nil || got != bd {
			t.Errorf("step %d: got %+v %v, want %+v", i, got, err, bd)
		}
	}
}

func TestBoardCodecRefusesOthers(t *testing.T) {
	good := marshalBoard(board{{At: 1, Lasts: 2}})
	bad := [][]byte{
		nil,
		[]byte("c"),
		marshal(state{hold: 1, tats: []int64{2, 3}}), // a key's state
		append([]byte{boardMagic, FormatVersion + 1}, good[2:]...),
		good[:len(good)-1],
		append(slices.Clone(good), 0),
	}
	for i, b := range bad {
		if _, err := unmarshalBoard(b); !errors.Is(err, store.ErrBadRecord) {
			t.Errorf("step %d: %q: got %v, want ErrBadRecord", i, b, err)
		}
	}
	if _, err := unmarshal(good); !errors.Is(err, store.ErrBadRecord) {
		t.Errorf("a board read as a key's state: got %v, want ErrBadRecord", err)
	}
}

func FuzzBoardCodec(f *testing.F) {
	f.Add(marshalBoard(board{{At: 1, Lasts: 2}}))
	f.Add([]byte{})
	f.Add([]byte{boardMagic, FormatVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		bd, err := unmarshalBoard(b)
		if err != nil {
			if !errors.Is(err, store.ErrBadRecord) {
				t.Fatalf("%q: %v, not ErrBadRecord", b, err)
			}
			return
		}
		if again := marshalBoard(bd); !slices.Equal(again, b) {
			t.Fatalf("%q read as %+v, written back as %q", b, bd, again)
		}
	})
}
