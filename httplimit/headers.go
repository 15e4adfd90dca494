package httplimit

import (
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fleetlimit/fleetlimit/hybrid"
)

// Headers selects the rate-limit headers a Middleware writes. Combine with |.
type Headers uint8

const (
	// HeadersStandard writes RateLimit-Policy and RateLimit, the structured fields of
	// draft-ietf-httpapi-ratelimit-headers-11.
	HeadersStandard Headers = 1 << iota
	// HeadersX writes X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset,
	// which most clients still read.
	HeadersX
	// HeadersXResetEpoch, with HeadersX, writes X-RateLimit-Reset as a Unix time in
	// seconds instead of seconds from now.
	HeadersXResetEpoch
	// HeadersNone writes no rate-limit header; Retry-After is still written on a denial
	// that can pass later (a 429, or a 503 of the failure policy).
	HeadersNone Headers = 1 << 7
)

// policy is a limit as the RateLimit-Policy field states it: Quota units per Window
// seconds, both whole numbers.
type policy struct {
	Name   string
	Quota  int64
	Window int64
}

// policyOf returns the policy of d's limit. A token bucket of burst b refilled at r per
// second has no fixed window; the policy states its long-run rate over the shortest
// whole number of seconds in which the empty bucket refills: Window = ⌈b / r⌉ (at least
// 1) and Quota = ⌊r · Window⌋, which is at least b. Both are capped at 15 digits, the
// largest structured-field integer. For 100/s with burst 200 that is
// q=200, w=2; for 1,000/s with burst 10, q=1000, w=1; for 3/s with burst 10, q=12, w=4.
func policyOf(d hybrid.Decision) policy {
	p := policy{Name: d.Limit, Quota: min(int64(d.Quota), maxSFInteger), Window: 1}
	if d.Window <= 0 || d.Quota <= 0 {
		return p
	}
	ws := d.Window.Seconds()
	w := max(math.Ceil(ws), 1)
	rate := float64(d.Quota) / ws
	p.Window = min(int64(w), maxSFInteger)
	p.Quota = min(max(int64(math.Floor(rate*w+1e-9)), int64(d.Quota)), maxSFInteger)
	return p
}

// maxSFInteger is the largest structured-field integer (15 digits, RFC 9651).
const maxSFInteger = 999_999_999_999_999

// seconds returns d in whole seconds, rounded up: the value of Retry-After and of a
// field's t. A positive d below one second is 1, so that a client never retries
// before the token is there.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfter returns the Retry-After value of a denial, in whole seconds rounded up, and
// false when d says the request can never pass (RetryAfter is hybrid.InfDuration) or
// was allowed: no Retry-After is right then.
func retryAfter(d hybrid.Decision) (int64, bool) {
	if d.Allowed || d.RetryAfter >= hybrid.InfDuration || d.RetryAfter < 0 {
		return 0, false
	}
	return max(seconds(d.RetryAfter), 1), true
}

// Reset returns the seconds the RateLimit field's t and X-RateLimit-Reset carry: for a
// denial, until the request may pass (its RetryAfter); for an admission, until the key's
// bucket is full again (Decision.Reset). Rounded up; ok is false when there is no finite
// answer.
func resetAfter(d hybrid.Decision) (int64, bool) {
	if !d.Allowed {
		return retryAfter(d)
	}
	if d.Reset >= hybrid.InfDuration || d.Reset < 0 {
		return 0, false
	}
	return seconds(d.Reset), true
}

// epochAfter is X-RateLimit-Reset as a Unix time: the first whole second at or after the
// instant resetAfter counts to from now (its duration unrounded), so that a client that
// waits until it never comes early.
func epochAfter(now time.Time, d hybrid.Decision) int64 {
	wait := d.Reset
	if !d.Allowed {
		wait = d.RetryAfter
	}
	t := now.Add(max(wait, 0))
	if t.Nanosecond() > 0 {
		return t.Unix() + 1
	}
	return t.Unix()
}

