package wire

import "testing"

// TestWhyRoundTrip: a verbose answer carries why= where no limit decided, a reader takes
// it back, and an answer without it (an older daemon's) reads as a limit's.
func TestWhyRoundTrip(t *testing.T) {
	for _, why := range []string{WhyNoRule, WhyUnlimited, WhyDeny, WhyDown, ""} {
		line := AppendAnswer(nil, Answer{Allowed: why != WhyDeny, Verbose: true, DelayMs: -1, At: -1, Remaining: 3, ResetMs: 7, Why: why})
		a, err := ParseAnswer(line[:len(line)-1])
		if err != nil || a.Why != why || a.Remaining != 3 || a.ResetMs != 7 {
			t.Errorf("%q: read %+v, %v from %q", why, a, err, line)
		}
	}
	if line := AppendAnswer(nil, Answer{Allowed: true, DelayMs: -1, At: -1, Why: WhyNoRule}); string(line) != "OK\n" {
		t.Errorf("a terse answer carries why: %q", line)
	}
}
