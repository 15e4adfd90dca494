package grpclimit_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/grpclimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// limiter is a Limiter of the limits over an embedded miniredis (m, to stop it), or
// over the Redis at addr if not "".
func limiter(tb testing.TB, addr string, limits ...hybrid.Limit) (*hybrid.Limiter, *miniredis.Miniredis) {
	tb.Helper()
	var m *miniredis.Miniredis
	if addr == "" {
		m = miniredis.RunT(tb)
		addr = m.Addr()
	}
	opts := &redis.Options{Addr: addr}
	global.Configure(opts)
	rdb := redis.NewClient(opts)
	tb.Cleanup(func() { _ = rdb.Close() })
	store, err := global.New(rdb, global.Prefix("grpclimit-"+time.Now().Format("150405.000000000")+":"))
	if err != nil {
		tb.Fatal(err)
	}
	brk, err := breaker.New(breaker.Settings{Timeout: 2 * time.Second, FailureThreshold: 1})
	if err != nil {
		tb.Fatal(err)
	}
	l, err := hybrid.New(store, hybrid.Config{FleetSize: 1, Breaker: brk, Limits: limits})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, m
}

// serve starts a gRPC server with the health service behind i's interceptors, and
// returns a client connection to it.
func serve(t *testing.T, i *grpclimit.Interceptor, client ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(i.Unary(), decided), grpc.ChainStreamInterceptor(i.Stream(), decidedStream))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, client...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// decided and decidedStream stand between the Interceptor and the handler of every call
// serve's server takes, and fail a call whose handler's context holds no admitting
// Decision (FromContext): what the Interceptor lets through, it lets through decided.
func decided(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if d, ok := grpclimit.FromContext(ctx); !ok || !d.Allowed {
		return nil, status.Errorf(codes.Internal, "the handler's context holds no admitting Decision (%v, %+v)", ok, d)
	}
	return handler(ctx, req)
}

func decidedStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if d, ok := grpclimit.FromContext(ss.Context()); !ok || !d.Allowed {
		return status.Errorf(codes.Internal, "the stream's context holds no admitting Decision (%v, %+v)", ok, d)
	}
	return handler(srv, ss)
}

