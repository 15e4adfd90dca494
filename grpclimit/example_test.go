package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/grpclimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// Each API key gets 2 calls, then 1 a second, across the fleet, on every method of a
// gRPC server; a denied call gets ResourceExhausted with the delay to retry after.
func Example() {
	m := miniredis.NewMiniRedis() // your Redis
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	opts := &redis.Options{Addr: m.Addr()}
	global.Configure(opts)
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	store, err := global.New(rdb)
	if err != nil {
		panic(err)
	}
	lim, err := hybrid.New(store, hybrid.Config{FleetSize: 1, // this server alone; a fleet names its size or Fleet
		Limits: []hybrid.Limit{{Name: "api", Rate: 1, Burst: 2, Policy: breaker.FailOpen, MaxWait: time.Second}}})
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	// README:start
	rl, err := grpclimit.New(grpclimit.Config{Limiter: lim, Limit: "api", Key: grpclimit.Metadata("x-api-key")})
	if err != nil {
		panic(err) // a limit the Limiter does not have, no Key function
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(rl.Unary()), grpc.StreamInterceptor(rl.Stream()))
	// README:end
	healthpb.RegisterHealthServer(srv, health.NewServer()) // your services
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "key-1")
	for range 3 {
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		delay, _ := grpclimit.RetryDelay(err)
		fmt.Println(status.Code(err), delay > 0)
	}
	// Output:
	// OK false
	// OK false
	// ResourceExhausted true
}
