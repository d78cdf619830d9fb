package sim

import (
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adaptive"
	"github.com/sluicehq/sluice/clock"
)

// adaptiveMode: each member is a client of the adaptive mode that shares nothing with
// the others: one adaptive.Controller (the real core) per member, its goroutines sharing
// it, learning from the referee's answers alone. The answers go through the referee's
// header writer, and the controller reads them as adaptive.Transport has it do: the
// simulator's clients learn exactly what a real one would.
type adaptiveMode struct {
	label    string
	strategy adaptive.Strategy
	ctrls    []*adaptive.Controller
	inc      []uint32 // the member's incarnation its controller was made for
	h        http.Header
}

// adaptiveMode names: "adaptive" (the default strategy) or "adaptive:STRATEGY".
const adaptivePrefix = "adaptive"

// parseAdaptive reports whether name is an adaptive mode, and its strategy.
func parseAdaptive(name string) (adaptive.Strategy, bool, error) {
	if name == adaptivePrefix {
		return adaptive.Sluice, true, nil
	}
	rest, ok := strings.CutPrefix(name, adaptivePrefix+":")
	if !ok {
		return 0, false, nil
	}
	s, err := adaptive.ParseStrategy(rest)
	return s, true, err
}

// FormerModeName reports whether name is a mode's former name, still read for one
// release, and the mode's name now: redis is strict, redis:processes and strict:processes
// are strict (which shares the store's line by process, as the library does by default),
// adaptive:seed is adaptive:heroku. A program that reads
// mode names from its user should tell them the name now.
func FormerModeName(name string) (string, bool) {
	switch name {
	case "redis":
		return "strict", true
	case "redis:processes", "strict:processes":
		return "strict", true
	}
	rest, ok := strings.CutPrefix(name, adaptivePrefix+":")
	if !ok {
		return "", false
	}
	s, ok := adaptive.FormerName(rest)
	if !ok {
		return "", false
	}
	return adaptivePrefix + ":" + s.String(), true
}

func newAdaptiveMode(name string, s adaptive.Strategy) *adaptiveMode {
	return &adaptiveMode{label: name, strategy: s, h: http.Header{}}
}

func (a *adaptiveMode) name() string { return a.label }

// controller returns member mi's controller, a fresh one for each incarnation (a
// process that restarts knows nothing).
func (a *adaptiveMode) controller(e *engine, mi int32) *adaptive.Controller {
	if a.ctrls == nil {
		a.ctrls = make([]*adaptive.Controller, len(e.members))
		a.inc = make([]uint32, len(e.members))
	}
	m := e.members[mi]
	if a.ctrls[mi] == nil || a.inc[mi] != m.inc {
		c, err := adaptive.New(adaptive.Config{Strategy: a.strategy}, e.sc.Seed^(uint64(mi)+1)<<20^uint64(m.inc))
		if err != nil {
			panic(err) // the default configuration is valid
		}
		a.ctrls[mi], a.inc[mi] = c, m.inc
	}
	return a.ctrls[mi]
}

func (a *adaptiveMode) acquire(e *engine, mi, g int32) {
	c := a.controller(e, mi)
	var tokens int64
	if e.idealTokCore != nil {
		tokens = e.members[mi].gs[g].cost // what the request costs, known when it is sent
	}
	at, out := c.Next(e.now, tokens)
	switch out {
	case adaptive.Reject:
		e.denied(mi, g, 0) // rejected locally (sre): the goroutine backs off
	case adaptive.Wait:
		e.schedule(event{at: max(at, e.now+1), kind: evRetry, m: mi, g: g, op: e.members[mi].ops[g]})
	default:
		e.permit(mi, g, at)
	}
}

// answered feeds a goroutine's answer to its member's controller.
func (a *adaptiveMode) answered(e *engine, ev *event) {
	m := e.members[ev.m]
	s := &m.gs[ev.g]
	clear(a.h)
	now := clock.Epoch.Add(time.Duration(e.now))
	v := &m.verdicts[ev.g]
	e.ref.WriteHeaders(a.h, *v, now)
	status := http.StatusOK
	if !v.Allowed {
		status = http.StatusTooManyRequests
	}
	var tokens int64
	if e.idealTokCore != nil {
		tokens = s.cost
	}
	a.controller(e, ev.m).Observe(e.now, adaptive.Answer{Status: status, Header: a.h, Date: now, Sent: s.sent, Tokens: tokens})
}

func (*adaptiveMode) handle(*engine, *event) {}

// penalize: the controller learns of a refusal from the answer itself (answered).
func (*adaptiveMode) penalize(*engine, int32, int64) {}

func (*adaptiveMode) left(*engine, int32, bool) {}