// WriteHeaders writes the rate-limit headers of d that set selects into h, and
// Retry-After when d is a denial that can pass later; now is only read for
// HeadersXResetEpoch. A handler of its own (a custom 429 page, a gRPC gateway) calls it
// to answer as the Middleware does.
//
// What the fields say, for a token bucket whose level is known only approximately
// (docs/http.md):
//   - RateLimit-Policy: "name";q=<quota>;w=<window>: w = ⌈burst / rate⌉ seconds (at
//     least 1) and q = ⌊rate · w⌋, the limit's long-run rate over the shortest whole
//     window in which the empty bucket refills.
//   - RateLimit: "name";r=<remaining>;t=<seconds>: r is Decision.Remaining (tokens on
//     hand plus what Redis reported at the last grant: other servers spend from the same
//     bucket, so it is an estimate), capped at q; t is, for a denial, the seconds until the request may pass, for
//     an admission, until the key's bucket is full again (Decision.Reset), rounded up.
//   - When the failure policy decided (Redis did not answer), the bucket's level is not
//     known: RateLimit and X-RateLimit-Remaining/Reset are left out, the policy and
//     Retry-After are written.
func WriteHeaders(h http.Header, d hybrid.Decision, set Headers, now time.Time) {
	var pols [1]policy
	pols[0] = policyOf(d)
	hv := new(headerValues)
	writeHeaders(h, d, pols[:], nil, set, now, hv.vals[:], hv.buf[:0])
}

// headerValues holds the values writeHeaders writes, as the header map refers to them:
// their bytes and the []string each header's value is. The Middleware keeps it in the
// request's Decision context, so that the headers cost no allocation of their own; the
// bytes fill WriteHeaders' allocation to 208, and that context and the request's copy it
// comes with to 640 (less 8 to spare), allocator size classes, the second with the
// allocator's header (TestContextSizes).
type headerValues struct {
	vals [maxHeaders]string
	buf  [112]byte // past it (long names, many Also limits' policies), the bytes go to the heap
}

// standardValues is headerValues for a set without HeadersX, which writes at most
// maxStandard headers: three values fewer, and a Middleware's context and request of 576
// bytes with the allocator's header, a size class, instead of 640, less for the collector
// to sweep on every request.
type standardValues struct {
	vals [maxStandard]string
	buf  [104]byte
}

const (
	maxHeaders  = 6 // the most headers writeHeaders writes
	maxStandard = 3 // the most without HeadersX: Retry-After, RateLimit-Policy, RateLimit
)

