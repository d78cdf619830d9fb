package ratehdr

import "net/http"

// Replayable reports whether a request answered 429 may be sent again: it is idempotent
// (GET, HEAD, OPTIONS, TRACE, PUT, DELETE, or any request with an Idempotency-Key or
// X-Idempotency-Key header), and its body, if any, can be had again (GetBody set, as
// http.NewRequest does for in-memory bodies).
func Replayable(r *http.Request) bool {
	if r.Body != nil && r.Body != http.NoBody && r.GetBody == nil {
		return false
	}
	switch r.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return r.Header.Get("Idempotency-Key") != "" || r.Header.Get("X-Idempotency-Key") != ""
}
