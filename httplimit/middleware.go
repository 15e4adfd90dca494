package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/quota"
)

// Errors of New and of the key functions.
var (
	// ErrInvalidConfig is wrapped by every error New returns.
	ErrInvalidConfig = errors.New("httplimit: invalid configuration")
	// ErrNoKey is wrapped by the error of a KeyFunc that found no key in the request
	// (a missing header, an unparsable address).
	ErrNoKey = errors.New("httplimit: no key in request")
)

// KeyFunc returns the key a request is limited by: an API key, a client IP, a user id.
// An error (wrapping ErrNoKey, say) sends the request to Config.OnError, not to the
// limiter.
type KeyFunc func(r *http.Request) (string, error)

// Config configures a Middleware. Limiter, Limit and Key are required.
type Config struct {
	// Limiter decides; Limit names the limit of its Config the requests count against.
	Limiter *hybrid.Limiter
	Limit   string
	// Key returns the request's key: Header, ClientIP, or a function of your own (a
	// user id from the request's context). An empty key goes to OnError as ErrNoKey,
	// never to a bucket all such requests would share. A key the client writes (an API
	// key's header, before your authentication has checked it) is one the client can
	// change on every request: key by an identity your server has checked, or add a
	// limit by ClientIP with Also.
	Key KeyFunc
	// Tier, if set, returns the tier of the request's key under Limit (hybrid.Limit's
	// Tiers, hybrid.Limiter.AllowTier): a paid plan read from the request's token, say.
	// "" is the limit's own rate and burst; a tier the limit does not have goes to
	// OnError (hybrid.ErrUnknownTier). The headers describe the tier's quota. nil:
	// every request is of the tier "".
	Tier func(r *http.Request) string
	// Also are more limits the request counts against, all or nothing with Limit
	// (hybrid.Limiter.AllowMulti): a per-tenant or a global limit beside the per-key
	// one. Each has its own key; the cost is the request's. A request denied by any is
	// denied and spends nothing on the others. RateLimit-Policy lists every limit the
	// request counted against on every response (Limit, then Also's, in order: a stable
	// list); RateLimit and the X- headers describe the limit that decided: the one that
	// denied, or, when admitted, the one with the fewest tokens left. At most 7.
	Also []Also
	// Cost returns the request's cost in tokens (at least 0). nil: every request costs 1.
	Cost func(r *http.Request) int
	// Headers selects the rate-limit headers written on every response, admitted or
	// not. 0: HeadersStandard.
	Headers Headers
	// Deny answers a denied request; FromContext gives it the Decision. The headers
	// and Retry-After are written before it runs. nil: DefaultDeny.
	Deny http.Handler
	// OnError answers a request whose key could not be found (err wraps ErrNoKey or is
	// the KeyFunc's), whose Cost was negative, or that the Limiter refused
	// (hybrid.ErrClosed, or the request's context ended while waiting for Redis).
	// nil: DefaultOnError.
	OnError func(w http.ResponseWriter, r *http.Request, err error)
	// Now is the clock X-RateLimit-Reset reads with HeadersXResetEpoch. nil: time.Now.
	Now func() time.Time
	// Skip, if set, lets the requests it returns true for through untouched: no key is
	// looked for, no limit is asked, no header is written. Health checks, /metrics, a
	// list of internal callers. nil: every request is limited.
	Skip func(r *http.Request) bool
}

// Also is one more limit of Config.Also: a limit of the Limiter and the key the request
// is counted under for it.
type Also struct {
	Limit string
	Key   KeyFunc
}

// maxAlso bounds Config.Also, so that a request's items fit an array on the stack.
const maxAlso = 7

// Middleware limits the requests of an http.Handler. Build it with New; use Wrap, whose
// signature is the func(http.Handler) http.Handler that chi's Use, gorilla/mux's Use
// and hand-written chains take. A Middleware is safe for concurrent use.
type Middleware struct {
	lim     *hybrid.Limiter
	limit   string
	key     KeyFunc
	tier    func(r *http.Request) string
	also    []Also
	cost    func(r *http.Request) int
	headers Headers
	deny    http.Handler
	onError func(w http.ResponseWriter, r *http.Request, err error)
	now     func() time.Time
	skip    func(r *http.Request) bool
	policy  policyCache // the RateLimit-Policy value written last
}

