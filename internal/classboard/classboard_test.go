package classboard

import (
	"testing"

	"github.com/sluicehq/sluice/priority"
)

// TestBoard: a post counts from its time for as long as it lasts; Ago says how long ago
// each class posted, Keep how long the board lasts and forgets the posts over.
func TestBoard(t *testing.T) {
	if Index(priority.Critical) != 0 || Index(priority.Standard) != 1 || Index(priority.Sheddable) != -1 {
		t.Fatalf("Index: %d %d %d, want 0 1 -1", Index(priority.Critical), Index(priority.Standard), Index(priority.Sheddable))
	}
	var b Board
	if b.Live(0) || b.Ago(0) != [2]int64{-1, -1} || b.Keep(0) != 0 {
		t.Fatalf("an empty board: live %v, ago %v", b.Live(0), b.Ago(0))
	}
	b[0] = Post{At: 10, Lasts: 100}
	b[1] = Post{At: 50, Lasts: 20}
	if got := b.Ago(60); got != [2]int64{50, 10} {
		t.Errorf("Ago(60) = %v, want [50 10]", got)
	}
	if got := b.Ago(70); got != [2]int64{60, -1} { // the standard post ends at 70
		t.Errorf("Ago(70) = %v, want [60 -1]", got)
	}
	if k := b.Keep(70); k != 40 || b[1] != (Post{}) || !b.Live(109) {
		t.Errorf("Keep(70) = %d, board %v: want 40, the standard post forgotten, the critical one live until 110", k, b)
	}
	if b.Live(110) || b.Keep(110) != 0 || b != (Board{}) {
		t.Errorf("at 110: live %v, board %v: want every post over and forgotten", b.Live(110), b)
	}
}
