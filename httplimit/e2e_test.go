package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/metricstest"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// newLimiter builds a Limiter of one server over c, closed when the test ends.
func newLimiter(t testing.TB, tg redistest.Target, limits ...hybrid.Limit) *hybrid.Limiter {
	t.Helper()
	store, err := global.New(tg.Client, global.Prefix(fmt.Sprintf("httplimit%d:", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	brk, err := breaker.New(breaker.Settings{Timeout: 2 * time.Second}) // room for -race
	if err != nil {
		t.Fatal(err)
	}
	l, err := hybrid.New(store, hybrid.Config{FleetSize: 1, Breaker: brk, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// response is what a client saw of one answer, its headers parsed.
type response struct {
	status     int
	retryAfter int64 // -1: absent
	policy     sfItem
	rl         *sfItem
}

// check parses and checks the rate-limit headers of resp: present, well formed, within
// sane bounds. It returns what it parsed.
func check(t *testing.T, resp *http.Response, q, w int64) (response, error) {
	out := response{status: resp.StatusCode, retryAfter: -1}
	if v := resp.Header.Get("Retry-After"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > 3600 {
			return out, fmt.Errorf("Retry-After %q", v)
		}
		out.retryAfter = n
	}
	pol, err := parseSFList(resp.Header.Get("RateLimit-Policy"))
	if err != nil || len(pol) != 1 {
		return out, fmt.Errorf("RateLimit-Policy %q: %v", resp.Header.Get("RateLimit-Policy"), err)
	}
	out.policy = pol[0]
	if pol[0].Name != "api" || pol[0].Params["q"] != q || pol[0].Params["w"] != w {
		return out, fmt.Errorf("RateLimit-Policy %+v, want api q=%d w=%d", pol[0], q, w)
	}
	if v := resp.Header.Get("RateLimit"); v != "" {
		rl, err := parseSFList(v)
		if err != nil || len(rl) != 1 || rl[0].Name != "api" {
			return out, fmt.Errorf("RateLimit %q: %v", v, err)
		}
		r, tt := rl[0].Params["r"], rl[0].Params["t"]
		if r < 0 || r > q || tt < 0 || tt > 3600 {
			return out, fmt.Errorf("RateLimit %q out of bounds (q=%d)", v, q)
		}
		if resp.StatusCode == http.StatusTooManyRequests && (r != 0 && tt == 0) {
			return out, fmt.Errorf("429 with RateLimit %q says a token is there now", v)
		}
		out.rl = &rl[0]
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if out.retryAfter >= 0 || out.rl == nil {
			return out, fmt.Errorf("200 with Retry-After %d, RateLimit %v", out.retryAfter, out.rl)
		}
	case http.StatusTooManyRequests:
		if out.retryAfter < 0 {
			return out, fmt.Errorf("429 without Retry-After")
		}
		if out.rl != nil && out.rl.Params["t"] != out.retryAfter {
			return out, fmt.Errorf("429: RateLimit t=%d, Retry-After %d", out.rl.Params["t"], out.retryAfter)
		}
	}
	for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if v := resp.Header.Get(h); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || n > 3600 && h != "X-RateLimit-Limit" || n > q && h != "X-RateLimit-Reset" {
				return out, fmt.Errorf("%s %q", h, v)
			}
		}
	}
	return out, nil
}

// TestMiddlewareEndToEnd runs a real net/http server with the middleware over Redis,
// driven by http.Clients that honour Retry-After: each client has its own API key, and
// after waiting the Retry-After of a 429 its next request must pass. Admissions per key
// stay within burst + rate·T, every answer's headers parse and stay sane, and a request
// costing more than the burst gets 400 without Retry-After.
func TestMiddlewareEndToEnd(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		const rate, burst = 20, 10
		const q, w = 20, 1 // the policy a 20/s burst 10 bucket states
		lim := newLimiter(t, tg, hybrid.Limit{Name: "api", Rate: rate, Burst: burst, Policy: breaker.FailClosed, MaxWait: time.Second})
		mw, err := httplimit.New(httplimit.Config{
			Limiter: lim,
			Limit:   "api",
			Key:     httplimit.Header("X-API-Key"),
			Cost: func(r *http.Request) int {
				if c := r.Header.Get("X-Cost"); c != "" {
					n, _ := strconv.Atoi(c)
					return n
				}
				return 1
			},
			Headers: httplimit.HeadersStandard | httplimit.HeadersX,
		})
		if err != nil {
			t.Fatal(err)
		}
		var seen sync.Map // key -> the Decision the handler found in its context
		srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, ok := httplimit.FromContext(r.Context())
			if !ok || !d.Allowed || d.Limit != "api" {
				http.Error(w, "no decision in context", http.StatusInternalServerError)
				return
			}
			seen.Store(r.Header.Get("X-API-Key"), d)
			io.WriteString(w, "ok")
		})))
		defer srv.Close()

		run := 2500 * time.Millisecond
		if testing.Short() {
			run = 1500 * time.Millisecond
		}
		const clients = 4
		type result struct {
			admitted, denied, retriesFailed int
			errs                            []error
		}
		results := make([]result, clients)
		start := time.Now()
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				res := &results[i]
				client := &http.Client{Timeout: 5 * time.Second}
				retrying := false
				for time.Since(start) < run {
					req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
					req.Header.Set("X-API-Key", fmt.Sprintf("client-%d", i))
					resp, err := client.Do(req)
					if err != nil {
						res.errs = append(res.errs, err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					got, err := check(t, resp, q, w)
					if err != nil {
						res.errs = append(res.errs, err)
						continue
					}
					switch got.status {
					case http.StatusOK:
						res.admitted++
						retrying = false
					case http.StatusTooManyRequests:
						res.denied++
						if retrying {
							res.retriesFailed++
						}
						// Honour Retry-After: the next request is a retry that must pass.
						time.Sleep(time.Duration(got.retryAfter) * time.Second)
						retrying = true
					default:
						res.errs = append(res.errs, fmt.Errorf("status %d", got.status))
					}
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		bound := burst + int(rate*elapsed.Seconds())
		for i, res := range results {
			if len(res.errs) > 0 {
				t.Errorf("client %d: %d bad answers, first: %v", i, len(res.errs), res.errs[0])
			}
			if res.admitted > bound {
				t.Errorf("client %d: admitted %d in %v, bound %d", i, res.admitted, elapsed, bound)
			}
			if res.denied == 0 || res.admitted < burst {
				t.Errorf("client %d: admitted %d, denied %d: the test did not reach the limit", i, res.admitted, res.denied)
			}
			if res.retriesFailed > 0 {
				t.Errorf("client %d: %d retries after honouring Retry-After were denied again", i, res.retriesFailed)
			}
			if _, ok := seen.Load(fmt.Sprintf("client-%d", i)); !ok {
				t.Errorf("client %d: the handler never saw a decision", i)
			}
			t.Logf("client %d: admitted %d, denied %d in %v (bound %d)", i, res.admitted, res.denied, elapsed.Round(time.Millisecond), bound)
		}

		// A cost above the burst can never pass: 400, no Retry-After.
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-API-Key", "big")
		req.Header.Set("X-Cost", strconv.Itoa(burst+1))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Retry-After") != "" {
			t.Errorf("cost above burst: status %d, Retry-After %q; want 400 and none", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		// No key: 400 from the default error handler, and the limiter is not asked.
		resp, err = http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("RateLimit-Policy") != "" {
			t.Errorf("no key: status %d, RateLimit-Policy %q", resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
		}
	})
}

// TestEmptyKey: a key function that returns an empty key, Config.Key's or an Also
// limit's, sends the request to OnError with ErrNoKey (400 by default), not to a bucket
// every such request would share.
func TestEmptyKey(t *testing.T) {
	_, c := redistest.Mini(t)
	lim := newLimiter(t, redistest.Target{Client: c}, hybrid.Limit{Name: "api", Rate: 100, Burst: 100, Policy: breaker.FailClosed},
		hybrid.Limit{Name: "user", Rate: 100, Burst: 100, Policy: breaker.FailClosed})
	empty := func(*http.Request) (string, error) { return "", nil }
	for _, cfg := range []httplimit.Config{
		{Limiter: lim, Limit: "api", Key: empty},
		{Limiter: lim, Limit: "api", Key: httplimit.Header("X-API-Key"), Also: []httplimit.Also{{Limit: "user", Key: empty}}},
	} {
		var got error
		cfg.OnError = func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			httplimit.DefaultOnError(w, r, err)
		}
		mw, err := httplimit.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		w, r := httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-API-Key", "k")
		mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler ran") })).ServeHTTP(w, r)
		if w.Code != http.StatusBadRequest || !errors.Is(got, httplimit.ErrNoKey) {
			t.Errorf("Also %v: %d, %v; want 400 and ErrNoKey", cfg.Also != nil, w.Code, got)
		}
	}
}

// TestDefaultOnErrorKeepsInternalsOut: a key function's error that is not ErrNoKey (a
// lookup that failed) answers 400 without its text; ErrNoKey's says what is missing.
func TestDefaultOnErrorKeepsInternalsOut(t *testing.T) {
	for _, tc := range []struct {
		err        error
		want, hide string
	}{
		{errors.New("dial tcp 10.0.0.5:5432: connection refused"), "no key in request", "10.0.0.5"},
		{fmt.Errorf("%w: header X-Api-Key missing", httplimit.ErrNoKey), "header X-Api-Key missing", "\x00"},
	} {
		w := httptest.NewRecorder()
		httplimit.DefaultOnError(w, httptest.NewRequest(http.MethodGet, "/", nil), tc.err)
		if body := w.Body.String(); w.Code != http.StatusBadRequest || !strings.Contains(body, tc.want) || strings.Contains(body, tc.hide) {
			t.Errorf("%v: %d %q; want 400, %q and not %q", tc.err, w.Code, body, tc.want, tc.hide)
		}
	}
}

// TestNewRejectsBadConfig: New refuses a configuration it could not run, with
// ErrInvalidConfig, and takes up to seven Also limits.
func TestNewRejectsBadConfig(t *testing.T) {
	_, c := redistest.Mini(t)
	lim := newLimiter(t, redistest.Target{Client: c}, hybrid.Limit{Name: "api", Rate: 1, Burst: 1, Policy: breaker.FailOpen})
	key := httplimit.Header("X-API-Key")
	for _, tc := range []struct {
		name string
		cfg  httplimit.Config
	}{
		{"no limiter", httplimit.Config{Limit: "api", Key: key}},
		{"no key", httplimit.Config{Limiter: lim, Limit: "api"}},
		{"unknown limit", httplimit.Config{Limiter: lim, Limit: "apj", Key: key}},
		{"none and more", httplimit.Config{Limiter: lim, Limit: "api", Key: key, Headers: httplimit.HeadersNone | httplimit.HeadersX}},
		{"epoch without x", httplimit.Config{Limiter: lim, Limit: "api", Key: key, Headers: httplimit.HeadersXResetEpoch}},
		{"an Also limit without a key", httplimit.Config{Limiter: lim, Limit: "api", Key: key, Also: []httplimit.Also{{Limit: "api"}}}},
		{"eight Also limits", httplimit.Config{Limiter: lim, Limit: "api", Key: key, Also: alsoOf("api", key, 8)}},
	} {
		if _, err := httplimit.New(tc.cfg); !errors.Is(err, httplimit.ErrInvalidConfig) {
			t.Errorf("%s: New(%+v) = %v, want ErrInvalidConfig", tc.name, tc.cfg, err)
		}
	}
	if _, err := httplimit.New(httplimit.Config{Limiter: lim, Limit: "api", Key: key, Also: alsoOf("api", key, 7)}); err != nil {
		t.Errorf("seven Also limits, the most: %v", err)
	}
}

// alsoOf is n Also limits, each of limit and key.
func alsoOf(limit string, key httplimit.KeyFunc, n int) []httplimit.Also {
	also := make([]httplimit.Also, n)
	for i := range also {
		also[i] = httplimit.Also{Limit: limit, Key: key}
	}
	return also
}

// TestMiddlewareAlso: a per-key limit and a per-tenant limit, all or nothing. The
// tenant's limit denies the fourth request of its keys, the 429 names it, and the
// per-key buckets are not charged for the denied requests. Every response's
// RateLimit-Policy lists both limits, in the order of the configuration, whichever
// decided; RateLimit names the one that decided.
func TestMiddlewareAlso(t *testing.T) {
	lim, h := alsoHandler(t, hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 5, Policy: breaker.FailClosed, MaxWait: time.Second},
		hybrid.Limit{Name: "tenant", Rate: 1e-3, Burst: 3, Policy: breaker.FailClosed, MaxWait: time.Second})
	codes := ""
	var last *httptest.ResponseRecorder
	for i := range 6 {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-API-Key", fmt.Sprintf("k%d", i%2))
		req.Header.Set("X-Tenant", "acme")
		last = httptest.NewRecorder()
		h.ServeHTTP(last, req)
		codes += strconv.Itoa(last.Code) + " "
		pol, err := parseSFList(last.Header().Get("RateLimit-Policy"))
		if err != nil || len(pol) != 2 || pol[0].Name != "api" || pol[0].Params["q"] != 5 ||
			pol[1].Name != "tenant" || pol[1].Params["q"] != 3 {
			t.Fatalf("response %d: RateLimit-Policy %q (%v), want api q=5 then tenant q=3", i, last.Header().Get("RateLimit-Policy"), err)
		}
		rl, err := parseSFList(last.Header().Get("RateLimit"))
		// The tenant decides every answer: it denies, or it has the fewest tokens left
		// (2, 1, 0 against the keys' 4, 4, 3).
		if err != nil || len(rl) != 1 || rl[0].Name != "tenant" {
			t.Fatalf("response %d: RateLimit %q (%v), want one item naming tenant", i, last.Header().Get("RateLimit"), err)
		}
	}
	if codes != "200 200 200 429 429 429 " {
		t.Fatalf("statuses %s, want three admitted by the tenant's burst of 3", codes)
	}
	if last.Header().Get("Retry-After") == "" {
		t.Fatalf("429 headers %v: want a Retry-After", last.Header())
	}
	st := lim.Stats()
	if st.Limits[0].Name != "api" || metricstest.Allowed(st.Limits[0]) != 3 {
		t.Fatalf("per-key limit admitted %d, want 3: the denied requests must not spend it", metricstest.Allowed(st.Limits[0]))
	}
	if _, err := httplimit.New(httplimit.Config{Limiter: lim, Limit: "api", Key: httplimit.Header("X"),
		Also: []httplimit.Also{{Limit: "nope", Key: httplimit.Header("Y")}}}); err == nil {
		t.Fatal("New accepted an unknown limit in Also")
	}
}

// TestMiddlewareAlsoRetryAfter: a request denied by several limits says to retry when
// every one of them can admit it: the longest wait, not that of the limit that decided
// (the first to deny, here the per-key limit's 0.1 s against the tenant's 1,000 s).
func TestMiddlewareAlsoRetryAfter(t *testing.T) {
	_, h := alsoHandler(t, hybrid.Limit{Name: "api", Rate: 10, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second},
		hybrid.Limit{Name: "tenant", Rate: 1e-3, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second})
	var codes []int
	var last *httptest.ResponseRecorder
	for range 2 {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-API-Key", "k")
		req.Header.Set("X-Tenant", "acme")
		last = httptest.NewRecorder()
		h.ServeHTTP(last, req)
		codes = append(codes, last.Code)
	}
	ra, err := strconv.Atoi(last.Header().Get("Retry-After"))
	if !slices.Equal(codes, []int{200, 429}) || err != nil || ra < 999 {
		t.Fatalf("statuses %v, Retry-After %q; want 200 then 429, retry after the tenant's 1,000 s", codes, last.Header().Get("Retry-After"))
	}
}

// alsoHandler is a no-op handler behind a Middleware over miniredis that limits each
// request by its X-API-Key under api, and by its X-Tenant under tenant (Also).
func alsoHandler(t *testing.T, api, tenant hybrid.Limit) (*hybrid.Limiter, http.Handler) {
	t.Helper()
	return alsoHandlerWith(t, api, tenant, nil)
}

// alsoHandlerWith is alsoHandler with the Config changed by edit (nil: as it is) before
// the Middleware is built.
func alsoHandlerWith(t *testing.T, api, tenant hybrid.Limit, edit func(*httplimit.Config)) (*hybrid.Limiter, http.Handler) {
	t.Helper()
	_, c := redistest.Mini(t)
	lim := newLimiter(t, redistest.Target{Client: c}, api, tenant)
	cfg := httplimit.Config{
		Limiter: lim, Limit: api.Name, Key: httplimit.Header("X-API-Key"),
		Also: []httplimit.Also{{Limit: tenant.Name, Key: httplimit.Header("X-Tenant")}},
	}
	if edit != nil {
		edit(&cfg)
	}
	mw, err := httplimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lim, mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
}

// serveHeaders serves h one GET request with headers set, and returns its answer.
func serveHeaders(h http.Handler, headers map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestMiddlewareCost: a request's cost, from Config.Cost, is charged to Limit and to
// every Also limit alike; a cost of 0 passes even where no token is left, and a negative
// cost goes to OnError (500 by default) without being decided.
func TestMiddlewareCost(t *testing.T) {
	_, h := alsoHandlerWith(t, hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 10, Policy: breaker.FailClosed, MaxWait: time.Second},
		hybrid.Limit{Name: "tenant", Rate: 1e-3, Burst: 3, Policy: breaker.FailClosed, MaxWait: time.Second},
		func(cfg *httplimit.Config) {
			cfg.Cost = func(r *http.Request) int { n, _ := strconv.Atoi(r.Header.Get("X-Cost")); return n }
		})
	for i, tc := range []struct {
		cost   int
		status int
	}{
		{2, http.StatusOK},              // the tenant has 1 left
		{2, http.StatusTooManyRequests}, // more than the tenant's 1
		{1, http.StatusOK},              // the tenant's last
		{0, http.StatusOK},              // free, though the tenant has none left
		{-1, http.StatusInternalServerError},
	} {
		w := serveHeaders(h, map[string]string{"X-API-Key": "k", "X-Tenant": "acme", "X-Cost": strconv.Itoa(tc.cost)})
		if w.Code != tc.status {
			t.Fatalf("request %d of cost %d: %d, want %d", i, tc.cost, w.Code, tc.status)
		}
	}
}

// TestMiddlewareAlsoTier: the request's tier applies to Limit alone; RateLimit-Policy
// still states every Also limit, at its own rate, when the tier is one the Also limit
// does not have.
func TestMiddlewareAlsoTier(t *testing.T) {
	_, h := alsoHandlerWith(t,
		hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 2, Policy: breaker.FailClosed, MaxWait: time.Second,
			Tiers: []hybrid.Tier{{Name: "paid", Rate: 1e-3, Burst: 5}}},
		hybrid.Limit{Name: "tenant", Rate: 1e-3, Burst: 100, Policy: breaker.FailClosed, MaxWait: time.Second},
		func(cfg *httplimit.Config) { cfg.Tier = func(r *http.Request) string { return r.Header.Get("X-Plan") } })
	for _, plan := range []string{"", "paid"} {
		w := serveHeaders(h, map[string]string{"X-API-Key": "k" + plan, "X-Tenant": "acme", "X-Plan": plan})
		pol, err := parseSFList(w.Header().Get("RateLimit-Policy"))
		if w.Code != http.StatusOK || err != nil || len(pol) != 2 || pol[0].Name != "api" || pol[1].Name != "tenant" || pol[1].Params["q"] != 100 {
			t.Errorf("plan %q: %d, RateLimit-Policy %q (%v); want 200, api then tenant q=100", plan, w.Code, w.Header().Get("RateLimit-Policy"), err)
		}
	}
}

