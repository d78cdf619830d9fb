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
		if c.prefix == "" {
			if got := Tag(c.key); got != c.want {
				t.Errorf("Tag(%q) = %q, want %q", c.key, got, c.want)
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = Name("sluice:v1:", "user-42") }); n != 1 {
		t.Errorf("Name allocates %v times, want 1", n)
	}
}
