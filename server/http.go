package server

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/gcra"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/wire"
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
	return newHTTPServer(s.auth(mux))
}

// newAdminServer serves what probes and scrapers ask, without the token: /healthz,
// /readyz and /metrics (listen_admin).
func (s *Server) newAdminServer() *httpServer {
	mux := http.NewServeMux()
	s.handleAdmin(mux)
	return newHTTPServer(mux)
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
			http.Error(w, "sluice: a bearer token is required", http.StatusUnauthorized)
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
}

// DecideResponse is its answer.
type DecideResponse struct {
	Key          string  `json:"key"`
	Rule         string  `json:"rule"` // "" if no rule matched (allowed)
	Allowed      bool    `json:"allowed"`
	Remaining    int64   `json:"remaining"`
	RetryAfterMs float64 `json:"retry_after_ms"`
	ResetAfterMs float64 `json:"reset_after_ms"`
	Error        string  `json:"error,omitempty"` // a back-end failure, answered per the fail mode
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
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "sluice: bad request body: " + err.Error()})
		return
	}
	n := int64(1)
	if req.N != nil {
		n = *req.N
	}
	if !wire.ValidTag([]byte(req.Key)) || n < 0 || len(req.Key) > s.Config().MaxLine {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "sluice: want a non-empty UTF-8 key without control characters, and n >= 0"})
		return
	}
	d, err := s.Decide(s.httpContext(r), req.Key, n, 0)
	resp := DecideResponse{Key: req.Key, Rule: d.Rule, Allowed: d.Allowed && err == nil, Remaining: d.Remaining,
		RetryAfterMs: float64(d.RetryAfter) / 1e6, ResetAfterMs: float64(d.ResetAfter) / 1e6}
	status := http.StatusOK
	if err != nil {
		resp.Error = err.Error()
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
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "sluice: bad tag"})
			return
		}
		d, err := s.Decide(r.Context(), tag, 0, 0)
		resp := DecideResponse{Key: tag, Rule: d.Rule, Allowed: d.Allowed && err == nil, Remaining: d.Remaining,
			ResetAfterMs: float64(d.ResetAfter) / 1e6}
		if err != nil {
			resp.Error = err.Error()
		}
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
		for i, k := range out.Keys {
			out.Keys[i] = strings.Replace(k, "\x1f", ":", 1) // rule:tag
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if s.closing.Load() {
		http.Error(w, "shutting down\n", http.StatusServiceUnavailable)
		return
	}
	if p, ok := s.be.(backend.Pinger); ok {
		if err := p.Ping(r.Context()); err != nil {
			http.Error(w, "backend: "+err.Error()+"\n", http.StatusServiceUnavailable)
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
		http.Error(w, "sluice: invalid tag", http.StatusBadRequest)
		return
	}
	found, err := s.Lift(r.Context(), tag)
	switch {
	case !found:
		http.Error(w, "sluice: no rule matches the tag", http.StatusNotFound)
	case errors.Is(err, backend.ErrUnsupported):
		http.Error(w, "sluice: "+err.Error(), http.StatusNotImplemented)
	case err != nil:
		http.Error(w, "sluice: "+err.Error(), http.StatusServiceUnavailable)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}
