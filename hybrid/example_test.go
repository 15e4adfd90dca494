package hybrid_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/hybrid/hybridtest"
)

// frozen is the system clock stopped when the example starts, so that its output does
// not depend on how fast it runs. Production code leaves Config.Clock nil.
type frozen struct{ at time.Time }

func (c frozen) Now() time.Time { return c.at }

func (frozen) AfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// A limiter as a server of a fleet wires it: one go-redis client configured as the
// library recommends, a store, a breaker, and limits that each choose their failure
// policy. Here an embedded miniredis with a frozen clock stands in for Redis.
func Example() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	m.SetTime(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)) // the scripts read Redis TIME

	opts := &redis.Options{Addr: m.Addr()}
	global.Configure(opts) // no retries of a timed-out script, short timeouts
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	store, err := global.New(rdb)
	if err != nil {
		panic(err)
	}
	// One breaker per Redis. In production keep the call timeout at 5-20ms; the example
	// allows a slow machine a whole second so that its output never changes.
	brk, err := breaker.New(breaker.Settings{Timeout: time.Second})
	if err != nil {
		panic(err)
	}
	lim, err := hybrid.New(store, hybrid.Config{
		FleetSize: 4, // or Fleet: "api-servers" to count live servers in Redis
		Breaker:   brk,
		Seed:      1,
		Clock:     frozen{at: time.Now()},
		Limits: []hybrid.Limit{
			// 1 upload a minute per tenant, bursts of 8, fleet-wide; while Redis is away,
			// each server admits its share (2/min/4 servers, bursts of 2).
			{Name: "upload", Rate: 1.0 / 60, Burst: 8, Policy: breaker.FailLocal(), MaxWait: time.Second},
		},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	// Before taking traffic: scripts loaded, connections open, so the first requests
	// cost what later ones do. The Limiter decides requests whatever it returns.
	if err := lim.Ready(ctx); err != nil {
		fmt.Println("Redis not ready:", err)
	}
	show := func(tenant string) {
		d, err := lim.Allow(ctx, "upload", tenant)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s allowed=%-5v source=%-8v reason=%s\n", tenant, d.Allowed, d.Source, d.Reason)
	}
	// The first request waits for a refill from Redis; later ones use the tokens this
	// server leased. When the bucket runs low the server is paced: it leaves the rest to
	// the other servers and does not ask Redis again until the fleet's round refills.
	for range 6 {
		show("tenant-42")
	}
	// A job that would rather queue than be turned away calls WaitN: it reserves the
	// tokens the bucket still holds (the pacing left them for other servers), and gives
	// up at once when its turn would come after its deadline (the next upload refills a
	// minute off).
	for range 4 {
		job, cancel := context.WithTimeout(ctx, time.Second)
		_, err = lim.WaitN(job, "upload", "tenant-42", 1)
		cancel()
		fmt.Println("wait admitted:", err == nil, "gave up at once:", errors.Is(err, hybrid.ErrWouldExceedDeadline))
	}
	m.SetError("LOADING Redis is loading the dataset in memory") // Redis goes away
	for range 3 {
		show("tenant-7")
	}
	// Redis is back. Close refunds the tokens this server still holds and charges the
	// buckets for what the outage admitted; had Redis stayed away, its error would say
	// how many admissions it could not charge.
	m.SetError("")
	if err := lim.Close(ctx); err != nil {
		fmt.Println("close:", err)
	}
	// Output:
	// tenant-42 allowed=true  source=global   reason=refill granted
	// tenant-42 allowed=true  source=global   reason=refill granted
	// tenant-42 allowed=true  source=lease    reason=lease
	// tenant-42 allowed=true  source=global   reason=refill granted
	// tenant-42 allowed=true  source=lease    reason=lease
	// tenant-42 allowed=false source=lease    reason=paced after contention
	// wait admitted: true gave up at once: false
	// wait admitted: true gave up at once: false
	// wait admitted: true gave up at once: false
	// wait admitted: false gave up at once: true
	// tenant-7 allowed=true  source=fallback reason=redis unavailable
	// tenant-7 allowed=true  source=fallback reason=redis unavailable
	// tenant-7 allowed=false source=fallback reason=redis unavailable
}

// A request that counts against a per-key limit and a per-tenant limit at once: the
// tenant's limit denies the third request, and the key's token is not spent for it.
func ExampleLimiter_AllowMulti() {
	lim, done := exampleLimiter(
		hybrid.Limit{Name: "per-key", Rate: 1, Burst: 5, Policy: breaker.FailClosed, MaxWait: time.Second},
		hybrid.Limit{Name: "per-tenant", Rate: 1, Burst: 2, Policy: breaker.FailClosed, MaxWait: time.Second},
	)
	defer done()

	items := []hybrid.Item{{Limit: "per-key", Key: "key-1", Cost: 1}, {Limit: "per-tenant", Key: "acme", Cost: 1}}
	for range 3 {
		d, err := lim.AllowMulti(context.Background(), items)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v denied-by=%d limit=%s retry-after=%v\n", d.Allowed, d.Denied, d.Decision.Limit, d.RetryAfter)
	}
	for _, ls := range lim.Stats().Limits {
		admitted := int64(0)
		for _, d := range ls.Decisions {
			if d.Allowed {
				admitted += d.Count
			}
		}
		fmt.Printf("%s admitted %d\n", ls.Name, admitted)
	}
	// Output:
	// allowed=true denied-by=-1 limit=per-tenant retry-after=0s
	// allowed=true denied-by=-1 limit=per-tenant retry-after=0s
	// allowed=false denied-by=1 limit=per-tenant retry-after=1s
	// per-key admitted 2
	// per-tenant admitted 2
}

// exampleLimiter is a Limiter on an embedded Redis with a frozen clock, for the examples
// of one method; it returns the Limiter and a func that closes everything.
func exampleLimiter(limits ...hybrid.Limit) (*hybrid.Limiter, func()) {
	return exampleLimiterOn(frozen{at: time.Now()}, limits...)
}

// exampleLimiterOn is exampleLimiter on clock (nil: the real one).
func exampleLimiterOn(clock breaker.Clock, limits ...hybrid.Limit) (*hybrid.Limiter, func()) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	m.SetTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	if err := hybridtest.Bitfield(m); err != nil { // for Windowed limits
		panic(err)
	}
	opts := &redis.Options{Addr: m.Addr()}
	global.Configure(opts)
	rdb := redis.NewClient(opts)
	store, err := global.New(rdb)
	if err != nil {
		panic(err)
	}
	brk, err := breaker.New(breaker.Settings{Timeout: time.Second}) // production: 5-20ms
	if err != nil {
		panic(err)
	}
	lim, err := hybrid.New(store, hybrid.Config{FleetSize: 1, Breaker: brk, Clock: clock, Limits: limits})
	if err != nil {
		panic(err)
	}
	return lim, func() { lim.Close(context.Background()); rdb.Close(); m.Close() }
}

