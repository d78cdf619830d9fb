package server

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/priority"
)

var errHTTPClosed = http.ErrServerClosed

type httpServer struct{ srv *http.Server }

// maxBody bounds a request body of the HTTP API.
const maxBody = 64 << 10

func (s *Server) newHTTPServer() *httpServer {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/decide", s.handleDecide)
	mux.HandleFunc("GET /v1/rules", s.handleRules)
	mux.HandleFunc("GET /v1/keys", s.handleKeys)
	mux.HandleFunc("DELETE /v1/penalties/{tag...}", s.handleLift)
	s.handleAdmin(mux)
	return newHTTPServer(jsonErrors(s.auth(mux)))
}

// newAdminServer serves what probes and scrapers ask, without the token: /healthz,
// /readyz and /metrics (listen_admin).
func (s *Server) newAdminServer() *httpServer {
	mux := http.NewServeMux()
	s.handleAdmin(mux)
	return newHTTPServer(jsonErrors(mux))
}

// ErrorResponse is the body of every error the HTTP API answers, whatever the endpoint and
// the status (400, 401, 404, 405, 501, 503).
type ErrorResponse struct {
	Error string `json:"error"`
}

// writeError answers status with msg in the one error shape.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, ErrorResponse{Error: msg})
}

// jsonErrors turns the mux's own plain-text answers (404 for a path it does not serve, 405
// for a method a path does not take, with its Allow header) into the API's error shape.
func jsonErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&muxErrorWriter{ResponseWriter: w, r: r}, r)
	})
}

// muxErrorWriter rewrites a plain-text 404 or 405 as JSON; anything else passes.
type muxErrorWriter struct {
	http.ResponseWriter
	r       *http.Request
	rewrote bool
	decided bool
}

func (m *muxErrorWriter) WriteHeader(status int) {
	if !m.decided {
		m.decided = true
		ct := m.Header().Get("Content-Type")
		if (status == http.StatusNotFound || status == http.StatusMethodNotAllowed) && strings.HasPrefix(ct, "text/plain") {
			m.rewrote = true
			msg := "no such endpoint: " + m.r.URL.Path
			if status == http.StatusMethodNotAllowed {
				msg = fmt.Sprintf("method %s not allowed on %s (allowed: %s)", m.r.Method, m.r.URL.Path, m.Header().Get("Allow"))
			}
			m.Header().Del("X-Content-Type-Options")
			writeError(m.ResponseWriter, status, msg)
			return
		}
	}
	m.ResponseWriter.WriteHeader(status)
}

func (m *muxErrorWriter) Write(b []byte) (int, error) {
	if !m.decided {
		m.WriteHeader(http.StatusOK)
	}
	if m.rewrote {
		return len(b), nil // the mux's text: the JSON was written instead
	}
	return m.ResponseWriter.Write(b)
}

// Flush lets streaming handlers (none today) flush through the rewriter.
func (m *muxErrorWriter) Flush() {
	if f, ok := m.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// handleAdmin adds the health and metrics endpoints to mux.
func (s *Server) handleAdmin(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", s.handleReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
}

func newHTTPServer(h http.Handler) *httpServer {
	return &httpServer{srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
	}}
}

// auth requires the bearer token, when one is configured, everywhere but /healthz.
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && !s.tokenOK(r.Header.Get("Authorization")) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
			writeError(w, http.StatusUnauthorized, "a bearer token is required (Authorization: Bearer TOKEN)")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// tokenOK reports whether an Authorization value ("Bearer TOKEN") carries the token, or
// no token is required: the HTTP API and gRPC check it alike.
func (s *Server) tokenOK(auth string) bool {
	tok := *s.token.Load()
	if tok == "" {
		return true
	}
	return len(auth) >= 7 && strings.EqualFold(auth[:7], "bearer ") &&
		subtle.ConstantTimeCompare([]byte(strings.TrimSpace(auth[7:])), []byte(tok)) == 1
}

// DecideRequest is the body of POST /v1/decide.
type DecideRequest struct {
	Key string `json:"key"`
	N   *int64 `json:"n,omitempty"` // default 1; 0 asks for the state without taking anything
	// Priority is the request's class: critical, standard (the default) or sheddable
	// (docs/priorities.md).
	Priority string `json:"priority,omitempty"`
}

