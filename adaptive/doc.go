// Package adaptive is the adaptive mode: clients that share a rate limit with others they
// know nothing of (no store, no daemon, not even their number). They learn a safe pace
// from the API's answers alone: its 429s and Retry-After, and the fields that say how much
// is left. They read those fields in every form APIs use: the IETF draft's RateLimit and
// RateLimit-Policy, the RateLimit-* and X-RateLimit-* trios, and OpenAI's and Anthropic's
// request and token quotas.
//
// Controller is the deterministic core: it takes now and each answer, and says when the
// next request may go. It learns by one of four strategies: Sluice (the default), and the
// published designs it is measured against, Heroku (the client of the Heroku client
// study, docs/concepts.md), Cubic (the AWS SDKs' adaptive retry) and SRE (Google SRE's
// client-side throttling). It learns two limits at once when an LLM API names them
// (requests and tokens a minute), and paces by the tighter.
//
// Transport is an http.RoundTripper that paces requests through one Controller per host
// (or per key the caller chooses), shared by every goroutine of the process: the
// goroutines of a process are one client.
//
//	client := &http.Client{Transport: &adaptive.Transport{}}
//
// docs/adaptive.md explains each strategy and the measurements.
package adaptive
