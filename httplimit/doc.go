// Package httplimit puts a hybrid.Limiter in front of a net/http handler: a middleware
// that keys each request (an API-key header, the client IP behind trusted proxies, or a
// function of your own), decides it under one limit, writes the standard rate-limit
// headers, and answers denials with 429 Too Many Requests and Retry-After (503 Service
// Unavailable when Redis did not answer and the limit's failure policy denied).
//
// The headers are the structured fields of draft-ietf-httpapi-ratelimit-headers-11
// (RateLimit-Policy and RateLimit) by default, and the X-RateLimit-Limit / Remaining /
// Reset trio on request; docs/http.md says how a token bucket maps onto them. The
// Decision reaches the wrapped handler in the request's context (FromContext).
//
// Middleware.Wrap is a func(http.Handler) http.Handler, so it composes with the
// standard mux, chi (r.Use(mw.Wrap)), gorilla/mux and any hand-written chain.
package httplimit
