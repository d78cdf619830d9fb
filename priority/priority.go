// Package priority names a call's class when a limit is tight (docs/priorities.md):
// Critical work (a user waits for it), Standard work (the default) and Sheddable work (a
// nightly sync, a prefetch), as Google's SRE practice tags a request's criticality. A
// context carries the class (With); a limiter's waiting room serves a higher class first,
// and its decisions that do not wait keep part of the burst for the higher classes seen
// recently (Headroom, sluice.WithHeadroom).
package priority

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Class is a call's class. The zero value is Standard.
type Class int8

// The classes, highest first.
const (
	Critical  Class = 1
	Standard  Class = 0
	Sheddable Class = -1
)

func (c Class) String() string {
	switch c {
	case Critical:
		return "critical"
	case Standard:
		return "standard"
	case Sheddable:
		return "sheddable"
	}
	return fmt.Sprintf("Class(%d)", int8(c))
}

// Parse reads a class's name: "critical", "standard" or "sheddable" ("" is standard).
func Parse(s string) (Class, error) {
	switch s {
	case "critical":
		return Critical, nil
	case "standard", "":
		return Standard, nil
	case "sheddable":
		return Sheddable, nil
	}
	return Standard, fmt.Errorf("priority: unknown class %q (want critical, standard or sheddable)", s)
}

type ctxKey struct{}

// used is set once a context in this process has carried a class other than Standard:
// until then Of reads no context (a limiter's hot path stays as it was).
var used atomic.Bool

// With returns a copy of ctx whose calls are of class c.
func With(ctx context.Context, c Class) context.Context {
	if c != Standard {
		used.Store(true)
	}
	return context.WithValue(ctx, ctxKey{}, c)
}

// Named reports whether a context in this process has carried a class other than Standard
// (With). Until one has, Of is Standard for every context: a limiter's fast path asks this,
// which the compiler inlines, rather than call Of.
func Named() bool { return used.Load() }

// Of returns the class ctx carries (Standard if none).
func Of(ctx context.Context) Class {
	if !used.Load() {
		return Standard
	}
	c, _ := ctx.Value(ctxKey{}).(Class)
	return c
}

// Headroom is what a decision that does not wait leaves for the higher classes, as a
// fraction of each limit's burst (rounded up to whole permits), while a higher class was
// seen asking for the key recently: within the time the limit takes to refill its burst,
// at least a second and at most a minute. A Standard decision leaves Standard for Critical
// callers; a Sheddable one leaves Sheddable for Critical and Standard ones; a Critical one
// may take everything. With no higher class seen, a lower class uses the whole limit.
type Headroom struct {
	Standard, Sheddable float64
}

// DefaultHeadroom keeps 15% of the burst from standard callers and 40% from sheddable
// ones, as Google's SRE practice sheds by criticality.
var DefaultHeadroom = Headroom{Standard: 0.15, Sheddable: 0.40}

// Validate reports a fraction outside 0 to 1.
func (h Headroom) Validate() error {
	for _, f := range []float64{h.Standard, h.Sheddable} {
		if !(f >= 0 && f <= 1) {
			return fmt.Errorf("priority: headroom %v: each fraction must be between 0 and 1", f)
		}
	}
	return nil
}
