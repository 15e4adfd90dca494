package httplimit_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// exampleLimiter is a Limiter over an embedded miniredis, as a service would build one
// over its Redis (hybrid's Example shows the production settings).
func exampleLimiter(limits ...hybrid.Limit) (*hybrid.Limiter, func()) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
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
	lim, err := hybrid.New(store, hybrid.Config{FleetSize: 1, Breaker: brk, Limits: limits})
	if err != nil {
		panic(err)
	}
	return lim, func() { lim.Close(context.Background()); rdb.Close(); m.Close() }
}

// Each API key gets 100 requests a second, bursts of 200, across the fleet; a denied
// request gets 429 with Retry-After and the standard RateLimit fields.
func Example() {
	lim, done := exampleLimiter(hybrid.Limit{Name: "api", Rate: 100, Burst: 200, Policy: breaker.FailOpen, MaxWait: time.Second})
	defer done()

	mw, err := httplimit.New(httplimit.Config{
		Limiter: lim,
		Limit:   "api",
		Key:     httplimit.Header("X-API-Key"),
	})
	if err != nil {
		panic(err) // a limit the Limiter does not have, no Key function
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/items", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "items") })
	handler := mw.Wrap(mux) // or chi: r.Use(mw.Wrap)

	req := httptest.NewRequest(http.MethodGet, "/v1/items", nil)
	req.Header.Set("X-API-Key", "key-1")
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get("RateLimit-Policy"))
	// Output:
	// 200 "api";q=200;w=2
}

// Behind a load balancer, key by the client's address as the balancer saw it, and
// answer denials with a page of your own that reads the Decision.
func ExampleClientIP() {
	lim, done := exampleLimiter(hybrid.Limit{Name: "per-ip", Rate: 1, Burst: 2, Policy: breaker.FailOpen, MaxWait: time.Second})
	defer done()

	key, err := httplimit.ClientIP(httplimit.IPOptions{
		Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, // the balancers
	})
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(httplimit.Config{
		Limiter: lim,
		Limit:   "per-ip",
		Key:     key,
		Headers: httplimit.HeadersStandard | httplimit.HeadersX,
		Deny: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := httplimit.FromContext(r.Context())
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, "slow down: %s, %d tokens left\n", d.Reason, d.Remaining)
		}),
	})
	if err != nil {
		panic(err)
	}
	handler := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for range 3 {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "10.1.2.3:40000"
		req.Header.Set("X-Forwarded-For", "198.51.100.7")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Printf("%d remaining=%s retry-after=%q %q\n", rec.Code, rec.Header().Get("X-RateLimit-Remaining"),
			rec.Header().Get("Retry-After"), rec.Body.String())
	}
	// Output:
	// 200 remaining=1 retry-after="" ""
	// 200 remaining=0 retry-after="" ""
	// 429 remaining=0 retry-after="1" "slow down: pre-check bucket empty, 0 tokens left\n"
}

// A whole service, as the README shows it: one go-redis client configured as the library
// needs, a Limiter that counts the live servers of its fleet in Redis and logs the rare
// events, and the middleware in front of the service's mux. Here an embedded miniredis
// stands in for Redis, and one request goes through the handler.
func Example_service() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	redisAddr := m.Addr()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/items", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "items") })

	// README:start
	opts := &redis.Options{Addr: redisAddr}
	global.Configure(opts) // no retry of a timed-out script, short timeouts, one dial attempt
	store, err := global.New(redis.NewClient(opts))
	if err != nil {
		log.Fatal(err)
	}
	lim, err := hybrid.New(store, hybrid.Config{
		FleetSize: 200,           // a first guess: the live servers are counted in Redis
		Fleet:     "api-servers", // under this name
		Limits: []hybrid.Limit{
			// 100 requests a second per API key, bursts of 200, across the whole fleet;
			// while Redis is away each server admits its share. There is no default policy.
			{Name: "api", Rate: 100, Burst: 200, Policy: breaker.FailLocal()},
		},
		Logger: slog.Default(), // breaker changes, lost refunds, fleet size: never per request
	})
	if err != nil {
		log.Fatal(err) // invalid limits fail here, never at request time
	}
	defer lim.Close(context.Background()) // gives back the tokens this server still holds

	// Before taking traffic: scripts loaded, connections open. If Redis is not ready,
	// requests are decided anyway, by their policy if need be.
	if err := lim.Ready(context.Background()); err != nil {
		log.Print(err)
	}

	mw, err := httplimit.New(httplimit.Config{Limiter: lim, Limit: "api", Key: httplimit.Header("X-API-Key")})
	if err != nil {
		log.Fatal(err)
	}
	handler := mw.Wrap(mux) // 429 + Retry-After + RateLimit headers; or chi: r.Use(mw.Wrap)
	// README:end

	req := httptest.NewRequest(http.MethodGet, "/v1/items", nil)
	req.Header.Set("X-API-Key", "key-1")
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Print(rec.Code, " ", rec.Header().Get("RateLimit-Policy"), " ", rec.Body.String())
	// Output:
	// 200 "api";q=200;w=2 items
}

// Health checks and metrics pass untouched; every other request needs an API key and is
// limited.
func ExampleConfig_skip() {
	lim, done := exampleLimiter(hybrid.Limit{Name: "api", Rate: 100, Burst: 200, Policy: breaker.FailOpen, MaxWait: time.Second})
	defer done()

	mw, err := httplimit.New(httplimit.Config{
		Limiter: lim, Limit: "api", Key: httplimit.Header("X-API-Key"),
		Skip: func(r *http.Request) bool { return r.URL.Path == "/healthz" || r.URL.Path == "/metrics" },
	})
	if err != nil {
		panic(err)
	}
	handler := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, path := range []string{"/healthz", "/v1/items"} {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil)) // no X-API-Key
		fmt.Println(path, rec.Code)
	}
	// Output:
	// /healthz 200
	// /v1/items 400
}

// One limit, a bucket per client and endpoint: the middleware wraps each route's
// handler, so the key carries the route's pattern, not the item's id.
func ExampleKeyByEndpoint() {
	lim, done := exampleLimiter(hybrid.Limit{Name: "per-endpoint", Rate: 1e-3, Burst: 1, Policy: breaker.FailOpen, MaxWait: time.Second})
	defer done()

	mw, err := httplimit.New(httplimit.Config{
		Limiter: lim, Limit: "per-endpoint",
		Key: httplimit.KeyByEndpoint(httplimit.Header("X-API-Key")),
	})
	if err != nil {
		panic(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", mw.Wrap(ok))
	mux.Handle("GET /orders", mw.Wrap(ok))
	for _, path := range []string{"/items/1", "/orders", "/items/2"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("X-API-Key", "key-1")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Println(path, rec.Code)
	}
	// Output:
	// /items/1 200
	// /orders 200
	// /items/2 429
}

// Behind Cloudflare, the client's address is in CF-Connecting-IP; IPv6 clients are
// counted by their /64 (IPv6Prefix's default).
func ExampleClientIP_cloudflare() {
	key, err := httplimit.ClientIP(httplimit.IPOptions{
		Trusted: []netip.Prefix{netip.MustParsePrefix("173.245.48.0/20")}, // Cloudflare's ranges, in full
		Header:  "CF-Connecting-IP",
	})
	if err != nil {
		panic(err)
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "173.245.48.10:443"
	req.Header.Set("CF-Connecting-IP", "2001:db8:1:2:aaaa:bbbb:cccc:dddd")
	fmt.Println(key(req))
	// Output:
	// 2001:db8:1:2::/64 <nil>
}