// writeHeaders is WriteHeaders with RateLimit-Policy listing policies, in order (d's
// among them, from policyOf), its text taken from kept when that holds it (nil: none
// kept), its values held in vals and its bytes appended to buf, both new: the header map
// keeps referring to them, and to the bytes as strings. vals holds maxHeaders, or
// maxStandard when set has no HeadersX.
func writeHeaders(h http.Header, d hybrid.Decision, policies []policy, kept *policyCache, set Headers, now time.Time, vals []string, buf []byte) {
	var (
		b     = buf
		names [maxHeaders]string
		ends  [maxHeaders]int
		texts [maxHeaders]string // a value not in b (a kept policy's text)
		n     int
	)
	add := func(name string) {
		names[n], ends[n] = name, len(b)
		n++
	}
	if ra, ok := retryAfter(d); ok {
		b = strconv.AppendInt(b, ra, 10)
		add("Retry-After")
	}
	if set&HeadersNone == 0 && d.Limit != "" {
		p := policyIn(policies, d)
		known := d.Source != hybrid.SourceFallback
		remaining := min(max(int64(d.Remaining), 0), p.Quota)
		reset, resetOK := resetAfter(d)
		if set&HeadersStandard != 0 {
			if t := kept.text(policies); t != "" {
				texts[n] = t
			} else {
				from := len(b)
				b = appendPolicies(b, policies)
				kept.keep(policies, b[from:])
			}
			add("Ratelimit-Policy")
			if known && resetOK {
				b = appendName(b, p.Name)
				b = append(b, ";r="...)
				b = strconv.AppendInt(b, remaining, 10)
				b = append(b, ";t="...)
				b = strconv.AppendInt(b, reset, 10)
				add("Ratelimit")
			}
		}
		if set&HeadersX != 0 {
			b = strconv.AppendInt(b, p.Quota, 10)
			add("X-Ratelimit-Limit")
			if known && resetOK {
				b = strconv.AppendInt(b, remaining, 10)
				add("X-Ratelimit-Remaining")
				if set&HeadersXResetEpoch != 0 {
					reset = epochAfter(now, d)
				}
				b = strconv.AppendInt(b, reset, 10)
				add("X-Ratelimit-Reset")
			}
		}
	}
	if n == 0 {
		return
	}
	// The bytes are written once, above, and never again: a string may share them.
	all := unsafe.String(unsafe.SliceData(b), len(b))
	vals = vals[:n]
	from := 0
	for i := range n {
		vals[i] = all[from:ends[i]]
		if texts[i] != "" {
			vals[i] = texts[i]
		}
		from = ends[i]
		h[names[i]] = vals[i : i+1 : i+1]
	}
}

// appendPolicies appends the RateLimit-Policy value that states policies, in order.
func appendPolicies(b []byte, policies []policy) []byte {
	for i, pol := range policies {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendName(b, pol.Name)
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, pol.Quota, 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, pol.Window, 10)
	}
	return b
}

// policyCache keeps the RateLimit-Policy value a Middleware wrote last, for the
// requests after it to reuse rather than format again: a limit's policy changes only
// when the limit does (Limiter.Reconfigure) or with the request's tier, so most requests
// state the same policies as the one before. A request whose policies differ formats
// its own; every missKeep-th of those (the first one included) keeps its text in place
// of the one kept, at one allocation, so that requests alternating between tiers cost
// an allocation per missKeep requests, not one each. Its methods are safe for
// concurrent use, and a nil *policyCache keeps nothing.
type policyCache struct {
	last   atomic.Pointer[policyText]
	misses atomic.Uint32
}

// missKeep is how many requests with other policies than the kept ones it takes to
// keep theirs (policyCache).
const missKeep = 64

// policyText is a RateLimit-Policy value and the policies it states.
type policyText struct {
	pols [maxAlso + 1]policy
	n    int
	text string
}

// text returns the kept value if it states policies, else "".
func (c *policyCache) text(policies []policy) string {
	if c == nil {
		return ""
	}
	t := c.last.Load()
	if t == nil || t.n != len(policies) {
		return ""
	}
	for i := range policies {
		if t.pols[i] != policies[i] {
			return ""
		}
	}
	return t.text
}

// keep records that a request stated policies, in text, which text did not hold: every
// missKeep-th time, text is kept in place of the value kept.
func (c *policyCache) keep(policies []policy, text []byte) {
	if c == nil || c.misses.Add(1)%missKeep != 1 {
		return
	}
	t := &policyText{text: string(text)}
	t.n = copy(t.pols[:], policies)
	c.last.Store(t)
}

// policyIn returns d's policy from policies, which holds it (writeHeaders), so that it
// is not computed twice; policyOf(d) if it is not there.
func policyIn(policies []policy, d hybrid.Decision) policy {
	for _, p := range policies {
		if p.Name == d.Limit {
			return p
		}
	}
	return policyOf(d)
}

// appendName appends name as a structured-field string (RFC 9651): quoted, with '"' and
// '\' escaped. Limit names are printable ASCII, so nothing else needs escaping.
func appendName(b []byte, name string) []byte {
	b = append(b, '"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, c)
	}
	return append(b, '"')
}
