// Package adaptive is the adaptive mode: clients that share a rate limit with others they
// know nothing of (no store, no daemon, not even their number) and learn a safe request
// rate from the API's answers alone: its 429s and Retry-After, and the RateLimit fields
// that say how much is left (every form APIs use: see docs/adaptive.md).
//
// Controller is the deterministic core (it takes now and each answer, and says when the
// next request may go); Transport is an http.RoundTripper that paces requests through one
// Controller per host (or per key the caller chooses), shared by every goroutine of the
// process.
//
//	client := &http.Client{Transport: &adaptive.Transport{}}
package adaptive