// A paid plan gets another rate and burst for the same limit: the caller passes the
// key's tier with each request.
func ExampleLimiter_AllowTier() {
	lim, done := exampleLimiter(hybrid.Limit{Name: "api", Rate: 1, Burst: 2, Policy: breaker.FailOpen, MaxWait: time.Second,
		Tiers: []hybrid.Tier{{Name: "paid", Rate: 10, Burst: 4}}})
	defer done()
	ctx := context.Background()
	for _, c := range []struct{ key, tier string }{{"free-user", ""}, {"paid-user", "paid"}} {
		admitted := 0
		for range 6 {
			if d, _ := lim.AllowTier(ctx, "api", c.tier, c.key, 1); d.Allowed {
				admitted++
			}
		}
		fmt.Printf("%s: %d of 6 admitted at once\n", c.key, admitted)
	}
	// Output:
	// free-user: 2 of 6 admitted at once
	// paid-user: 4 of 6 admitted at once
}

// A reloaded configuration lowers a limit on a running Limiter; the new Version lets
// servers that have not reloaded yet be held to it by Redis.
func ExampleLimiter_Reconfigure() {
	api := hybrid.Limit{Name: "api", Rate: 1, Burst: 10, Policy: breaker.FailOpen, MaxWait: time.Second}
	lim, done := exampleLimiter(api)
	defer done()
	ctx := context.Background()
	lim.Allow(ctx, "api", "k")
	api.Burst, api.Version = 3, 1
	if err := lim.Reconfigure([]hybrid.Limit{api}); err != nil {
		panic(err)
	}
	admitted := 0
	for range 10 {
		if d, _ := lim.Allow(ctx, "api", "k"); d.Allowed {
			admitted++
		}
	}
	fmt.Println("admitted after the change:", admitted, "quota:", lim.Limits()[0].Burst)
	api.Burst = 20 // the same Version: refused
	fmt.Println(errors.Is(lim.Reconfigure([]hybrid.Limit{api}), hybrid.ErrInvalidConfig))
	// Output:
	// admitted after the change: 3 quota: 3
	// true
}

