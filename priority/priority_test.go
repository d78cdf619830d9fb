package priority

import (
	"context"
	"testing"
)

func TestParse(t *testing.T) {
	for _, p := range []Class{Critical, Standard, Sheddable} {
		got, err := Parse(p.String())
		if err != nil || got != p {
			t.Errorf("Parse(%q) = %v, %v", p.String(), got, err)
		}
	}
	if p, err := Parse(""); err != nil || p != Standard {
		t.Errorf(`Parse("") = %v, %v; want standard`, p, err)
	}
	if _, err := Parse("urgent"); err == nil {
		t.Error(`Parse("urgent"): no error`)
	}
	if Of(context.Background()) != Standard {
		t.Error("a context without a class is not standard")
	}
	if Of(With(context.Background(), Sheddable)) != Sheddable {
		t.Error("With(Sheddable) not read back")
	}
}

// TestNamed: once a context carried a class other than Standard, Named says so (a limiter's
// fast path then reads the context's class).
func TestNamed(t *testing.T) {
	With(context.Background(), Sheddable)
	if !Named() {
		t.Error("Named is false after With(Sheddable)")
	}
}

func TestHeadroomValidate(t *testing.T) {
	for _, h := range []Headroom{DefaultHeadroom, {}, {Standard: 1, Sheddable: 1}} {
		if err := h.Validate(); err != nil {
			t.Errorf("%+v: %v", h, err)
		}
	}
	for _, h := range []Headroom{{Standard: -0.1}, {Sheddable: 1.5}} {
		if err := h.Validate(); err == nil {
			t.Errorf("%+v: no error", h)
		}
	}
}
