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

// TestContextSizes: a request's context fills an allocator size class, the header
// values' bytes taking what the rest leaves (headerValues, standardValues).
func TestContextSizes(t *testing.T) {
	if n := unsafe.Sizeof(standardCtx{}); n != 256 {
		t.Errorf("standardCtx is %d bytes, want 256", n)
	}
	if n := unsafe.Sizeof(headersCtx{}); n != 320 {
		t.Errorf("headersCtx is %d bytes, want 320", n)
	}
}