// New returns a Middleware for cfg, or an error wrapping ErrInvalidConfig. The limit
// must be one of the Limiter's: a typo fails here, not on the first request.
func New(cfg Config) (*Middleware, error) {
	switch {
	case cfg.Limiter == nil:
		return nil, fmt.Errorf("%w: no Limiter", ErrInvalidConfig)
	case cfg.Key == nil:
		return nil, fmt.Errorf("%w: no Key function", ErrInvalidConfig)
	case cfg.Headers&HeadersNone != 0 && cfg.Headers != HeadersNone:
		return nil, fmt.Errorf("%w: HeadersNone combined with other headers", ErrInvalidConfig)
	case cfg.Headers&HeadersXResetEpoch != 0 && cfg.Headers&HeadersX == 0:
		return nil, fmt.Errorf("%w: HeadersXResetEpoch without HeadersX", ErrInvalidConfig)
	}
	if !hasLimit(cfg.Limiter, cfg.Limit) {
		return nil, fmt.Errorf("%w: the Limiter has no limit %q", ErrInvalidConfig, cfg.Limit)
	}
	if len(cfg.Also) > maxAlso {
		return nil, fmt.Errorf("%w: %d limits in Also, at most %d", ErrInvalidConfig, len(cfg.Also), maxAlso)
	}
	for _, a := range cfg.Also {
		switch {
		case !hasLimit(cfg.Limiter, a.Limit):
			return nil, fmt.Errorf("%w: the Limiter has no limit %q (in Also)", ErrInvalidConfig, a.Limit)
		case a.Key == nil:
			return nil, fmt.Errorf("%w: no Key function for limit %q (in Also)", ErrInvalidConfig, a.Limit)
		}
	}
	m := &Middleware{
		lim: cfg.Limiter, limit: cfg.Limit, key: cfg.Key, tier: cfg.Tier, cost: cfg.Cost,
		also:    append([]Also(nil), cfg.Also...),
		headers: cfg.Headers, deny: cfg.Deny, onError: cfg.OnError, now: cfg.Now, skip: cfg.Skip,
	}
	if m.headers == 0 {
		m.headers = HeadersStandard
	}
	if m.deny == nil {
		m.deny = http.HandlerFunc(DefaultDeny)
	}
	if m.onError == nil {
		m.onError = DefaultOnError
	}
	if m.now == nil {
		m.now = time.Now
	}
	return m, nil
}

// hasLimit reports whether l has a limit named name.
func hasLimit(l *hybrid.Limiter, name string) bool {
	_, _, err := quota.Of(l, name, "")
	return err == nil
}

// Wrap returns next limited: each request is decided by the Limiter before next sees
// it. An admitted request reaches next with the rate-limit headers set and its Decision
// in its context (FromContext); a denied one goes to Config.Deny instead.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r, ok := m.Check(w, r); ok {
			next.ServeHTTP(w, r)
		}
	})
}

// Check is Wrap's work for a framework of its own (gin, echo: see the ginlimit and
// echolimit modules): it decides r, and either returns the request to go on with (its
// Decision in its context, the headers written) and true, or answers it itself
// (Config.Deny, Config.OnError) and returns false. A request Skip lets through comes
// back as it is, with true.
func (m *Middleware) Check(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	if m.skip != nil && m.skip(r) {
		return r, true
	}
	key, err := keyOf(m.key, r)
	if err != nil {
		m.onError(w, r, err)
		return r, false
	}
	n := 1
	if m.cost != nil {
		if n = m.cost(r); n < 0 {
			m.onError(w, r, fmt.Errorf("%w: cost %d", hybrid.ErrInvalidCost, n))
			return r, false
		}
	}
	tier := ""
	if m.tier != nil {
		tier = m.tier(r)
	}
	d, err := m.decide(r, tier, key, n)
	if err != nil {
		m.onError(w, r, err)
		return r, false
	}
	var now time.Time
	if m.headers&HeadersXResetEpoch != 0 {
		now = m.now()
	}
	var pols [maxAlso + 1]policy
	if _, retry := retryAfter(d); m.headers&HeadersNone != 0 && !retry {
		// Nothing to write: the Decision alone goes in the context.
		rc := new(withContext[decisionCtx])
		rc.ctx = decisionCtx{Context: r.Context(), d: d}
		r = rc.request(r, &rc.ctx)
	} else if m.headers&HeadersX == 0 {
		// The context holds the headers' values: the smaller one without HeadersX.
		rc := new(withContext[standardCtx])
		rc.ctx.decisionCtx = decisionCtx{Context: r.Context(), d: d}
		writeHeaders(w.Header(), d, m.policies(pols[:0], d, tier), &m.policy, m.headers, now, rc.ctx.hdr.vals[:], rc.ctx.hdr.buf[:0])
		r = rc.request(r, &rc.ctx)
	} else {
		rc := new(withContext[headersCtx])
		rc.ctx.decisionCtx = decisionCtx{Context: r.Context(), d: d}
		writeHeaders(w.Header(), d, m.policies(pols[:0], d, tier), &m.policy, m.headers, now, rc.ctx.hdr.vals[:], rc.ctx.hdr.buf[:0])
		r = rc.request(r, &rc.ctx)
	}
	if d.Allowed {
		return r, true
	}
	m.deny.ServeHTTP(w, r)
	return r, false
}