// TestInterceptor, end to end over a real gRPC server and client, on miniredis and, when
// one answers at REDIS_ADDR (default 127.0.0.1:6379; under CI it must), a real Redis: unary calls within the limit pass with
// the rate-limit header metadata; the next is ResourceExhausted with a RetryInfo delay;
// a call without a key is InvalidArgument; a stream is decided when it opens, under its
// method's own limit; a denial by the failure policy while Redis is away is Unavailable
// with RetryInfo.
func TestInterceptor(t *testing.T) {
	targets := map[string]string{"miniredis": ""}
	addr := cmp.Or(os.Getenv("REDIS_ADDR"), "127.0.0.1:6379")
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		_ = c.Close()
		targets["redis"] = addr
	} else if os.Getenv("CI") != "" {
		t.Fatalf("CI is set and no Redis answers at %s: %v", addr, err)
	}
	for name, addr := range targets {
		t.Run(name, func(t *testing.T) {
			lim, m := limiter(t, addr,
				hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 2, Policy: breaker.FailClosed, MaxWait: time.Second},
				hybrid.Limit{Name: "watch", Rate: 1e-3, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second})
			i, err := grpclimit.New(grpclimit.Config{Limiter: lim, Limit: "api", Key: grpclimit.Metadata("x-api-key"),
				Methods: map[string]string{"/grpc.health.v1.Health/Watch": "watch"}})
			if err != nil {
				t.Fatal(err)
			}
			cc := serve(t, i)
			hc := healthpb.NewHealthClient(cc)
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1")
			for n := range 2 {
				var hdr metadata.MD
				if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr)); err != nil {
					t.Fatalf("call %d: %v", n, err)
				}
				if got := hdr.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"api";q=2;w=2000` {
					t.Errorf("call %d: ratelimit-policy %q", n, got)
				}
			}
			_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{})
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("third call: %v, want ResourceExhausted", err)
			}
			if d, ok := grpclimit.RetryDelay(err); !ok || d <= 0 {
				t.Errorf("third call: retry delay %v, %v; want one", d, ok)
			}
			if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.InvalidArgument {
				t.Errorf("no key: %v, want InvalidArgument", err)
			}
			for n, want := range []codes.Code{codes.OK, codes.ResourceExhausted} {
				ws, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
				if err == nil {
					_, err = ws.Recv()
				}
				if status.Code(err) != want {
					t.Fatalf("stream %d: %v, want %v", n, err, want)
				}
			}
			if m == nil {
				return
			}
			m.Close() // Redis away: FailClosed denies, and says it is not the client's doing
			_, err = hc.Check(metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k2"), &healthpb.HealthCheckRequest{})
			if _, ok := grpclimit.RetryDelay(err); status.Code(err) != codes.Unavailable || !ok {
				t.Errorf("Redis away: %v, want Unavailable with RetryInfo", err)
			}
		})
	}
}

// TestRemovedLimit: a limit Reconfigure removed answers Internal, the server's
// configuration, with no RetryInfo: retrying does not help.
func TestRemovedLimit(t *testing.T) {
	api := hybrid.Limit{Name: "api", Rate: 1, Burst: 2, Policy: breaker.FailClosed, MaxWait: time.Second}
	other := hybrid.Limit{Name: "other", Rate: 1, Burst: 2, Policy: breaker.FailClosed, MaxWait: time.Second}
	lim, _ := limiter(t, "", api, other)
	i, err := grpclimit.New(grpclimit.Config{Limiter: lim, Limit: "api", Key: grpclimit.Metadata("x-api-key")})
	if err != nil {
		t.Fatal(err)
	}
	hc := healthpb.NewHealthClient(serve(t, i))
	if err := lim.Reconfigure([]hybrid.Limit{other}); err != nil {
		t.Fatal(err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1")
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if _, ok := grpclimit.RetryDelay(err); status.Code(err) != codes.Internal || ok {
		t.Errorf("a removed limit: %v (RetryInfo %v), want Internal without", err, ok)
	}
}

// TestRetryUnary: the client interceptor waits the RetryInfo delay and calls again.
func TestRetryUnary(t *testing.T) {
	lim, _ := limiter(t, "", hybrid.Limit{Name: "api", Rate: 20, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second})
	i, err := grpclimit.New(grpclimit.Config{Limiter: lim, Limit: "api", Key: grpclimit.PeerIP()})
	if err != nil {
		t.Fatal(err)
	}
	hc := healthpb.NewHealthClient(serve(t, i, grpc.WithUnaryInterceptor(grpclimit.RetryUnary(3))))
	for n := range 3 { // 20/s, burst 1: the 2nd and 3rd wait about 50 ms each
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d: %v, want it retried until admitted", n, err)
		}
	}
}

// TestRetryUnaryGivesUp: the client interceptor calls again on ResourceExhausted and
// Unavailable with a RetryInfo delay, at most attempts times in all, and returns the
// last error at once on any other code, without RetryInfo, or when the delay would pass
// the call's deadline (before it: the deadline has not passed when it returns).
func TestRetryUnaryGivesUp(t *testing.T) {
	withDelay := func(c codes.Code, d time.Duration) error {
		st, err := status.New(c, "limited").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	for _, tc := range []struct {
		name     string
		err      error
		deadline time.Duration // 0: none
		calls    int
	}{
		{"resource exhausted", withDelay(codes.ResourceExhausted, time.Millisecond), 0, 3},
		{"unavailable", withDelay(codes.Unavailable, time.Millisecond), 0, 3},
		{"another code", withDelay(codes.FailedPrecondition, time.Millisecond), 0, 1},
		{"no RetryInfo", status.Error(codes.ResourceExhausted, "limited"), 0, 1},
		{"past the deadline", withDelay(codes.ResourceExhausted, time.Hour), time.Second, 1},
		{"within the deadline", withDelay(codes.ResourceExhausted, time.Millisecond), time.Minute, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			calls := 0
			invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
				calls++
				return tc.err
			}
			err := grpclimit.RetryUnary(3)(ctx, "/a.B/C", nil, nil, nil, invoker)
			if calls != tc.calls || status.Code(err) != status.Code(tc.err) || ctx.Err() != nil {
				t.Errorf("%d calls, %v, context %v; want %d and the invoker's error, in time", calls, err, ctx.Err(), tc.calls)
			}
		})
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	lim, _ := limiter(t, "", hybrid.Limit{Name: "api", Rate: 1, Burst: 1, Policy: breaker.FailOpen})
	for _, cfg := range []grpclimit.Config{
		{Limit: "api", Key: grpclimit.PeerIP()},
		{Limiter: lim, Limit: "api"},
		{Limiter: lim, Limit: "nope", Key: grpclimit.PeerIP()},
		{Limiter: lim, Limit: "api", Key: grpclimit.PeerIP(), Methods: map[string]string{"/a.B/C": "nope"}},
		{Limiter: lim, Limit: "api", Key: grpclimit.PeerIP(), Methods: map[string]string{"a.B/C": "api"}},
		{Limiter: lim, Limit: "api", Key: grpclimit.PeerIP(), Methods: map[string]string{"/a.B": "api"}},
		{Limiter: lim, Limit: "api", Key: grpclimit.PeerIP(), Methods: map[string]string{"/a.B/": "api"}},
		{Limiter: lim, Limit: "api", Key: grpclimit.PeerIP(), Methods: map[string]string{"//C": "api"}},
		{Limiter: lim, Limit: "api", Key: grpclimit.PeerIP(), Methods: map[string]string{"/a.B/C/D": "api"}},
	} {
		if _, err := grpclimit.New(cfg); !errors.Is(err, grpclimit.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestPeerIP: a peer's IP address (an IPv4-mapped one as IPv4), a Unix socket's address
// as it is (its network's name when it has none), and ErrNoKey without a peer.
func TestPeerIP(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string // "": ErrNoKey
	}{
		{&net.TCPAddr{IP: net.ParseIP("198.51.100.9"), Port: 4711}, "198.51.100.9"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:198.51.100.9"), Port: 4711}, "198.51.100.9"},
		{stringAddr("[::ffff:198.51.100.9]:4711"), "198.51.100.9"}, // a transport's own Addr, written mapped
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 443}, "2001:db8:1:2:aaaa::1"},
		{&net.UnixAddr{Name: "@", Net: "unix"}, "@"},
		{&net.UnixAddr{Name: "", Net: "unix"}, "unix"},
		{nil, ""},
	} {
		ctx := context.Background()
		if tc.addr != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: tc.addr})
		}
		got, err := grpclimit.PeerIP()(ctx, "/a.B/C")
		if tc.want == "" {
			if !errors.Is(err, grpclimit.ErrNoKey) {
				t.Errorf("%v: %q, %v; want ErrNoKey", tc.addr, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %q, %v; want %q", tc.addr, got, err, tc.want)
		}
	}
}

// TestEmptyKey: a key function that returns an empty key fails the call with
// InvalidArgument, as a missing key does, and spends nothing.
func TestEmptyKey(t *testing.T) {
	lim, _ := limiter(t, "", hybrid.Limit{Name: "api", Rate: 1, Burst: 1, Policy: breaker.FailOpen})
	i, err := grpclimit.New(grpclimit.Config{Limiter: lim, Limit: "api", Key: func(context.Context, string) (string, error) { return "", nil }})
	if err != nil {
		t.Fatal(err)
	}
	_, err = i.Unary()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/a.B/C"}, func(context.Context, any) (any, error) {
		t.Error("the handler ran")
		return nil, nil
	})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("%v, want InvalidArgument", err)
	}
}

// TestKeyErrors: a key function's status error is the call's, its context's end is
// Canceled or DeadlineExceeded, and any other error InvalidArgument; none spends.
func TestKeyErrors(t *testing.T) {
	lim, _ := limiter(t, "", hybrid.Limit{Name: "api", Rate: 1, Burst: 1, Policy: breaker.FailOpen})
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{status.Error(codes.Unauthenticated, "bad token"), codes.Unauthenticated},
		{fmt.Errorf("identity service: %w", status.Error(codes.Unavailable, "down")), codes.Unavailable},
		{fmt.Errorf("looking up the tenant: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{fmt.Errorf("%w: no tenant", grpclimit.ErrNoKey), codes.InvalidArgument},
		{errors.New("no tenant"), codes.InvalidArgument},
		{status.Error(codes.Unknown, "no tenant"), codes.InvalidArgument},
	} {
		i, err := grpclimit.New(grpclimit.Config{Limiter: lim, Limit: "api", Key: func(context.Context, string) (string, error) { return "", tc.err }})
		if err != nil {
			t.Fatal(err)
		}
		_, err = i.Unary()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/a.B/C"}, func(context.Context, any) (any, error) {
			t.Error("the handler ran")
			return nil, nil
		})
		if status.Code(err) != tc.want {
			t.Errorf("key error %v: %v, want %v", tc.err, err, tc.want)
		}
	}
	for _, ls := range lim.Stats().Limits {
		if len(ls.Decisions) != 0 {
			t.Errorf("limit %s decided calls without a key: %+v", ls.Name, ls.Decisions)
		}
	}
}

// TestCost: a call's cost, from Config.Cost, is charged to its key's bucket; a cost of
// 0 passes even where no token is left; a negative cost fails the call with Internal,
// the server's bug, and a cost above the burst with FailedPrecondition, without
// RetryInfo: neither reaches the handler, and only a denial says when to retry.
func TestCost(t *testing.T) {
	lim, _ := limiter(t, "", hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 3, Policy: breaker.FailClosed, MaxWait: time.Second})
	var cost int
	i, err := grpclimit.New(grpclimit.Config{Limiter: lim, Limit: "api",
		Key:  func(context.Context, string) (string, error) { return "k", nil },
		Cost: func(context.Context, string) int { return cost }})
	if err != nil {
		t.Fatal(err)
	}
	for n, tc := range []struct {
		cost int
		want codes.Code
	}{
		{2, codes.OK},                // 1 left
		{2, codes.ResourceExhausted}, // more than the 1 left
		{1, codes.OK},                // the last
		{0, codes.OK},                // free, though none is left
		{-1, codes.Internal},
		{4, codes.FailedPrecondition}, // above the burst: never
	} {
		cost = tc.cost
		ran := false
		_, err := i.Unary()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/a.B/C"}, func(context.Context, any) (any, error) {
			ran = true
			return nil, nil
		})
		_, retry := grpclimit.RetryDelay(err)
		if status.Code(err) != tc.want || ran != (tc.want == codes.OK) || retry != (tc.want == codes.ResourceExhausted) {
			t.Errorf("call %d of cost %d: %v (handler ran: %v, RetryInfo: %v), want %v", n, tc.cost, err, ran, retry, tc.want)
		}
	}
}

// BenchmarkUnary is the interceptor's own cost: a unary call's interceptor around a
// no-op handler, a decision from the lease, against the handler alone.
func BenchmarkUnary(b *testing.B) {
	lim, _ := limiter(b, "", hybrid.Limit{Name: "api", Rate: 1e12, Burst: 1 << 40, Policy: breaker.FailOpen, MaxWait: time.Second,
		Lease: hybrid.LeaseTuning{RefillInterval: time.Hour, Lifetime: 5 * time.Hour, LowWatermark: -1}})
	i, err := grpclimit.New(grpclimit.Config{Limiter: lim, Limit: "api", Key: grpclimit.Metadata("x-api-key")})
	if err != nil {
		b.Fatal(err)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "k"))
	ctx = grpc.NewContextWithServerTransportStream(ctx, nopStream{}) // headers are set, as on a real call
	info := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	unary := i.Unary()
	b.Run("handler", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = handler(ctx, nil)
		}
	})
	b.Run("limited", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := unary(ctx, nil, info, handler); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// nopStream is a grpc.ServerTransportStream that drops what it is given.
type nopStream struct{}

func (nopStream) Method() string                  { return "/grpc.health.v1.Health/Check" }
func (nopStream) SetHeader(metadata.MD) error     { return nil }
func (nopStream) SendHeader(metadata.MD) error    { return nil }
func (nopStream) SetTrailer(md metadata.MD) error { return nil }

// stringAddr is a net.Addr that writes itself as it is: an IPv4-mapped address stays
// mapped, as net.TCPAddr's String would not write it.
type stringAddr string

func (a stringAddr) Network() string { return "tcp" }
func (a stringAddr) String() string  { return string(a) }
