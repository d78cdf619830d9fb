package ratehdr

import (
	"net/http"
	"strings"
)

// HostKey is a request's host (the API's): its URL's, else its Host field. It is the key
// package sluice's Transport throttles by unless told otherwise (httplimit.KeyByHost).
func HostKey(r *http.Request) string {
	if r.URL != nil && r.URL.Host != "" {
		return r.URL.Host
	}
	return r.Host
}

// RemoteAddrKey is the client's IP address: RemoteAddr without the port. It is the key
// package sluice's Middleware throttles by unless told otherwise
// (httplimit.KeyByRemoteAddr).
func RemoteAddrKey(r *http.Request) string {
	a := r.RemoteAddr
	if i := strings.LastIndexByte(a, ':'); i >= 0 && !strings.HasSuffix(a, "]") {
		a = a[:i]
	}
	return strings.Trim(a, "[]")
}