// A job scheduler reserves its tokens instead of being turned away, and learns when it
// may run.
func ExampleLimiter_ReserveN() {
	lim, done := exampleLimiter(hybrid.Limit{Name: "jobs", Rate: 2, Burst: 2, Policy: breaker.FailClosed, MaxWait: time.Second})
	defer done()
	ctx := context.Background()
	for range 4 {
		r, err := lim.ReserveN(ctx, "jobs", "batch", 1)
		if err != nil {
			panic(err)
		}
		fmt.Println("ok:", r.OK(), "run in:", r.Delay())
	}
	// Output:
	// ok: true run in: 0s
	// ok: true run in: 0s
	// ok: true run in: 500ms
	// ok: true run in: 1s
}

// untilWarm asks for new keys of limit until lim admits one without asking Redis: a new
// server of a ChargeLater or Windowed limit asks for every request until its first
// exchange with the fleet is answered. A service does not wait so; an example's output
// must not depend on how fast that exchange is.
func untilWarm(ctx context.Context, lim *hybrid.Limiter, limit string) {
	for i := 0; ; i++ {
		if d, _ := lim.Allow(ctx, limit, fmt.Sprint("warm-up-", i)); d.Reason == hybrid.ReasonAsync {
			return
		}
		time.Sleep(5 * time.Millisecond) // the exchange goes with the Limiter's timer
	}
}

// A per-client limit over a large fleet: with ChargeLater, a client's request is admitted
// without waiting for Redis unless this server knows the client's bucket is low, and
// charged to it within the given time. A new server waits for its first exchange of low
// keys with the fleet (at half that time) before it admits anything that way.
func ExampleChargeLater() {
	perClient := hybrid.Limit{Name: "client", Rate: 50, Burst: 50, Policy: breaker.FailClosed,
		MaxWait: time.Second, Mode: hybrid.ChargeLater(20 * time.Millisecond)}
	lim, done := exampleLimiterOn(nil, perClient) // time passes: the real clock
	defer done()
	ctx := context.Background()
	untilWarm(ctx, lim, "client")
	for _, client := range []string{"alice", "bob"} {
		d, _ := lim.Allow(ctx, "client", client)
		fmt.Println(client, d.Allowed, d.Reason)
	}
	// Output:
	// alice true charged later
	// bob true charged later
}

// A per-client limit over a large fleet at a tenth of the Redis work: with Windowed, a
// client gets Burst requests per window of Burst/Rate, counted in Redis in shared
// arrays (BITFIELD, no script) with one report per server every report interval. A
// client this server knows nothing against is admitted without asking Redis, once the
// server has read the fleet's marks (25 ms after its start).
func ExampleWindowed() {
	perClient := hybrid.Limit{Name: "client", Rate: 50, Burst: 50, Policy: breaker.FailClosed,
		MaxWait: time.Second, Mode: hybrid.Windowed(20 * time.Millisecond)}
	lim, done := exampleLimiterOn(nil, perClient) // time passes: the real clock
	defer done()
	ctx := context.Background()
	untilWarm(ctx, lim, "client")
	for _, client := range []string{"alice", "bob"} {
		d, _ := lim.Allow(ctx, "client", client)
		fmt.Println(client, d.Allowed, d.Reason)
	}
	// Output:
	// alice true charged later
	// bob true charged later
}
