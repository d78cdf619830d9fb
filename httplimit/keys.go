package httplimit

import (
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/internal/ratehdr"
)

// KeyFunc picks the key a request is throttled under. An empty key means "do not throttle
// this request". sluice.Transport's Key and sluice.Limiter.Middleware take one.
type KeyFunc func(*http.Request) string

// KeyByHost throttles by the request's host (the API): sluice.Transport's default.
func KeyByHost(r *http.Request) string { return ratehdr.HostKey(r) }

// KeyByRemoteAddr keys a request by the client's IP address (RemoteAddr without the port):
// sluice.Limiter.Middleware's default. Behind a proxy, key by the header the proxy sets
// instead (KeyByHeader).
func KeyByRemoteAddr(r *http.Request) string { return ratehdr.RemoteAddrKey(r) }

// KeyByToken throttles by the request's API token: the bearer token of Authorization, or
// else the X-Api-Token header. Use it when one limit applies per token.
func KeyByToken(r *http.Request) string {
	if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return r.Header.Get("X-Api-Token")
}

// KeyByHeader throttles by the value of a header.
func KeyByHeader(name string) KeyFunc {
	return func(r *http.Request) string { return r.Header.Get(name) }
}
