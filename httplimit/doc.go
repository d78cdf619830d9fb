// Package httplimit holds the HTTP helpers of Sluice's limiters:
//   - the functions that pick the key a request is throttled under (KeyFunc: KeyByHost,
//     KeyByRemoteAddr, KeyByToken, KeyByHeader), for sluice.Transport and
//     sluice.Limiter.Middleware;
//   - the names of the rate-limit fields of an answer (the Header constants), and
//     SetRateLimitHeaders, which writes them under a limiter's limits;
//   - the readers of what an API's answer asks for or reports (RetryAfter, Remaining), in
//     every form APIs use.
//
// A limiter keys its requests with them:
//
//	t := &sluice.Transport{Limiter: l, Key: httplimit.KeyByToken} // one limit per token
//	h := l.Middleware(httplimit.KeyByRemoteAddr)(mux)              // 429 past the limit
//
// See docs/http.md for the fields written and read.
package httplimit
