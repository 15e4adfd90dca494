// Package grpclimit puts a hybrid.Limiter in front of a gRPC server: unary and stream
// server interceptors that key each call (a metadata entry, the peer's address, or a
// function of your own), decide it under the limit of its method, and answer a denial
// with codes.ResourceExhausted and a google.rpc.RetryInfo detail carrying the retry
// delay; and a client interceptor that honours RetryInfo. It is a module of its own, so
// that a service that does not use gRPC does not get it in its module graph.
//
// A call admitted reaches its handler with the Decision in its context (FromContext),
// and with the rate-limit fields of the HTTP middleware (ratelimit-policy, ratelimit)
// in its response header metadata. A call denied by the limit's failure policy while
// Redis does not answer gets codes.Unavailable with RetryInfo: the client did nothing
// wrong.
package grpclimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/quota"
)

var (
	// ErrInvalidConfig is wrapped by every error New returns.
	ErrInvalidConfig = errors.New("grpclimit: invalid configuration")
	// ErrNoKey is wrapped by the error of a KeyFunc that found no key in the call.
	ErrNoKey = errors.New("grpclimit: no key in call")
)

// KeyFunc returns the key a call is limited by; fullMethod is "/package.Service/Method".
// An error fails the call: with its own status if it is a gRPC status error
// (status.Error(codes.Unauthenticated, …)), with Canceled or DeadlineExceeded if it is
// the context's end, and otherwise (wrapping ErrNoKey, say) with codes.InvalidArgument.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// Metadata keys a call by the first value of the incoming metadata entry name (an API
// key, a tenant id). A call without it, or with an empty one, fails with ErrNoKey.
func Metadata(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		if v := metadata.ValueFromIncomingContext(ctx, name); len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", fmt.Errorf("%w: metadata %s missing", ErrNoKey, name)
	}
}

// PeerIP keys a call by the IP address of its peer, the connection's other end (behind
// a proxy, that is the proxy: key by a metadata entry it sets instead); an IPv4-mapped
// IPv6 address is keyed as IPv4. It keys the whole address, as service-to-service calls
// want (a Kubernetes node's pods share a /64). Clients on the public internet can rotate
// addresses within their /64: key those by its prefix with a KeyFunc of your own
// (netip.Addr.Prefix(64)), as httplimit.ClientIP does by default. A peer with no IP
// address (a Unix socket) is keyed by its address, or by its network's name ("unix")
// when it has none.
func PeerIP() KeyFunc {
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", fmt.Errorf("%w: no peer", ErrNoKey)
		}
		s := p.Addr.String()
		if host, _, err := net.SplitHostPort(s); err == nil {
			s = host
		}
		if a, err := netip.ParseAddr(s); err == nil {
			return a.Unmap().String(), nil
		}
		return cmp.Or(s, p.Addr.Network()), nil
	}
}

// Config configures an Interceptor. Limiter, Limit and Key are required.
type Config struct {
	Limiter *hybrid.Limiter
	// Limit is the limit of the Limiter a call counts against; Methods, if set, names
	// another for some full method names ("/package.Service/Method", as gRPC writes
	// them: a name not of that form would match no call, and is an error).
	Limit   string
	Methods map[string]string
	// Key returns a call's key: Metadata, PeerIP, or a function of your own. An empty
	// key fails the call as ErrNoKey does, never counting it in a bucket every such call
	// would share. A key the client sends (an API key's metadata, before your
	// authentication has checked it) is one it can change on every call: key by an
	// identity your server has checked.
	Key KeyFunc
	// Cost returns a call's cost in tokens (at least 0). nil: every call costs 1. A
	// stream is one call, decided when it opens.
	Cost func(ctx context.Context, fullMethod string) int
	// Skip, if set, lets the calls it returns true for through untouched (health
	// checks, reflection).
	Skip func(fullMethod string) bool
}

// Interceptor limits the calls of a gRPC server. Build it with New and install both
// interceptors: grpc.NewServer(grpc.UnaryInterceptor(i.Unary()),
// grpc.StreamInterceptor(i.Stream())), or chain them. Safe for concurrent use.
type Interceptor struct {
	cfg Config
}

// New returns an Interceptor for cfg, or an error wrapping ErrInvalidConfig: every limit
// it names must be one of the Limiter's.
func New(cfg Config) (*Interceptor, error) {
	switch {
	case cfg.Limiter == nil:
		return nil, fmt.Errorf("%w: no Limiter", ErrInvalidConfig)
	case cfg.Key == nil:
		return nil, fmt.Errorf("%w: no Key function", ErrInvalidConfig)
	}
	for _, name := range append([]string{cfg.Limit}, slices.Collect(maps.Values(cfg.Methods))...) {
		if _, _, err := quota.Of(cfg.Limiter, name, ""); err != nil {
			return nil, fmt.Errorf("%w: limit %q: %w", ErrInvalidConfig, name, err)
		}
	}
	for m := range cfg.Methods {
		svc, method, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
		if !strings.HasPrefix(m, "/") || !ok || svc == "" || method == "" || strings.Contains(method, "/") {
			return nil, fmt.Errorf("%w: method %q, want a full method name: /package.Service/Method", ErrInvalidConfig, m)
		}
	}
	cfg.Methods = maps.Clone(cfg.Methods)
	return &Interceptor{cfg: cfg}, nil
}

