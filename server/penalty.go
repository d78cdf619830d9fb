package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/internal/yamlx"
)

// ErrPenaltyRefused: the rule that matches the tag does not let clients set penalties
// (max_penalty: off).
var ErrPenaltyRefused = errors.New("sluice serve: penalties are off for this rule")

// PenaltyCap is how long a client may hold one of a rule's tags back (the line protocol's
// p=, a worker's 429 with Retry-After): "off" refuses client penalties, "period" caps them
// at the rule's longest period (4500/h: an hour), a duration caps them at it. A longer
// penalty is cut to the cap. The zero value is unset: a rule's unset cap is the server's.
type PenaltyCap struct {
	off, period bool
	d           time.Duration
}

// Penalty caps.
var (
	PenaltiesOff    = PenaltyCap{off: true}
	PenaltiesPeriod = PenaltyCap{period: true}
)

// PenaltyUpTo caps penalties at d.
func PenaltyUpTo(d time.Duration) PenaltyCap { return PenaltyCap{d: d} }

// ParsePenaltyCap reads "off", "period" or a positive duration.
func ParsePenaltyCap(s string) (PenaltyCap, error) {
	switch s = strings.TrimSpace(s); s {
	case "off":
		return PenaltiesOff, nil
	case "period":
		return PenaltiesPeriod, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return PenaltyCap{}, fmt.Errorf("max_penalty %q: want off, period or a positive duration such as 10m", s)
	}
	return PenaltyUpTo(d), nil
}

// IsZero reports whether the cap is unset.
func (p PenaltyCap) IsZero() bool { return p == PenaltyCap{} }

// String returns the text form: "off", "period", a duration, or "" when the cap is unset.
func (p PenaltyCap) String() string {
	switch {
	case p.off:
		return "off"
	case p.period:
		return "period"
	case p.d > 0:
		return p.d.String()
	}
	return ""
}

// UnmarshalYAML reads the text form.
func (p *PenaltyCap) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return yamlx.At(n, "max_penalty: want off, period or a duration such as 10m")
	}
	v, err := ParsePenaltyCap(n.Value)
	if err != nil {
		return yamlx.At(n, "%v", err)
	}
	*p = v
	return nil
}

// MarshalYAML writes the text form.
func (p PenaltyCap) MarshalYAML() (any, error) { return p.String(), nil }

// Set implements flag.Value.
func (p *PenaltyCap) Set(s string) error {
	v, err := ParsePenaltyCap(s)
	if err == nil {
		*p = v
	}
	return err
}

// limit is the longest penalty the cap allows for a rule with limits ls, and whether any is
// allowed.
func (p PenaltyCap) limit(ls sluice.Limits) (time.Duration, bool) {
	switch {
	case p.off:
		return 0, false
	case p.d > 0:
		return p.d, true
	}
	var longest time.Duration
	for _, l := range ls {
		longest = max(longest, l.Period)
	}
	return longest, true
}

// ReportExpired counts n permits of a reservation for tag that a client did not use
// because they came to it too late (sluice.ErrPermitExpired: past its margin), under the
// rule that matches tag (sluice_permits_expired_total); a tag no rule matches is counted
// under rule "". Nothing is given back: the permits' time is past.
func (s *Server) ReportExpired(tag string, n int64) {
	name := ""
	if c := s.rules.Load().lookup(tag); c != nil {
		name = c.Name
	}
	s.m.expired.WithLabelValues(name).Add(float64(n))
}

// Penalize holds tag back for d (a worker's 429 with Retry-After), cut to the cap of the
// rule that matches it (max_penalty), and returns the hold applied. A tag no rule matches
// is not held (such tags are allowed); a rule with max_penalty off refuses with
// ErrPenaltyRefused. Every penalty is counted and logged (sampled under a flood); the
// tag is logged by a fingerprint, as it may be a secret (an API token).
func (s *Server) Penalize(ctx context.Context, tag string, d time.Duration) (time.Duration, error) {
	c := s.rules.Load().lookup(tag)
	if c == nil || d <= 0 {
		return 0, nil
	}
	result := "applied"
	applied := d
	switch {
	case !c.penOK:
		result, applied = "refused", 0
	case d > c.penMax:
		result, applied = "capped", c.penMax
	}
	var err error
	if applied > 0 {
		err = c.limiter.Penalize(ctx, c.key(tag), s.clock.Now().Add(applied))
		if err != nil {
			result = "error"
		}
	} else {
		err = fmt.Errorf("%w: rule %q", ErrPenaltyRefused, c.Name)
	}
	s.m.penalties.WithLabelValues(c.Name, result).Inc()
	if ok, dropped := s.penLog.allow(s.clock.Nanotime()); ok {
		args := []any{"rule", c.Name, "tag_sha256", fingerprint(tag), "asked", d, "applied", applied, "result", result}
		if dropped > 0 {
			args = append(args, "not_logged_since", dropped)
		}
		if err != nil && result == "error" {
			args = append(args, "err", err)
		}
		s.log.Info("penalty", args...)
	}
	return applied, err
}

// Lift lifts any penalty on tag and forgets its bucket: its next query starts with the
// whole burst. It returns false if no rule matches tag.
func (s *Server) Lift(ctx context.Context, tag string) (bool, error) {
	c := s.rules.Load().lookup(tag)
	if c == nil {
		return false, nil
	}
	if c.limiter == nil { // unlimited or deny: no bucket to forget
		return true, nil
	}
	err := c.limiter.Reset(ctx, c.key(tag))
	result := "ok"
	if err != nil {
		result = "error"
	}
	s.m.lifts.WithLabelValues(c.Name, result).Inc()
	s.log.Info("penalty lifted", "rule", c.Name, "tag_sha256", fingerprint(tag), "err", err)
	return true, err
}

// fingerprint names a tag in logs without revealing it: the first 8 bytes of its SHA-256.
func fingerprint(tag string) string {
	h := sha256.Sum256([]byte(tag))
	return hex.EncodeToString(h[:8])
}

// logSampler lets at most 10 log lines a second through (bursts of 10), and counts the
// others, so that a flood of penalties cannot flood the log.
type logSampler struct {
	mu      sync.Mutex
	tat     int64
	dropped int64
}

var logRate = gcra.Limit{T: int64(100 * time.Millisecond), Tau: int64(time.Second)}

// allow reports whether a line may be logged at now, and how many were not since the last.
func (l *logSampler) allow(now int64) (bool, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	tat, ok := gcra.AllowOne(l.tat, logRate, now)
	if !ok {
		l.dropped++
		return false, 0
	}
	l.tat = tat
	d := l.dropped
	l.dropped = 0
	return true, d
}
