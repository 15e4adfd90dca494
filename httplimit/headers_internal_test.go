package httplimit

import (
	"net/http"
	"testing"
	"time"
	"unsafe"

	"github.com/fleetlimit/fleetlimit/hybrid"
)

// decisionOf is a decision of a limit of rate r per second and burst b, as hybrid fills
// in its description.
func decisionOf(name string, r float64, b int) hybrid.Decision {
	return hybrid.Decision{Limit: name, Quota: b, Window: time.Duration(float64(b) / r * float64(time.Second))}
}

func TestPolicyOf(t *testing.T) {
	for _, tc := range []struct {
		rate          float64
		burst         int
		quota, window int64
	}{
		{100, 200, 200, 2},
		{1000, 10, 1000, 1},
		{3, 10, 12, 4},
		{0.5, 1, 1, 2},
		{1.0 / 60, 8, 8, 480},
		{1e6, 1e6, 1e6, 1},
		{7, 7, 7, 1},
	} {
		p := policyOf(decisionOf("api", tc.rate, tc.burst))
		if p.Quota != tc.quota || p.Window != tc.window || p.Name != "api" {
			t.Errorf("rate %v burst %d: policy %+v, want q=%d w=%d", tc.rate, tc.burst, p, tc.quota, tc.window)
		}
		// The stated policy never claims more than the limit's rate, nor less than
		// its burst.
		if float64(p.Quota) > tc.rate*float64(p.Window)+1e-6 || p.Quota < int64(tc.burst) {
			t.Errorf("rate %v burst %d: q=%d w=%d states another rate", tc.rate, tc.burst, p.Quota, p.Window)
		}
	}
}

func TestRetryAfterAndReset(t *testing.T) {
	for _, tc := range []struct {
		name       string
		d          hybrid.Decision
		retry      int64
		retryOK    bool
		reset      int64
		resetOK    bool
		wantHeader bool
	}{
		{"allowed", hybrid.Decision{Allowed: true, Reset: 1500 * time.Millisecond}, 0, false, 2, true, false},
		{"allowed, full", hybrid.Decision{Allowed: true}, 0, false, 0, true, false},
		{"denied 10ms", hybrid.Decision{RetryAfter: 10 * time.Millisecond}, 1, true, 1, true, true},
		{"denied 1s", hybrid.Decision{RetryAfter: time.Second}, 1, true, 1, true, true},
		{"denied 1.001s", hybrid.Decision{RetryAfter: 1001 * time.Millisecond}, 2, true, 2, true, true},
		{"denied 0", hybrid.Decision{}, 1, true, 1, true, true},
		{"never", hybrid.Decision{RetryAfter: hybrid.InfDuration}, 0, false, 0, false, false},
		{"allowed, reset unknown", hybrid.Decision{Allowed: true, Reset: hybrid.InfDuration}, 0, false, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := retryAfter(tc.d)
			if r != tc.retry || ok != tc.retryOK {
				t.Errorf("RetryAfter = %d, %v; want %d, %v", r, ok, tc.retry, tc.retryOK)
			}
			r, ok = resetAfter(tc.d)
			if r != tc.reset || ok != tc.resetOK {
				t.Errorf("Reset = %d, %v; want %d, %v", r, ok, tc.reset, tc.resetOK)
			}
			h := http.Header{}
			WriteHeaders(h, tc.d, HeadersStandard, time.Now())
			if got := h.Get("Retry-After") != ""; got != tc.wantHeader {
				t.Errorf("Retry-After %q, want one: %v", h.Get("Retry-After"), tc.wantHeader)
			}
		})
	}
}

// TestContextSizes: a request's copy and its context, one allocation, fill an allocator
// size class, the header values' bytes taking what the rest leaves (headerValues,
// standardValues). An object with pointers of more than 512 bytes carries the
// allocator's 8-byte header in its class (Go 1.22 on). A Go release that changes
// http.Request's size fails it: fit the buffers again.
func TestContextSizes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, cls uintptr
	}{
		{"decisionCtx", unsafe.Sizeof(withContext[decisionCtx]{}), 416},
		{"standardCtx", unsafe.Sizeof(withContext[standardCtx]{}), 576},
		{"headersCtx", unsafe.Sizeof(withContext[headersCtx]{}), 640},
	} {
		size := tc.size
		if size > 512 {
			size += 8
		}
		if size > tc.cls || size+16 <= tc.cls {
			t.Errorf("a request with its %s takes %d bytes, want %d less under 16", tc.name, size, tc.cls)
		}
	}
}

