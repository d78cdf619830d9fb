// Package h2grpc is a lean server of unary gRPC calls over cleartext HTTP/2 (h2c, as Envoy
// calls a rate limit service), for the daemon's hot path: Envoy's ShouldRateLimit.
//
// It reads frames with golang.org/x/net/http2's Framer and header blocks with its hpack
// Decoder, keeps each call's state in a recycled struct, answers on long-lived worker
// goroutines, and writes every connection's frames from one buffer that a writer
// goroutine sends in batches: a call costs a few allocations where grpc-go's transport
// makes about sixty (docs/envoy.md, "The transport"). It serves what a unary call needs
// and nothing more: no compression, no streaming calls, no server push, no TLS.
//
// What it keeps of HTTP/2 and gRPC:
//   - settings: a bound on concurrent streams (more are refused with REFUSED_STREAM), on
//     a header list, and a stream window that holds the largest message allowed;
//   - flow control both ways: the connection's window is given back as data arrives, and
//     a response waits for the peer's windows;
//   - PING answered, RST_STREAM and GOAWAY from the peer obeyed;
//   - grpc-timeout as the call's deadline, grpc-status and grpc-message in the trailers,
//     an error answered trailers-only;
//   - a connection idle for Config.IdleTimeout closed with GOAWAY, a graceful stop that
//     answers the calls in flight, a peer that stops reading dropped after
//     Config.WriteTimeout.
package h2grpc
