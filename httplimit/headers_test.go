package httplimit_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/httplimit"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// limitDecision is a decision of a limit of rate r per second and burst b, as hybrid
// fills in its description.
func limitDecision(name string, r float64, b int) hybrid.Decision {
	return hybrid.Decision{Limit: name, Quota: b, Window: time.Duration(float64(b) / r * float64(time.Second))}
}

func TestWriteHeaders(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	base := limitDecision(`we"ird\name`, 100, 200)
	allowed := base
	allowed.Allowed, allowed.Remaining, allowed.Reset, allowed.Source = true, 150, 500*time.Millisecond, hybrid.SourceLease
	denied := base
	denied.RetryAfter, denied.Reset, denied.Source = 30*time.Millisecond, 2*time.Second, hybrid.SourceLease
	fallback := base
	fallback.RetryAfter, fallback.Source, fallback.Reset = 2500*time.Millisecond, hybrid.SourceFallback, base.Window
	over := allowed
	over.Remaining = 900 // tokens on hand plus a stale report can exceed the quota
	for _, tc := range []struct {
		name string
		d    hybrid.Decision
		set  httplimit.Headers
		want map[string]string // header: value; "" means absent
		r, t int64             // RateLimit's parameters, when present
	}{
		{"allowed", allowed, httplimit.HeadersStandard, map[string]string{"Retry-After": "", "X-Ratelimit-Limit": ""}, 150, 1},
		{"denied", denied, httplimit.HeadersStandard, map[string]string{"Retry-After": "1"}, 0, 1},
		{"fallback", fallback, httplimit.HeadersStandard | httplimit.HeadersX, map[string]string{"Retry-After": "3", "Ratelimit": "", "X-Ratelimit-Limit": "200", "X-Ratelimit-Remaining": ""}, -1, -1},
		{"x", allowed, httplimit.HeadersX, map[string]string{"Ratelimit-Policy": "", "X-Ratelimit-Limit": "200", "X-Ratelimit-Remaining": "150", "X-Ratelimit-Reset": "1"}, -1, -1},
		{"x epoch", denied, httplimit.HeadersX | httplimit.HeadersXResetEpoch, map[string]string{"X-Ratelimit-Reset": strconv.FormatInt(now.Unix()+1, 10), "X-Ratelimit-Remaining": "0"}, -1, -1},
		{"none", denied, httplimit.HeadersNone, map[string]string{"Retry-After": "1", "Ratelimit-Policy": "", "Ratelimit": ""}, -1, -1},
		{"remaining capped", over, httplimit.HeadersStandard, nil, 200, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			httplimit.WriteHeaders(h, tc.d, tc.set, now)
			for k, v := range tc.want {
				if got := h.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if tc.set&httplimit.HeadersStandard == 0 {
				return
			}
			pol, err := parseSFList(h.Get("RateLimit-Policy"))
			if err != nil || len(pol) != 1 || pol[0].Name != tc.d.Limit || pol[0].Params["q"] != 200 || pol[0].Params["w"] != 2 {
				t.Fatalf("RateLimit-Policy %q: %+v, %v", h.Get("RateLimit-Policy"), pol, err)
			}
			if tc.r < 0 {
				return
			}
			rl, err := parseSFList(h.Get("RateLimit"))
			if err != nil || len(rl) != 1 || rl[0].Name != tc.d.Limit || rl[0].Params["r"] != tc.r || rl[0].Params["t"] != tc.t {
				t.Fatalf("RateLimit %q: %+v, %v; want r=%d t=%d", h.Get("RateLimit"), rl, err, tc.r, tc.t)
			}
		})
	}
}

// TestEpochResetNeverEarly: X-RateLimit-Reset as a Unix time is the first whole second
// at or after the instant the request may pass (a denial) or the bucket is full (an
// admission), whatever fraction of a second now is: a client that waits until it is
// never early, and waits less than a second more than it must.
func TestEpochResetNeverEarly(t *testing.T) {
	for _, frac := range []time.Duration{0, time.Nanosecond, 100 * time.Millisecond, 500 * time.Millisecond, 900 * time.Millisecond, time.Second - 1} {
		now := time.Unix(1_800_000_000, 0).Add(frac)
		for _, wait := range []time.Duration{30 * time.Millisecond, 200 * time.Millisecond, 999 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second} {
			denied := limitDecision("api", 100, 200)
			denied.RetryAfter, denied.Reset, denied.Source = wait, 2*time.Second, hybrid.SourceLease
			allowed := limitDecision("api", 100, 200)
			allowed.Allowed, allowed.Remaining, allowed.Reset, allowed.Source = true, 150, wait, hybrid.SourceLease
			for _, d := range []hybrid.Decision{denied, allowed} {
				h := http.Header{}
				httplimit.WriteHeaders(h, d, httplimit.HeadersX|httplimit.HeadersXResetEpoch, now)
				epoch, err := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
				if err != nil {
					t.Fatalf("X-RateLimit-Reset %q: %v", h.Get("X-RateLimit-Reset"), err)
				}
				at, due := time.Unix(epoch, 0), now.Add(wait)
				if at.Before(due) || !at.Before(due.Add(time.Second)) {
					t.Errorf("now %v, allowed %v, wait %v: X-RateLimit-Reset %d (%v), want the first second at or after %v",
						now.Format(time.StampMilli), d.Allowed, wait, epoch, at.Format(time.StampMilli), due.Format(time.StampMilli))
				}
			}
		}
	}
}

// BenchmarkWriteHeaders is the cost of the standard fields on one response.
func BenchmarkWriteHeaders(b *testing.B) {
	d := limitDecision("api", 100, 200)
	d.Allowed, d.Remaining, d.Reset = true, 120, 800*time.Millisecond
	h := http.Header{}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		httplimit.WriteHeaders(h, d, httplimit.HeadersStandard, now)
	}
}