// policies appends to dst the policy of every limit the request counted against, in
// a stable order: Limit (of the request's tier), then Also's, in the order of Config,
// each named once. The limit that decided (d) is stated from d; the others as they
// are now (hybrid.Limiter.Quota). Without Also it is d's alone.
func (m *Middleware) policies(dst []policy, d hybrid.Decision, tier string) []policy {
	if len(m.also) == 0 {
		return append(dst, policyOf(d))
	}
	add := func(limit, tier string) {
		for _, p := range dst {
			if p.Name == limit {
				return
			}
		}
		if limit == d.Limit {
			dst = append(dst, policyOf(d))
		} else if q, w, err := quota.Of(m.lim, limit, tier); err == nil {
			dst = append(dst, policyOf(hybrid.Decision{Limit: limit, Quota: q, Window: w}))
		}
	}
	add(m.limit, tier)
	for _, a := range m.also {
		add(a.Limit, "")
	}
	return dst
}

// decide decides the request r of cost n and tier, whose key under m.limit is key:
// with AllowN, or, with Also limits, all or nothing with AllowMulti.
func (m *Middleware) decide(r *http.Request, tier, key string, n int) (hybrid.Decision, error) {
	if len(m.also) == 0 {
		return m.lim.AllowTier(r.Context(), m.limit, tier, key, n)
	}
	var buf [maxAlso + 1]hybrid.Item
	items := append(buf[:0], hybrid.Item{Limit: m.limit, Tier: tier, Key: key, Cost: n})
	for _, a := range m.also {
		k, err := keyOf(a.Key, r)
		if err != nil {
			return hybrid.Decision{}, err
		}
		items = append(items, hybrid.Item{Limit: a.Limit, Key: k, Cost: n})
	}
	md, err := m.lim.AllowMulti(r.Context(), items)
	d := md.Decision
	if !md.Allowed && md.RetryAfter > d.RetryAfter {
		d.RetryAfter = md.RetryAfter // the request cannot pass before every item can
	}
	return d, err
}

// keyOf is k's key for r; an empty key is ErrNoKey, never a bucket that every request
// without one would share.
func keyOf(k KeyFunc, r *http.Request) (string, error) {
	key, err := k(r)
	if err == nil && key == "" {
		err = fmt.Errorf("%w: the key function returned an empty key", ErrNoKey)
	}
	return key, err
}

type decisionKey struct{}

// withContext is a request's copy and its context C in one allocation, where
// Request.WithContext would allocate the copy apart: one allocation a request, not two.
// A handler that keeps the context keeps the copy with it (its 304 bytes; what the copy
// refers to, the original request refers to as well).
type withContext[C any] struct {
	r   http.Request
	ctx C
}

// request makes rc's request r with the context ctx (rc's own) and returns it.
func (rc *withContext[C]) request(r *http.Request, ctx context.Context) *http.Request {
	rc.r = *r.WithContext(ctx) // inlined: the copy it makes stays on the stack
	return &rc.r
}

// decisionCtx carries a request's Decision: one allocation, where context.WithValue
// would make two (the context and the boxed Decision).
type decisionCtx struct {
	context.Context
	d hybrid.Decision
}

// headersCtx is decisionCtx with the values of the headers written for the request, so
// that they cost no allocation of their own (their bytes and their []string).
type headersCtx struct {
	decisionCtx
	hdr headerValues
}

// standardCtx is headersCtx for a set without HeadersX (standardValues).
type standardCtx struct {
	decisionCtx
	hdr standardValues
}

// Value returns a *hybrid.Decision for decisionKey, else the parent's value.
func (c *decisionCtx) Value(key any) any {
	if key == (decisionKey{}) {
		return &c.d
	}
	return c.Context.Value(key)
}