// TestMiddlewareAlsoPolicyOnce: a limit the request counts against more than once (Limit
// again in Also, under another key; an Also limit twice) is stated once in
// RateLimit-Policy, where it first comes.
func TestMiddlewareAlsoPolicyOnce(t *testing.T) {
	_, h := alsoHandlerWith(t, hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 5, Policy: breaker.FailClosed, MaxWait: time.Second},
		hybrid.Limit{Name: "tenant", Rate: 1e-3, Burst: 3, Policy: breaker.FailClosed, MaxWait: time.Second},
		func(cfg *httplimit.Config) {
			cfg.Also = append(cfg.Also, httplimit.Also{Limit: "api", Key: httplimit.Header("X-User")},
				httplimit.Also{Limit: "tenant", Key: httplimit.Header("X-User")})
		})
	w := serveHeaders(h, map[string]string{"X-API-Key": "k", "X-Tenant": "acme", "X-User": "u"})
	if got := w.Header().Get("RateLimit-Policy"); w.Code != http.StatusOK || got != `"api";q=5;w=5000, "tenant";q=3;w=3000` {
		t.Errorf("%d, RateLimit-Policy %q; want 200, api then tenant, each once", w.Code, got)
	}
}

// TestMiddlewareHeadersNone: with HeadersNone an admitted request gets no rate-limit
// header, and a denied one only its Retry-After.
func TestMiddlewareHeadersNone(t *testing.T) {
	_, c := redistest.Mini(t)
	lim := newLimiter(t, redistest.Target{Client: c}, hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 1, Policy: breaker.FailClosed, MaxWait: time.Second})
	mw, err := httplimit.New(httplimit.Config{Limiter: lim, Limit: "api", Key: httplimit.Header("X-API-Key"), Headers: httplimit.HeadersNone})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for i, tc := range []struct {
		status int
		retry  bool
	}{
		{http.StatusOK, false},
		{http.StatusTooManyRequests, true},
	} {
		w := serveHeaders(h, map[string]string{"X-API-Key": "k"})
		if w.Code != tc.status || (w.Header().Get("Retry-After") != "") != tc.retry || w.Header().Get("RateLimit-Policy") != "" || w.Header().Get("RateLimit") != "" {
			t.Errorf("request %d: %d, headers %v; want %d, Retry-After %v and no other", i, w.Code, w.Header(), tc.status, tc.retry)
		}
	}
}

