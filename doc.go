// Package sluice makes a pool of workers obey one shared rate limit together: the limit an
// external API enforces on a token that all of them use ("at most one request every 6
// seconds", "4,500 an hour", "100 a second, bursts of 20"). It wastes as little of the
// limit as it can and shares it fairly.
//
// A Limiter applies Limits to string keys (an API token, a host, a client IP). Reserve is
// the primitive; Allow, Wait, Do and Wrap are built on it:
//
//	l, _ := sluice.New(sluice.MustParse("10/s burst=20"))
//	defer l.Close()
//	if l.Allow(ctx, "token-a") { ... }       // take a permit if one is free now
//	err := l.Wait(ctx, "token-a")            // or wait for one
//	call := sluice.Wrap(l, "token-a", fetch) // or throttle a function
//
// Decisions are made by a backend: in process by default (package local), or shared by
// many processes in Redis and the other modes of the project. Every backend runs the same
// GCRA arithmetic (package gcra) and the same conformance suite (package
// backend/backendtest), so a program moves between them by changing one option.
//
// Limiter.Transport throttles an http.Client and Limiter.Middleware an http.Handler; the
// functions that key their requests, the rate-limit header names and their writer and
// readers are in package httplimit.
//
// Errors are declared once, where they arise, and matched with errors.Is. This package
// declares ErrThrottled (*ThrottledError), ErrPermitExpired and ErrBadLimit (*LimitError).
// Package backend declares the failures of a backend (backend.ErrClosed,
// backend.ErrTooManyKeys, backend.ErrUnavailable with *backend.UnavailableError,
// backend.ErrUnsupported) and the fail modes WithFailMode takes (backend.FailClosed,
// backend.FailOpen, backend.FailLocal). Package gcra declares gcra.ErrCostExceedsBurst.
//
// Time comes from a clock.Clock; tests and the simulator use clock.Virtual, under which
// every guarantee is exact.
package sluice