// DecideResponse is its answer. Times are whole milliseconds, rounded up (a client that
// waits that long is never early).
type DecideResponse struct {
	Key          string `json:"key"`
	Rule         string `json:"rule"`             // "" if no rule matched (allowed)
	Bucket       string `json:"bucket,omitempty"` // the bucket the rule keeps for the key: the tag, or the rule's shared one
	Allowed      bool   `json:"allowed"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	Why          string `json:"why,omitempty"`   // where no limit decided: no-rule, unlimited, deny, down (the line protocol's why=)
	Error        string `json:"error,omitempty"` // a back-end failure, answered per the fail mode
}

// decideResponse is the answer to a decision d for tag (n permits; err from Decide).
func (s *Server) decideResponse(tag string, n int64, d Decision, err error) DecideResponse {
	resp := DecideResponse{Key: tag, Rule: d.Rule, Allowed: d.Allowed && err == nil, Remaining: d.Remaining,
		RetryAfterMs: ceilMs(d.RetryAfter), ResetAfterMs: ceilMs(d.ResetAfter), Why: d.why(err)}
	if d.rule != nil && !d.rule.Unlimited && !d.rule.Deny {
		resp.Bucket = tag
		if d.rule.Shared && d.rule.pattern {
			resp.Bucket = d.rule.Name + " (shared)"
		}
	}
	if err != nil {
		resp.Error = publicError(tag, n, d, err)
	}
	return resp
}

// publicError says what went wrong in a decision for tag in the API's words: no internal
// key encoding, one "sluice:" at most.
func publicError(tag string, n int64, d Decision, err error) string {
	if errors.Is(err, gcra.ErrCostExceedsBurst) {
		return fmt.Sprintf("cost %d exceeds the burst of rule %q: it can never be granted", n, d.Rule)
	}
	msg := err.Error()
	if d.rule != nil {
		msg = strings.ReplaceAll(msg, strconv.Quote(d.rule.key(tag)), strconv.Quote(tag))
	}
	return strings.ReplaceAll(msg, "sluice: ", "")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) handleDecide(w http.ResponseWriter, r *http.Request) {
	var req DecideRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "bad request body: "+err.Error()+` (want {"key": "TAG", "n": N})`)
		return
	}
	n := int64(1)
	if req.N != nil {
		n = *req.N
	}
	if !wire.ValidTag([]byte(req.Key)) || n < 0 || len(req.Key) > s.Config().MaxLine {
		writeError(w, http.StatusBadRequest, "want a non-empty UTF-8 key without control characters, and n >= 0")
		return
	}
	prio, perr := priority.Parse(req.Priority)
	if perr != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown priority %q: want critical, standard or sheddable", req.Priority))
		return
	}
	ctx := s.httpContext(r)
	if prio != priority.Standard {
		ctx = priority.With(ctx, prio)
	}
	d, err := s.Decide(ctx, req.Key, n, 0)
	resp := s.decideResponse(req.Key, n, d, err)
	status := http.StatusOK
	if err != nil {
		if errors.Is(err, gcra.ErrCostExceedsBurst) {
			status = http.StatusBadRequest
		} else {
			status = http.StatusServiceUnavailable
		}
	}
	if d.Rule != "" {
		httplimit.SetRateLimitHeaders(w.Header(), d.Limits, d.Decision)
	}
	writeJSON(w, status, resp)
}

// RuleInfo is one rule in GET /v1/rules.
type RuleInfo struct {
	Name   string `json:"name"`
	Match  string `json:"match"`
	Limit  string `json:"limit"`
	Shared bool   `json:"shared"`
}

func (s *Server) handleRules(w http.ResponseWriter, r *http.Request) {
	rs := s.rules.Load()
	out := struct {
		Rules   []RuleInfo `json:"rules"`
		Default *RuleInfo  `json:"default,omitempty"`
	}{Rules: []RuleInfo{}}
	for i, c := range rs.rules {
		if c.guard {
			continue
		}
		ri := RuleInfo{Name: c.Name, Match: c.Match, Limit: c.Limit.String(), Shared: c.Shared}
		switch {
		case c.Unlimited:
			ri.Limit = "unlimited"
		case c.Deny:
			ri.Limit = "deny"
		}
		if i == rs.deflt {
			out.Default = &ri
			continue
		}
		out.Rules = append(out.Rules, ri)
	}
	writeJSON(w, http.StatusOK, out)
}

// handleKeys answers the state of one tag (?tag=T, without taking anything), or with no
// tag the number of buckets held and up to ?limit= of their keys (local back end only).
func (s *Server) handleKeys(w http.ResponseWriter, r *http.Request) {
	if tag := r.URL.Query().Get("tag"); tag != "" {
		if !wire.ValidTag([]byte(tag)) {
			writeError(w, http.StatusBadRequest, "want a non-empty UTF-8 tag without control characters")
			return
		}
		d, err := s.Decide(r.Context(), tag, 0, 0)
		resp := s.decideResponse(tag, 0, d, err)
		resp.RetryAfterMs = 0 // a look, not a request
		writeJSON(w, http.StatusOK, resp)
		return
	}
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 && n <= 10000 {
			limit = n
		}
	}
	out := struct {
		Held int      `json:"held"`
		Keys []string `json:"keys"`
	}{Keys: []string{}}
	if s.local != nil {
		out.Held = s.local.Len()
		out.Keys = s.local.Keys(limit)
		rs := s.rules.Load()
		for i, k := range out.Keys {
			out.Keys[i] = rs.bucketName(k)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if s.closing.Load() {
		writeError(w, http.StatusServiceUnavailable, "shutting down")
		return
	}
	if p, ok := s.be.(backend.Pinger); ok {
		if err := p.Ping(r.Context()); err != nil {
			writeError(w, http.StatusServiceUnavailable, "back end not ready: "+strings.ReplaceAll(err.Error(), "sluice: ", ""))
			return
		}
	}
	w.Write([]byte("ready\n"))
}

// handleLift lifts any penalty on a tag and resets its bucket (DELETE /v1/penalties/TAG,
// the tag URL-escaped): 204 when done, 404 if no rule matches the tag, 501 if the back
// end cannot forget a key, 503 if it failed.
func (s *Server) handleLift(w http.ResponseWriter, r *http.Request) {
	tag := r.PathValue("tag")
	if !wire.ValidTag(tag) {
		writeError(w, http.StatusBadRequest, "want a non-empty UTF-8 tag without control characters")
		return
	}
	found, err := s.Lift(r.Context(), tag)
	switch {
	case !found:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no rule matches the tag %q", tag))
	case errors.Is(err, backend.ErrUnsupported):
		writeError(w, http.StatusNotImplemented, strings.ReplaceAll(err.Error(), "sluice: ", ""))
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, strings.ReplaceAll(err.Error(), "sluice: ", ""))
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}
