// Package adaptertest is the contract the framework adapters of httplimit (ginlimit,
// echolimit) are tested against, written once: a Middleware over an embedded miniredis,
// the routes a router under test serves, the checks, and the benchmark.
package adaptertest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// Tight is Check's limit: 2 requests per key, then one per 1,000 s.
var Tight = hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 2, Policy: breaker.FailClosed, MaxWait: time.Second}

// Endless is Bench's limit, as httplimit's benchmarks have it: a lease that never runs
// out, so every decision is a hit.
var Endless = hybrid.Limit{Name: "api", Rate: 1e12, Burst: 1 << 40, Policy: breaker.FailOpen, MaxWait: time.Second,
	Lease: hybrid.LeaseTuning{RefillInterval: time.Hour, Lifetime: 5 * time.Hour, LowWatermark: -1}}

// Middleware returns a Middleware over a Limiter of the one limit l (named api) over an
// embedded miniredis, keyed by X-API-Key, letting /healthz through.
func Middleware(tb testing.TB, l hybrid.Limit) *httplimit.Middleware {
	tb.Helper()
	m := miniredis.RunT(tb)
	opts := &redis.Options{Addr: m.Addr()}
	global.Configure(opts)
	rdb := redis.NewClient(opts)
	tb.Cleanup(func() { _ = rdb.Close() })
	store, err := global.New(rdb)
	if err != nil {
		tb.Fatal(err)
	}
	brk, err := breaker.New(breaker.Settings{Timeout: 2 * time.Second}) // room for -race
	if err != nil {
		tb.Fatal(err)
	}
	lim, err := hybrid.New(store, hybrid.Config{FleetSize: 1, Breaker: brk, Limits: []hybrid.Limit{l}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = lim.Close(context.Background()) })
	mw, err := httplimit.New(httplimit.Config{Limiter: lim, Limit: "api", Key: httplimit.Header("X-API-Key"),
		Skip: func(r *http.Request) bool { return r.URL.Path == "/healthz" }})
	if err != nil {
		tb.Fatal(err)
	}
	return mw
}

// Items is the handler of GET /v1/items a router under Check serves: it counts its runs
// and checks that the request carries an admitting Decision.
type Items struct {
	T   testing.TB
	ran atomic.Int64
}

func (it *Items) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	it.ran.Add(1)
	if d, ok := httplimit.FromContext(r.Context()); !ok || !d.Allowed {
		it.T.Errorf("handler: decision %+v, %v", d, ok)
	}
	w.WriteHeader(http.StatusOK)
}

// Check asks h, a router that serves GET /v1/items with items and GET /healthz (200)
// behind the adapter of a Middleware with the Tight limit: admitted requests reach the
// handler with their Decision and the headers; the third of a key gets 429 and the
// handler does not run; a request without a key gets 400; /healthz passes untouched.
func Check(t *testing.T, h http.Handler, items *Items) {
	t.Helper()
	ask := func(path, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	codes := ""
	for range 3 {
		w := ask("/v1/items", "k")
		codes += fmt.Sprint(w.Code, " ")
		if w.Header().Get("RateLimit-Policy") == "" {
			t.Errorf("no RateLimit-Policy on a %d", w.Code)
		}
	}
	if ran := items.ran.Load(); codes != "200 200 429 " || ran != 2 {
		t.Fatalf("statuses %s, handler ran %d times; want 200 200 429, twice", codes, ran)
	}
	if w := ask("/v1/items", ""); w.Code != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", w.Code)
	}
	if w := ask("/healthz", ""); w.Code != http.StatusOK || w.Header().Get("RateLimit-Policy") != "" {
		t.Errorf("skipped: %d, headers %v; want 200 untouched", w.Code, w.Header())
	}
}

// Bench measures GET / on bare and on limited, the same route without and with the
// adapter of a Middleware with the Endless limit: a decision from the lease.
func Bench(b *testing.B, bare, limited http.Handler) {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-API-Key", "k")
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{{"limited=false", bare}, {"limited=true", limited}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.h.ServeHTTP(httptest.NewRecorder(), req)
			}
		})
	}
}
