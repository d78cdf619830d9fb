package wire

import (
	"testing"
	"unicode/utf8"
)

func TestValidTag(t *testing.T) {
	for _, c := range []struct {
		tag  string
		want bool
	}{
		{"api", true}, {"user 42", true}, {"ключ", true}, {"\uFFFD", true}, {"~x", true},
		{"", false}, {"a\nb", false}, {"a\rb", false}, {"a\x00", false}, {"\x7f", false},
		{"\xff", false}, {"a\xe2\x82", false},
	} {
		if got := ValidTag(c.tag); got != c.want {
			t.Errorf("ValidTag(%q) = %v, want %v", c.tag, got, c.want)
		}
		if got := ValidTag([]byte(c.tag)); got != c.want {
			t.Errorf("ValidTag([]byte(%q)) = %v, want %v", c.tag, got, c.want)
		}
	}
}

// FuzzValidTag: the same answer as the plain rule (UTF-8, no control character).
func FuzzValidTag(f *testing.F) {
	f.Add("api")
	f.Add("\xef\xbf\xbd\xff")
	f.Fuzz(func(t *testing.T, s string) {
		want := s != "" && utf8.ValidString(s)
		for _, r := range s {
			if r < 0x20 || r == 0x7f {
				want = false
			}
		}
		if got := ValidTag(s); got != want {
			t.Errorf("ValidTag(%q) = %v, want %v", s, got, want)
		}
	})
}
