package rkey

import "testing"

func TestName(t *testing.T) {
	for _, c := range []struct{ prefix, key, want string }{
		{"", "api", "{api}"},
		{"p:", "api", "p:{api}"},
		{"p:", "", `p:{\0}`},
		{"p:", "a}b", `p:{a\]b}`},
		{"p:", `a\]b`, `p:{a\\]b}`},
		{"", "{x}", `{{x\]}`},
	} {
		if got := Name(c.prefix, c.key); got != c.want {
			t.Errorf("Name(%q, %q) = %q, want %q", c.prefix, c.key, got, c.want)
		}
		if got := string(AppendName([]byte("x"), c.prefix, c.key)); got != "x"+c.want {
			t.Errorf("AppendName(x, %q, %q) = %q, want %q", c.prefix, c.key, got, "x"+c.want)
		}
		if c.prefix == "" {
			if got := Tag(c.key); got != c.want {
				t.Errorf("Tag(%q) = %q, want %q", c.key, got, c.want)
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = Name("sluice:v1:", "user-42") }); n != 1 {
		t.Errorf("Name allocates %v times, want 1", n)
	}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = AppendName(buf[:0], "sluice:v1:", `a}b\c`) }); n != 0 {
		t.Errorf("AppendName allocates %v times into a buffer large enough, want 0", n)
	}
}