// TestDefaultOnErrorStatus: DefaultOnError's status says whose the error is: the
// request's (400: no key, an unknown tier), the server's configuration (500: a negative
// cost, a removed limit), or the limiter's state (503: closed, the request's context
// ended), however the error is wrapped.
func TestDefaultOnErrorStatus(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
	}{
		{fmt.Errorf("%w: header X missing", httplimit.ErrNoKey), http.StatusBadRequest},
		{errors.New("lookup failed"), http.StatusBadRequest},
		{fmt.Errorf("x: %w", hybrid.ErrUnknownTier), http.StatusBadRequest},
		{fmt.Errorf("x: %w", hybrid.ErrInvalidCost), http.StatusInternalServerError},
		{fmt.Errorf("x: %w", hybrid.ErrUnknownLimit), http.StatusInternalServerError},
		{hybrid.ErrClosed, http.StatusServiceUnavailable},
		{fmt.Errorf("waiting: %w", context.Canceled), http.StatusServiceUnavailable},
		{fmt.Errorf("waiting: %w", context.DeadlineExceeded), http.StatusServiceUnavailable},
	} {
		w := httptest.NewRecorder()
		httplimit.DefaultOnError(w, httptest.NewRequest(http.MethodGet, "/", nil), tc.err)
		if w.Code != tc.status {
			t.Errorf("%v: %d, want %d", tc.err, w.Code, tc.status)
		}
	}
}