// TestPolicyCache: the RateLimit-Policy value a Middleware writes is always the one its
// policies state, whether its text is kept or formatted; the first request with other
// policies than the kept ones, and every missKeep-th after it, keeps its own.
func TestPolicyCache(t *testing.T) {
	api, paid := decisionOf("api", 100, 200), decisionOf("api", 1000, 50)
	changed := decisionOf("api", 100, 300) // the same limit after a change
	search := decisionOf("search", 5, 10)
	var c policyCache
	write := func(pols ...hybrid.Decision) string {
		var ps [maxAlso + 1]policy
		for i, d := range pols {
			ps[i] = policyOf(d)
		}
		var hv standardValues
		h := http.Header{}
		d := pols[0]
		d.Allowed = true
		writeHeaders(h, d, ps[:len(pols)], &c, HeadersStandard, time.Time{}, hv.vals[:], hv.buf[:0])
		want := string(appendPolicies(nil, ps[:len(pols)]))
		if got := h.Get("RateLimit-Policy"); got != want {
			t.Fatalf("RateLimit-Policy %q, want %q", got, want)
		}
		return want
	}
	for _, tc := range []struct {
		name   string
		pols   []hybrid.Decision
		misses uint32 // after the request
		kept   []hybrid.Decision
	}{
		{"first: kept", []hybrid.Decision{api}, 1, []hybrid.Decision{api}},
		{"same: from the kept text", []hybrid.Decision{api}, 1, []hybrid.Decision{api}},
		{"another tier: formatted", []hybrid.Decision{paid}, 2, []hybrid.Decision{api}},
		{"the limit changed: formatted", []hybrid.Decision{changed}, 3, []hybrid.Decision{api}},
		{"two limits: formatted", []hybrid.Decision{api, search}, 4, []hybrid.Decision{api}},
		{"back to the kept one", []hybrid.Decision{api}, 4, []hybrid.Decision{api}},
	} {
		write(tc.pols...)
		if got := c.misses.Load(); got != tc.misses {
			t.Errorf("%s: %d misses, want %d", tc.name, got, tc.misses)
		}
		if got, want := c.last.Load().text, string(appendPolicies(nil, []policy{policyOf(tc.kept[0])})); got != want {
			t.Errorf("%s: kept %q, want %q", tc.name, got, want)
		}
	}
	// The 65th request with other policies keeps its own: the limit changed for good.
	for c.misses.Load()%missKeep != 0 {
		write(changed)
	}
	want := write(changed)
	if got := c.last.Load().text; got != want {
		t.Fatalf("after %d misses kept %q, want %q", c.misses.Load(), got, want)
	}
	if got := c.text([]policy{policyOf(changed)}); got != want {
		t.Fatalf("text = %q, want the kept %q", got, want)
	}
	// Kept text of two limits is not the value of a request that states the first alone.
	for c.misses.Load()%missKeep != 0 {
		write(changed, search)
	}
	write(changed, search)
	write(changed)
}

// TestAcceptsProblem: problem details only for a client whose Accept names them, and not
// with q=0 (RFC 9110, 12.4.2: not acceptable).
func TestAcceptsProblem(t *testing.T) {
	for _, tc := range []struct {
		accept []string
		want   bool
	}{
		{nil, false},
		{[]string{"text/plain"}, false},
		{[]string{"application/problem+json"}, true},
		{[]string{"application/json, Application/Problem+JSON;q=0.9"}, true},
		{[]string{"text/html", "application/problem+json"}, true},
		{[]string{"application/problem+json;q=0, text/plain"}, false},
		{[]string{"application/problem+json ; Q = 0.000"}, false},
		{[]string{"application/problem+json;charset=utf-8;q=0.001"}, true},
	} {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		for _, v := range tc.accept {
			r.Header.Add("Accept", v)
		}
		if got := acceptsProblem(r); got != tc.want {
			t.Errorf("Accept %q: %v, want %v", tc.accept, got, tc.want)
		}
	}
}