// FromContext returns the Decision the Middleware made for the request whose context
// ctx is (or derives from), for logging, custom responses and handlers further down the
// chain.
func FromContext(ctx context.Context) (hybrid.Decision, bool) {
	if d, ok := ctx.Value(decisionKey{}).(*hybrid.Decision); ok {
		return *d, true
	}
	return hybrid.Decision{}, false
}

// Problem types of RFC 9457 problem details that DefaultDeny answers with, from
// draft-ietf-httpapi-ratelimit-headers.
const (
	// problemQuotaExceeded: the request is over its limit (429).
	problemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	// problemTemporaryReducedCapacity: the limiter could not reach Redis and the
	// limit's failure policy denied the request (503): the client did nothing wrong.
	problemTemporaryReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

// DefaultDeny answers a denied request, after the headers and Retry-After are written:
//   - over its limit: 429 Too Many Requests;
//   - denied by the limit's failure policy while Redis did not answer (FailClosed, or
//     FailLocal past this server's share: Decision.Source is SourceFallback): 503
//     Service Unavailable, with Retry-After, so that an outage is not read as the
//     client's fault;
//   - a request that can never pass (its cost is above the limit's burst, RetryAfter
//     hybrid.InfDuration): 400 Bad Request: retrying cannot help, and a client that
//     treats 429 as "wait and retry" would wait forever.
//
// The body is a line of text, or RFC 9457 problem details (application/problem+json, of
// the IANA problem type quota-exceeded or temporary-reduced-capacity) when the request's
// Accept header names application/problem+json.
func DefaultDeny(w http.ResponseWriter, r *http.Request) {
	d, _ := FromContext(r.Context())
	ra, later := retryAfter(d)
	status, typ, title := http.StatusTooManyRequests, problemQuotaExceeded, "Quota Exceeded"
	detail := fmt.Sprintf("rate limit %q exceeded; retry after %d s", d.Limit, ra)
	switch {
	case !later:
		status, typ, title = http.StatusBadRequest, "about:blank", "Bad Request"
		detail = fmt.Sprintf("request cost exceeds what limit %q can ever admit; it can never pass", d.Limit)
	case d.Source == hybrid.SourceFallback:
		status, typ, title = http.StatusServiceUnavailable, problemTemporaryReducedCapacity, "Temporary Reduced Capacity"
		detail = fmt.Sprintf("rate limit %q cannot be checked now (%s); retry after %d s", d.Limit, d.Reason, ra)
	}
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	if !acceptsProblem(r) {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		fmt.Fprintln(w, detail)
		return
	}
	h.Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{typ, title, status, detail})
	_, _ = w.Write(append(body, '\n'))
}

// acceptsProblem reports whether r's Accept header names application/problem+json, and
// not with q=0, which says the client does not accept it (RFC 9110, 12.4.2).
func acceptsProblem(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			mt, params, _ := strings.Cut(part, ";")
			if strings.EqualFold(strings.TrimSpace(mt), "application/problem+json") && !refused(params) {
				return true
			}
		}
	}
	return false
}

// refused reports whether the parameters of a media range in Accept carry q=0.
func refused(params string) bool {
	for p := range strings.SplitSeq(params, ";") {
		k, v, _ := strings.Cut(p, "=")
		if strings.EqualFold(strings.TrimSpace(k), "q") {
			q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err == nil && q == 0
		}
	}
	return false
}

// DefaultOnError answers a request the Middleware could not decide: 400 Bad Request when
// the key function failed or the request's tier is not one of the limit's, 500 for a
// negative cost (the Cost function's bug) or a limit the Limiter no longer has (removed
// by Reconfigure: the server's configuration), 503 Service Unavailable when the Limiter
// is closed or the request's context ended. The body names what is missing for an error
// wrapping ErrNoKey (this package's key functions'); the text of a key function's other
// errors, which may be a lookup's internals, stays out of the response.
func DefaultOnError(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusServiceUnavailable
	msg := "rate limiter unavailable"
	switch {
	case errors.Is(err, hybrid.ErrInvalidCost):
		status, msg = http.StatusInternalServerError, "invalid request cost"
	case errors.Is(err, hybrid.ErrUnknownLimit):
		status, msg = http.StatusInternalServerError, "unknown rate limit"
	case errors.Is(err, hybrid.ErrUnknownTier):
		status, msg = http.StatusBadRequest, "unknown tier"
	case errors.Is(err, hybrid.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
	case errors.Is(err, ErrNoKey):
		status, msg = http.StatusBadRequest, err.Error()
	default: // the key function's own
		status, msg = http.StatusBadRequest, ErrNoKey.Error()
	}
	http.Error(w, msg, status)
}