// TestMiddlewareTier: the request's tier, read from a header, picks the rate and burst
// its key is held to, and the headers state that tier's quota; an unknown tier goes to
// OnError, 400 by default.
func TestMiddlewareTier(t *testing.T) {
	_, c := redistest.Mini(t)
	lim := newLimiter(t, redistest.Target{Client: c},
		hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 2, Policy: breaker.FailClosed, MaxWait: time.Second,
			Tiers: []hybrid.Tier{{Name: "paid", Rate: 1e-3, Burst: 5}}})
	mw, err := httplimit.New(httplimit.Config{
		Limiter: lim, Limit: "api", Key: httplimit.Header("X-API-Key"),
		Tier: func(r *http.Request) string { return r.Header.Get("X-Plan") },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, tc := range []struct {
		key, plan string
		codes     string
		quota     int
	}{
		{"free", "", "200 200 429 429 429 429 ", 2},
		{"paying", "paid", "200 200 200 200 200 429 ", 5},
		{"odd", "gold", "400 400 400 400 400 400 ", 0},
	} {
		codes := ""
		var last *httptest.ResponseRecorder
		for range 6 {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header.Set("X-API-Key", tc.key)
			req.Header.Set("X-Plan", tc.plan)
			last = httptest.NewRecorder()
			h.ServeHTTP(last, req)
			codes += strconv.Itoa(last.Code) + " "
		}
		if codes != tc.codes {
			t.Fatalf("%s (%q): statuses %s, want %s", tc.key, tc.plan, codes, tc.codes)
		}
		if tc.quota == 0 {
			continue
		}
		pol, err := parseSFList(last.Header().Get("RateLimit-Policy"))
		if err != nil || len(pol) == 0 || pol[0].Params["q"] < int64(tc.quota) {
			t.Fatalf("%s: RateLimit-Policy %q, want q=%d", tc.key, last.Header().Get("RateLimit-Policy"), tc.quota)
		}
	}
}

// TestDenyStatus: DefaultDeny says why a request was denied. Over its limit: 429 of
// type quota-exceeded. Denied by the failure policy while Redis does not answer
// (FailClosed, or FailLocal past this server's share): 503 with Retry-After, of type
// temporary-reduced-capacity, so that clients and dashboards do not read an outage as
// the client's fault. A cost above the burst: 400. The body is problem details (RFC
// 9457) when the client accepts them, text otherwise.
func TestDenyStatus(t *testing.T) {
	m, c := redistest.Mini(t)
	lim := newLimiter(t, redistest.Target{Client: c},
		hybrid.Limit{Name: "api", Rate: 1e-3, Burst: 2, Policy: breaker.FailClosed, MaxWait: 50 * time.Millisecond},
		// FailLocal's share is a token a key: its second request passes the pre-check and
		// meets the policy.
		hybrid.Limit{Name: "shared", Rate: 1e-3, Burst: 2, Policy: breaker.FailLocalLimit(1e-3, 1), MaxWait: 50 * time.Millisecond})
	handlers := map[string]http.Handler{}
	for _, name := range []string{"api", "shared"} {
		mw, err := httplimit.New(httplimit.Config{Limiter: lim, Limit: name, Key: httplimit.Header("X-API-Key"),
			Cost: func(r *http.Request) int { n, _ := strconv.Atoi(r.Header.Get("X-Cost")); return n }})
		if err != nil {
			t.Fatal(err)
		}
		handlers[name] = mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	}
	ask := func(limit, key string, cost int, problem bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-API-Key", key)
		req.Header.Set("X-Cost", strconv.Itoa(cost))
		if problem {
			req.Header.Set("Accept", "application/json, application/problem+json;q=0.9")
		}
		w := httptest.NewRecorder()
		handlers[limit].ServeHTTP(w, req)
		return w
	}
	type problem struct {
		Type   string
		Title  string
		Status int
		Detail string
	}
	const (
		quotaExceeded   = "https://iana.org/assignments/http-problem-types#quota-exceeded"
		reducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	)
	for _, tc := range []struct {
		name    string
		limit   string
		key     string
		cost    int
		down    bool // Redis is gone from this case on
		first   bool // a first request of the same cost is admitted
		status  int
		typ     string
		retries bool
	}{
		{"over its limit", "api", "k", 2, false, true, http.StatusTooManyRequests, quotaExceeded, true},
		{"cost above the burst", "api", "k2", 3, false, false, http.StatusBadRequest, "about:blank", false},
		{"Redis away, FailClosed", "api", "k3", 1, true, false, http.StatusServiceUnavailable, reducedCapacity, true},
		{"Redis away, FailLocal past its share", "shared", "k4", 1, true, true, http.StatusServiceUnavailable, reducedCapacity, true},
	} {
		if tc.down {
			m.Close() // again for a later case: a no-op
		}
		if tc.first {
			if w := ask(tc.limit, tc.key, tc.cost, false); w.Code != http.StatusOK {
				t.Fatalf("%s: first request %d, want 200", tc.name, w.Code)
			}
		}
		for _, asProblem := range []bool{false, true} {
			w := ask(tc.limit, tc.key, tc.cost, asProblem)
			if w.Code != tc.status || (w.Header().Get("Retry-After") != "") != tc.retries {
				t.Errorf("%s: %d, Retry-After %q; want %d, Retry-After %v", tc.name, w.Code, w.Header().Get("Retry-After"), tc.status, tc.retries)
			}
			if !asProblem {
				if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
					t.Errorf("%s: Content-Type %q, want text", tc.name, ct)
				}
				continue
			}
			var p problem
			if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("%s: Content-Type %q, want application/problem+json", tc.name, ct)
			} else if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Type != tc.typ || p.Status != tc.status || p.Title == "" || p.Detail == "" {
				t.Errorf("%s: problem %+v (%v), want type %s, status %d", tc.name, p, err, tc.typ, tc.status)
			}
		}
	}
}

