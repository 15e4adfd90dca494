package httplimit_test

import (
	"context"
	"net/http"
	"runtime"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// The middleware's overhead, measured in one run beside its baselines:
//
//	go test ./httplimit -run '^$' -bench . -benchmem -count 8
//
// BareRateAllow is a bare x/time/rate Allow; Allow the Limiter's hot path (a lease that
// holds tokens); Handler a no-op handler called directly; Middleware the same handler
// behind the middleware (key from a header, the standard headers written, the Decision
// put in the request's context). The limit never runs dry and the lease never refills
// in the timed loop (see hybrid's benchmarks), so no Redis call is timed.

// nopWriter is a ResponseWriter that keeps its headers and discards the rest; each
// iteration clears the headers, as a new response would start empty.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopWriter) WriteHeader(int)             {}

var nop = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})

// benchLimiter is a Limiter with one limit, name, that never runs dry.
func benchLimiter(b testing.TB, name string) *hybrid.Limiter {
	_, c := redistest.Mini(b)
	return newLimiter(b, redistest.Target{Client: c}, hybrid.Limit{Name: name, Rate: 1e12, Burst: 1 << 40,
		Policy: breaker.FailOpen, Lease: hybrid.LeaseTuning{RefillInterval: time.Hour, Lifetime: 5 * time.Hour, LowWatermark: -1}, MaxWait: time.Second})
}

func benchRequest() *http.Request {
	r, _ := http.NewRequest(http.MethodGet, "http://api.example/v1/items", nil)
	r.Header.Set("X-API-Key", "client-1")
	return r
}

func BenchmarkBareRateAllow(b *testing.B) {
	lim := rate.NewLimiter(rate.Limit(1e12), 1<<40)
	b.ReportAllocs()
	for b.Loop() {
		if !lim.Allow() {
			b.Fatal("denied")
		}
	}
}

func BenchmarkAllow(b *testing.B) {
	l := benchLimiter(b, "api")
	ctx := context.Background()
	for range 3 {
		l.Allow(ctx, "api", "client-1")
	}
	runtime.GC()
	b.ReportAllocs()
	for b.Loop() {
		if d, _ := l.Allow(ctx, "api", "client-1"); !d.Allowed {
			b.Fatal("denied")
		}
	}
}

func BenchmarkHandler(b *testing.B) {
	w, r := &nopWriter{h: http.Header{}}, benchRequest()
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		nop.ServeHTTP(w, r)
	}
}

// headerSets are the header choices the middleware's benchmark and allocation test run.
var headerSets = []struct {
	name    string
	headers httplimit.Headers
}{
	{"standard", httplimit.HeadersStandard},
	{"standard+x", httplimit.HeadersStandard | httplimit.HeadersX},
	{"x-epoch", httplimit.HeadersX | httplimit.HeadersXResetEpoch},
	{"none", httplimit.HeadersNone},
}

func BenchmarkMiddleware(b *testing.B) {
	for _, bc := range headerSets {
		b.Run(bc.name, func(b *testing.B) {
			l := benchLimiter(b, "api")
			mw, err := httplimit.New(httplimit.Config{Limiter: l, Limit: "api", Key: httplimit.Header("X-API-Key"), Headers: bc.headers})
			if err != nil {
				b.Fatal(err)
			}
			h := mw.Wrap(nop)
			w, r := &nopWriter{h: http.Header{}}, benchRequest()
			for range 3 {
				h.ServeHTTP(w, r)
			}
			runtime.GC()
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
		})
	}
}

// TestMiddlewareAllocations: a request served from the lease costs the middleware one
// allocation, whatever headers it writes (the request's copy with its context, which
// holds its Decision and its headers' values), for a limit named "api" and one of 23
// characters, with 13-digit quotas and remainders; FromContext finds the Decision in the
// request the handler gets, and the caller's request is left as it was.
func TestMiddlewareAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	for _, name := range []string{"api", "requests-per-client-key"} {
		for _, bc := range headerSets {
			t.Run(name+"/"+bc.name, func(t *testing.T) { testMiddlewareAllocations(t, name, bc.headers) })
		}
	}
}

func testMiddlewareAllocations(t *testing.T, name string, headers httplimit.Headers) {
	l := benchLimiter(t, name)
	mw, err := httplimit.New(httplimit.Config{Limiter: l, Limit: name, Key: httplimit.Header("X-API-Key"), Headers: headers})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, ok := httplimit.FromContext(r.Context())
		found = ok && d.Allowed && d.Limit == name
	}))
	w, r := &nopWriter{h: http.Header{}}, benchRequest()
	for range 3 {
		h.ServeHTTP(w, r)
	}
	allocs := testing.AllocsPerRun(100, func() {
		clear(w.h)
		h.ServeHTTP(w, r)
	})
	if !found {
		t.Fatal("the handler found no Decision in its context")
	}
	if headers != httplimit.HeadersNone && len(w.h) == 0 {
		t.Fatal("no header written")
	}
	if allocs > 1 {
		t.Errorf("%v allocations per request, want at most 1", allocs)
	}
	if _, ok := httplimit.FromContext(r.Context()); ok {
		t.Error("the caller's request holds a Decision: the middleware changed it")
	}
}
