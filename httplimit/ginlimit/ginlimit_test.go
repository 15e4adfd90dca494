package ginlimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/httplimit/ginlimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// limiter is a Middleware over a Limiter of the one limit l, named api, over an
// embedded miniredis.
func limiter(tb testing.TB, l hybrid.Limit) *httplimit.Middleware {
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
	brk, err := breaker.New(breaker.Settings{Timeout: 2 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	lim, err := hybrid.New(store, hybrid.Config{FleetSize: 1, Breaker: brk,
		Limits: []hybrid.Limit{l}})
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

// TestGin: through gin, admitted requests reach the handler with their Decision and
// the headers; a denied one gets 429 and the handler is not run; a request without a
// key gets 400; a skipped one passes untouched.
func TestGin(t *testing.T) {
	gin.SetMode(gin.TestMode)
	mw := limiter(t, hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 2, Policy: breaker.FailClosed, MaxWait: time.Second})
	r := gin.New()
	r.Use(ginlimit.New(mw))
	ran := 0
	r.GET("/v1/items", func(c *gin.Context) {
		ran++
		d, ok := httplimit.FromContext(c.Request.Context())
		if !ok || !d.Allowed {
			t.Errorf("handler: decision %+v, %v", d, ok)
		}
		c.String(http.StatusOK, "items")
	})
	r.GET("/healthz", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
	ask := func(path, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
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
	if codes != "200 200 429 " || ran != 2 {
		t.Fatalf("statuses %s, handler ran %d times; want 200 200 429, twice", codes, ran)
	}
	if w := ask("/v1/items", ""); w.Code != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", w.Code)
	}
	if w := ask("/healthz", ""); w.Code != http.StatusOK || w.Header().Get("RateLimit-Policy") != "" {
		t.Errorf("skipped: %d, headers %v; want 200 untouched", w.Code, w.Header())
	}
}

// BenchmarkGin: a gin route behind the limiter, a decision from the lease, against the
// same route without it.
func BenchmarkGin(b *testing.B) {
	gin.SetMode(gin.ReleaseMode)
	// As httplimit's benchmarks: a lease that never runs out, so every decision is a hit.
	mw := limiter(b, hybrid.Limit{Name: "api", Rate: 1e12, Burst: 1 << 40, Policy: breaker.FailOpen, MaxWait: time.Second,
		Lease: hybrid.LeaseTuning{RefillInterval: time.Hour, Lifetime: 5 * time.Hour, LowWatermark: -1}})
	for _, limited := range []bool{false, true} {
		r := gin.New()
		if limited {
			r.Use(ginlimit.New(mw))
		}
		r.GET("/", func(c *gin.Context) { c.Status(http.StatusNoContent) })
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-API-Key", "k")
		b.Run(fmt.Sprintf("limited=%v", limited), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.ServeHTTP(httptest.NewRecorder(), req)
			}
		})
	}
}