// TestPolicyFollowsReconfigure: once the limit changes, the next response states the
// new policy, though the Middleware reuses the text of the one before while it holds.
func TestPolicyFollowsReconfigure(t *testing.T) {
	_, c := redistest.Mini(t)
	lim := newLimiter(t, redistest.Target{Client: c},
		hybrid.Limit{Name: "api", Rate: 100, Burst: 200, Policy: breaker.FailClosed, MaxWait: time.Second})
	mw, err := httplimit.New(httplimit.Config{Limiter: lim, Limit: "api", Key: httplimit.Header("X-API-Key")})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	policy := func() string {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-API-Key", "k")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Header().Get("RateLimit-Policy")
	}
	for _, tc := range []struct {
		rate  float64
		burst int
		want  string
	}{
		{0, 0, `"api";q=200;w=2`},
		{10, 50, `"api";q=50;w=5`},
		{100, 200, `"api";q=200;w=2`},
	} {
		if tc.rate != 0 {
			ls := lim.Limits()
			ls[0].Rate, ls[0].Burst, ls[0].Version = tc.rate, tc.burst, ls[0].Version+1
			ls[0].PreRate, ls[0].PreBurst = 0, 0 // the defaults, from the new rate and burst
			if err := lim.Reconfigure(ls); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 3 {
			if got := policy(); got != tc.want {
				t.Fatalf("rate %v burst %d, request %d: RateLimit-Policy %q, want %q", tc.rate, tc.burst, i, got, tc.want)
			}
		}
	}
}

// TestRemovedLimit: a limit Reconfigure removed answers 500, the server's configuration
// and not the client's doing (400 would blame the request).
func TestRemovedLimit(t *testing.T) {
	_, c := redistest.Mini(t)
	api := hybrid.Limit{Name: "api", Rate: 100, Burst: 200, Policy: breaker.FailClosed, MaxWait: time.Second}
	other := hybrid.Limit{Name: "other", Rate: 100, Burst: 200, Policy: breaker.FailClosed, MaxWait: time.Second}
	lim := newLimiter(t, redistest.Target{Client: c}, api, other)
	mw, err := httplimit.New(httplimit.Config{Limiter: lim, Limit: "api", Key: httplimit.Header("X-API-Key")})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	if err := lim.Reconfigure([]hybrid.Limit{other}); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-API-Key", "k")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusInternalServerError {
		t.Errorf("a removed limit: %d %q, want 500", rec.Code, rec.Body.String())
	}
}
