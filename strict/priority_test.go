package strict

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testkit/classtest"
	"github.com/sluicehq/sluice/priority"
)

// TestClassesAcrossProcesses: two processes share a key's line in Redis (each a limiter
// on a backend of its own, sharing the line by process, sluice.FairProcesses). While a
// critical caller asks in one, five times a second, the other's sheddable waiters take
// their places in the line keeping the sheddable headroom (40% of the burst), so the
// critical caller's Allow finds permits left while the flood holds the line; before, the
// flood's places kept nothing and nearly every critical Allow was refused.
func TestClassesAcrossProcesses(t *testing.T) {
	p := prefix(t)
	lims := make([]*sluice.Limiter, 2)
	for i := range lims {
		b := New(newClient(t, shared.URL()), WithPrefix(p))
		t.Cleanup(func() { b.Close() })
		lims[i] = sluice.MustNew(sluice.MustParse("10/s burst=10"), sluice.WithBackend(b))
		t.Cleanup(func() { lims[i].Close() })
	}
	asked, granted, flood := classtest.CriticalBesideFlood(lims[0], lims[1])
	if granted < asked {
		t.Errorf("a critical caller beside another process's sheddable flood: %d of %d Allows granted, want all (the flood keeps its headroom; it got %d permits)", granted, asked, flood)
	}
}

// TestClassBoard: a class posted for a key reads back as posted a moment ago, within the
// time it was posted for, and not after; a class not posted reads as not posted; another
// key's posts are its own.
func TestClassBoard(t *testing.T) {
	b := New(newClient(t, shared.URL()), WithPrefix(prefix(t)))
	defer b.Close()
	ctx := context.Background()
	if c, s, err := b.ClassesPosted(ctx, "api"); err != nil || c >= 0 || s >= 0 {
		t.Fatalf("step 0: nothing posted: %v, %v, %v; want both negative", c, s, err)
	}
	if err := b.PostClass(ctx, "api", priority.Critical, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	_ = b.PostClass(ctx, "api", priority.Sheddable, time.Second) // not a class the board keeps
	c, s, err := b.ClassesPosted(ctx, "api")
	if err != nil || c < 0 || c > 100*time.Millisecond || s >= 0 {
		t.Errorf("step 1: critical posted just now: %v, %v, %v; want critical 0 to 100 ms ago, standard not posted", c, s, err)
	}
	if c, _, _ := b.ClassesPosted(ctx, "other"); c >= 0 {
		t.Errorf("step 2: another key reads critical posted %v ago", c)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, _, err := b.ClassesPosted(ctx, "api")
		if err == nil && c < 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("step 3: critical still posted %v ago (%v) long after its 300 ms", c, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