// Unary returns the unary server interceptor.
func (i *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := i.check(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor: a stream is decided once, when it opens.
func (i *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := i.check(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &stream{ServerStream: ss, ctx: ctx})
	}
}

// stream is a ServerStream whose context carries the Decision.
type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

// keyError is the status a call fails with when its key function failed with err: the
// function's own status, if it returned one (Unauthenticated for a token it could not
// check, say); Canceled or DeadlineExceeded if the call's context ended; else
// InvalidArgument, a call that carries no key.
func keyError(err error) error {
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return st.Err()
	}
	if st := ended(err); st != nil {
		return st
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

// ended is the status of err if it is the call's context's end (Canceled or
// DeadlineExceeded), else nil.
func ended(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return nil
}

// check decides the call of fullMethod whose context is ctx: the context to go on with,
// or the status error to answer with.
func (i *Interceptor) check(ctx context.Context, fullMethod string) (context.Context, error) {
	if i.cfg.Skip != nil && i.cfg.Skip(fullMethod) {
		return ctx, nil
	}
	limit := i.cfg.Limit
	if l, ok := i.cfg.Methods[fullMethod]; ok {
		limit = l
	}
	key, err := i.cfg.Key(ctx, fullMethod)
	if err == nil && key == "" {
		err = fmt.Errorf("%w: the key function returned an empty key", ErrNoKey)
	}
	if err != nil {
		return ctx, keyError(err)
	}
	n := 1
	if i.cfg.Cost != nil {
		if n = i.cfg.Cost(ctx, fullMethod); n < 0 {
			return ctx, status.Errorf(codes.Internal, "grpclimit: cost %d for %s", n, fullMethod)
		}
	}
	d, err := i.cfg.Limiter.AllowN(ctx, limit, key, n)
	if err != nil {
		if st := ended(err); st != nil {
			return ctx, st
		}
		if errors.Is(err, hybrid.ErrUnknownLimit) { // removed by Reconfigure: the server's configuration
			return ctx, status.Error(codes.Internal, err.Error())
		}
		return ctx, status.Error(codes.Unavailable, err.Error()) // closed
	}
	if ts := grpc.ServerTransportStreamFromContext(ctx); ts != nil {
		// The HTTP middleware's fields, as response header metadata: WriteHeaders writes
		// canonical names, which metadata wants in lower case.
		h := make(http.Header, 3)
		httplimit.WriteHeaders(h, d, httplimit.HeadersStandard, time.Time{})
		for canonical, lower := range headerNames {
			if v, ok := h[canonical]; ok {
				delete(h, canonical)
				h[lower] = v
			}
		}
		_ = ts.SetHeader(metadata.MD(h))
	}
	if d.Allowed {
		return context.WithValue(ctx, decisionKey{}, d), nil
	}
	return ctx, denial(d)
}

// denial is the status of a denied call: ResourceExhausted with RetryInfo; Unavailable
// with RetryInfo when the failure policy denied (Redis did not answer); a call that can
// never pass (its cost above the burst) is FailedPrecondition, without RetryInfo.
func denial(d hybrid.Decision) error {
	if d.RetryAfter >= hybrid.InfDuration {
		return status.Errorf(codes.FailedPrecondition, "grpclimit: call cost exceeds what limit %q can ever admit", d.Limit)
	}
	code, msg := codes.ResourceExhausted, fmt.Sprintf("grpclimit: rate limit %q exceeded", d.Limit)
	if d.Source == hybrid.SourceFallback {
		code, msg = codes.Unavailable, fmt.Sprintf("grpclimit: rate limit %q cannot be checked now (%s)", d.Limit, d.Reason)
	}
	st, err := status.New(code, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)})
	if err != nil {
		return status.Error(code, msg)
	}
	return st.Err()
}

// headerNames are the fields WriteHeaders writes with HeadersStandard, and their
// metadata keys.
var headerNames = map[string]string{"Ratelimit-Policy": "ratelimit-policy", "Ratelimit": "ratelimit", "Retry-After": "retry-after"}

type decisionKey struct{}

// FromContext returns the Decision the Interceptor made for the call whose context ctx
// is (or derives from).
func FromContext(ctx context.Context) (hybrid.Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(hybrid.Decision)
	return d, ok
}

// RetryDelay returns the retry delay a status error carries in a RetryInfo detail, and
// whether it has one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// RetryUnary returns a client interceptor that, when a call fails with
// ResourceExhausted or Unavailable and a RetryInfo delay, waits that delay and calls
// again, at most attempts times in all; it gives up at once, returning the last error,
// when the delay would pass the call's deadline.
func RetryUnary(attempts int) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var err error
		for try := 1; ; try++ {
			if err = invoker(ctx, method, req, reply, cc, opts...); err == nil || try >= attempts {
				return err
			}
			c := status.Code(err)
			delay, ok := RetryDelay(err)
			if !ok || c != codes.ResourceExhausted && c != codes.Unavailable {
				return err
			}
			if dl, has := ctx.Deadline(); has && time.Until(dl) < delay {
				return err
			}
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
	}
}
