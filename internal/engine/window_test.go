package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/internal/keystore"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// winFleet is servers of one windowed limit (rate 10/s, burst 10: windows of 1 s,
// reports every 100ms) sharing one miniredis through redisstore.Store, its clock the test's.
type winFleet struct {
	t     *testing.T
	m     *miniredis.Miniredis
	store *redisstore.Store
	es    []*Engine
	lms   []*Limit
	open  bool // the breaker is open: trips fail at once
	trips int  // trips made
	width int  // counters per row: 1<<10 unless a test sets more
}

func newWinFleet(t *testing.T, servers int, mod func(*LimitConfig)) *winFleet {
	t.Helper()
	m, c := redistest.Mini(t)
	m.SetTime(t0)
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	f := &winFleet{t: t, m: m, store: s}
	for i := range servers {
		e, lm := testEngine(t, func(c *Config) {
			c.Servers = servers
			c.Seed = uint64(i + 1)
			c.Limits[0].Rate, c.Limits[0].Burst = 10, 10
			c.Limits[0].Windowed = 100 * time.Millisecond
			c.Limits[0].WindowWidth = 1 << 10
			c.Limits[0].WindowShards = wire.WindowShards // as on a Cluster
			if mod != nil {
				mod(&c.Limits[0])
			}
			c.BreakerOpen = func() bool { return f.open }
		})
		f.es, f.lms = append(f.es, e), append(f.lms, lm)
	}
	return f
}

// serve ticks server i at now and makes its trips until none is due, as a driver does.
func (f *winFleet) serve(i int, now time.Time) {
	f.t.Helper()
	f.m.SetTime(now)
	e := f.es[i]
	e.Tick(now)
	for trip := e.Next(); trip != nil; trip = e.Next() {
		f.trips++
		if f.open {
			trip.Err = breaker.ErrOpen
		} else {
			for j := range trip.Windows {
				trip.WindowErrs[j] = f.store.Windows(context.Background(), &trip.Windows[j])
				if trip.WindowErrs[j] != nil {
					f.t.Logf("trip: %v", trip.WindowErrs[j])
				}
			}
			trip.Answered = true
		}
		e.Done(now, trip)
	}
}

// warm starts every server with a request at t0 (a server's schedule starts with its
// first request) and serves it through its warm-up reads, to t0+50ms.
func (f *winFleet) warm() {
	for i := range f.es {
		decide(f.es[i], t0, f.lms[i], "probe", 1)
	}
	for ms := 0; ms <= 50; ms += 5 {
		for i := range f.es {
			f.serve(i, t0.Add(time.Duration(ms)*time.Millisecond))
		}
	}
}

// count is key's count in its window at now, as Redis holds it.
func (f *winFleet) count(key string, now time.Time) int {
	f.t.Helper()
	lim := f.lms[0]
	w := wire.WindowMicros(lim.Rate(), lim.Burst())
	win := wire.WindowIndex(now.UnixMicro(), wire.WindowPhase(key, w), w)
	return f.add(key, win, 0, false)
}

// add adds n to key's count in window win in Redis (to its demand row if demand), as
// the fleet's other servers do, and returns the count answered: with n 0, it reads it.
func (f *winFleet) add(key string, win int64, n int, demand bool) int {
	f.t.Helper()
	wl := f.lms[0].windowed()
	x := redisstore.WindowTrip{Limit: wl.glim, Width: wl.width, Shards: wl.shards, Shard: wire.WindowShard(key, wl.shards),
		Ops: []redisstore.WindowOp{{ID: redisstore.KeyID(key), Win: win, N: n, Demand: demand}}}
	if err := f.store.Windows(context.Background(), &x); err != nil {
		f.t.Fatal(err)
	}
	return x.Ops[0].Count
}

// mark records the fleet's mark of key's window win, flags (wire.MarkLow, MarkSpent,
// MarkOver), at at, as another server's trip does: servers learn it with their next read.
func (f *winFleet) mark(key string, win int64, flags int, at time.Time) {
	f.t.Helper()
	wl := f.lms[0].windowed()
	x := redisstore.WindowTrip{Limit: wl.glim, Width: wl.width, Shards: wl.shards, Shard: wire.WindowMarksShard(key, wl.shards),
		At: at, Memory: windowMemory, Marks: []redisstore.WindowMark{{ID: redisstore.KeyID(key), Flags: flags, Win: win}}}
	f.m.SetTime(at)
	if err := f.store.Windows(context.Background(), &x); err != nil {
		f.t.Fatal(err)
	}
}

// roomy returns a key whose window at now has at least room to go, that window and its
// end.
func (f *winFleet) roomy(prefix string, now time.Time, room time.Duration) (string, int64, time.Time) {
	lim := f.lms[0]
	w := wire.WindowMicros(lim.Rate(), lim.Burst())
	for i := 0; ; i++ {
		key := prefix + strconv.Itoa(i)
		phase := wire.WindowPhase(key, w)
		win := wire.WindowIndex(now.UnixMicro(), phase, w)
		if end := time.UnixMicro(wire.WindowStart(win+1, phase, w)); end.Sub(now) >= room {
			return key, win, end
		}
	}
}

// fresh sends a request of key y at at, and, if it waits (a server not warm yet, or
// its marks stale), the trip it makes: that trip's read makes the server's marks
// fresh, so that it admits keys it knows nothing against without asking.
func (f *winFleet) fresh(at time.Time) {
	f.t.Helper()
	if _, w := decide(f.es[0], at, f.lms[0], "y", 1); w != nil {
		f.serve(0, at)
	}
}

// admitFree makes server 0's marks fresh at now (a request 10 ms before, and its trip
// with a read) and returns its decision at now of a request of key, which it admits
// without asking (ReasonAsync), or fails the test.
func (f *winFleet) admitFree(key string, now time.Time) Decision {
	f.t.Helper()
	e, lm := f.es[0], f.lms[0]
	f.fresh(now.Add(-10 * time.Millisecond))
	d, w := decide(e, now, lm, key, 1)
	if w != nil || d.Reason != ReasonAsync {
		f.t.Fatalf("%s: %+v, want it admitted without asking", key, d)
	}
	return d
}

// TestWindowedWarmsUp: a server asks for every request until its read of the marks, sent
// 25 ms after its start or later, is answered; then it admits a key it knows nothing
// against without asking, and counts it in Redis with its next report; a key it sees
// often (here a second request at once) waits for a grant sized by its rate.
func TestWindowedWarmsUp(t *testing.T) {
	f := newWinFleet(t, 2, nil)
	e, lm := f.es[0], f.lms[0]
	f.serve(0, t0)
	d, w := decide(e, t0, lm, "a", 1)
	if w == nil {
		t.Fatalf("a request before the server is warm: %+v, want it to wait for Redis", d)
	}
	f.serve(0, t0)
	if d := w.Decision(); !d.Allowed || d.Source != SourceGlobal || d.Reason != ReasonGranted {
		t.Fatalf("its answer: %+v, want granted", d)
	}
	// That trip's read went before windowWarm: answered, it does not make the server
	// warm, and a new key still waits for Redis.
	if d, w := decide(e, t0.Add(10*time.Millisecond), lm, "c", 1); w == nil {
		t.Fatalf("a new key after a read sent at the server's start: %+v, want it to wait for Redis", d)
	}
	f.warm()
	now := t0.Add(60 * time.Millisecond)
	if d, w := decide(e, now, lm, "b", 1); w != nil || !d.Allowed || d.Reason != ReasonAsync {
		t.Fatalf("a new key once warm: %+v (waits: %v), want admitted without asking", d, w != nil)
	}
	d, w = decide(e, now, lm, "b", 1)
	if w == nil {
		t.Fatalf("a second request at once, one unanswered: %+v, want it to wait for a grant", d)
	}
	f.serve(0, now)
	if d := w.Decision(); !d.Allowed || d.Reason != ReasonGranted {
		t.Fatalf("its answer: %+v, want granted", d)
	}
	if got := f.count("b", now); got < 2 {
		t.Errorf("b's count in Redis %d, want the one admitted without asking and the grant", got)
	}
}

// TestWindowedSpent: a count answered at the burst or over it marks the key's window
// spent: the server refuses the key until the window ends, carries its part of the
// overshoot into the next window, and tells the fleet, whose servers refuse it too
// without asking.
func TestWindowedSpent(t *testing.T) {
	f := newWinFleet(t, 2, nil)
	f.warm()
	// Two seconds in, a key seen once is seen seldom (at first every key looks fast: its
	// rate is counted over the server's short life).
	now := t0.Add(2 * time.Second)
	key, win, end := f.roomy("k", now, 800*time.Millisecond)
	f.fresh(now.Add(-10 * time.Millisecond)) // a trip, and with it a read: fresh marks
	f.add(key, win, 10, false)               // the fleet spent the window
	if d, w := decide(f.es[0], now, f.lms[0], key, 1); w != nil || !d.Allowed {
		t.Fatalf("%s, not known spent: %+v, want admitted without asking", key, d)
	}
	f.serve(0, now.Add(100*time.Millisecond)) // its report: count 11
	later := now.Add(150 * time.Millisecond)
	d, wt := decide(f.es[0], later, f.lms[0], key, 1)
	if wt != nil || d.Allowed || d.Reason != ReasonPaced || d.RetryAfter != end.Sub(later) {
		t.Fatalf("%s once its window is known spent: %+v, want refused until the window ends in %v", key, d, end.Sub(later))
	}
	f.serve(0, later.Add(100*time.Millisecond)) // the carry
	if got := f.add(key, win+1, 0, false); got != 1 {
		t.Errorf("the next window counts %d, want the carried overshoot, 1", got)
	}
	// The other server reads the mark with its next trip, and refuses the key unasked.
	at := later.Add(300 * time.Millisecond)
	if _, w := decide(f.es[1], at, f.lms[1], "x", 1); w != nil {
		f.serve(1, at)
	}
	if d, w := decide(f.es[1], at, f.lms[1], key, 1); w != nil || d.Allowed || d.RetryAfter != end.Sub(at) {
		t.Fatalf("server 1, %s after reading the mark: %+v (waits %v), want refused until %v", key, d, w != nil, end.Sub(at))
	}
	if d, w := decide(f.es[1], end.Add(time.Millisecond), f.lms[1], key, 1); w != nil || !d.Allowed {
		t.Fatalf("server 1, %s in its next window: %+v, want admitted", key, d)
	}
}

// TestWindowedJudgesOverWithoutOverflow: a key whose window is spent is over only when it
// spent it at four times its rate or more, whatever the burst and the window: a burst of
// 10^6 over an hour, or 10^5 over a day, takes burst × elapsed nanoseconds past int64.
func TestWindowedJudgesOverWithoutOverflow(t *testing.T) {
	for _, tc := range []struct {
		burst int
		w     time.Duration
		at    float64 // the part of the window gone when it is found spent
		over  bool
	}{
		{1000, time.Hour, 5.0 / 6, false},
		{1_000_000, time.Hour, 5.0 / 6, false},
		{100_000, 24 * time.Hour, 5.0 / 6, false},
		{1 << 30, 24 * time.Hour, 5.0 / 6, false},
		{1_000_000, time.Hour, 1.0 / 5, true},
		{1 << 30, 24 * time.Hour, 1.0 / 5, true},
	} {
		_, lm := testEngine(t, func(c *Config) {
			c.Limits[0].Burst = tc.burst
			c.Limits[0].Rate = float64(tc.burst) / tc.w.Seconds()
			c.Limits[0].Windowed = time.Second
		})
		wl := lm.windowed()
		wl.mu.Lock()
		wl.begin(t0.Add(-2 * tc.w))
		st := new(wkey)
		wl.key(st, "k", t0)
		now := wl.end(st.win-1, st.phase).Add(time.Duration(float64(tc.w) * tc.at))
		wl.key(st, "k", now)
		wl.judge(st, "k", st.win, tc.burst, false, now)
		over := instant(now.UnixNano()) < st.over
		wl.mu.Unlock()
		if !st.failed() || over != tc.over {
			t.Errorf("burst %d, window %v, spent %.2f of the way: spent %v, over %v; want spent, over %v",
				tc.burst, tc.w, tc.at, st.failed(), over, tc.over)
		}
	}
}

// TestWindowedOftenGrants: a key a server sees at least once a report interval is served
// from grants of its window sized by that rate; closing the server gives back what it
// holds.
func TestWindowedOftenGrants(t *testing.T) {
	for _, tc := range []struct {
		name        string
		rate        float64
		burst       int
		room, every time.Duration
	}{
		{"windows of 1s", 1000, 1000, 600 * time.Millisecond, 5 * time.Millisecond},
		// A key's rate is counted over at most 4 s, whatever the window: with windows of
		// an hour, 200/s is not taken for a key seen seldom, asked for one request at a time.
		{"windows of 1h", 1e6 / 3600, 1e6, time.Hour / 2, 5 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWinFleet(t, 2, func(c *LimitConfig) { c.Rate, c.Burst = tc.rate, tc.burst })
			f.warm()
			e, lm := f.es[0], f.lms[0]
			admitted, waited := 0, 0
			now := t0.Add(60 * time.Millisecond)
			key, _, _ := f.roomy("hot", now, tc.room)
			for range 100 { // 200/s for half a second; the driver makes what trips are due at once
				now = now.Add(tc.every)
				d, w := decide(e, now, lm, key, 1)
				f.serve(0, now)
				if w != nil {
					waited++
					d = w.Decision()
				}
				if d.Allowed {
					admitted++
				}
			}
			if admitted != 100 || waited > 2 {
				t.Fatalf("admitted %d of 100, %d waited for Redis; want every one, few waiting", admitted, waited)
			}
			before := f.count(key, now)
			if before <= 100 {
				t.Fatalf("count %d: the server held no grants", before)
			}
			e.Stop(now)
			e.Drain()
			f.serve(0, now)
			e.Finish()
			if after := f.count(key, now); after != 100 {
				t.Errorf("count after close %d (before %d), want the 100 admitted: unused grants given back", after, before)
			}
		})
	}
}

// TestWindowedSplitsLongReports: a report carries at most maxWindowOps counts; the rest
// go with the next trip, at once.
func TestWindowedSplitsLongReports(t *testing.T) {
	f := newWinFleet(t, 2, func(c *LimitConfig) { c.WindowWidth = 1 << 16 }) // few collisions
	f.width = 1 << 16
	f.warm()
	e, lm := f.es[0], f.lms[0]
	// Two seconds in, a key seen once is seen seldom: admitted without asking, no grant.
	now := t0.Add(2 * time.Second)
	f.fresh(now.Add(-10 * time.Millisecond)) // a trip, and with it a read: fresh marks
	const n = maxWindowOps + 100
	for i := range n {
		if d, w := decide(e, now, lm, "c"+strconv.Itoa(i), 1); w != nil || !d.Allowed {
			t.Fatalf("key %d: %+v", i, d)
		}
	}
	before := f.trips
	f.serve(0, now.Add(100*time.Millisecond))
	if got := f.trips - before; got < 2 {
		t.Errorf("%d trip for %d counts, want them split", got, n)
	}
	for _, i := range []int{0, maxWindowOps - 1, maxWindowOps, n - 1} {
		if c := f.count("c"+strconv.Itoa(i), now); c != 1 {
			t.Errorf("key %d counts %d, want 1", i, c)
		}
	}
}

// TestWindowedRedisDown: with the breaker open, a request that must ask goes to the
// limit's policy (FailClosed: denied), and what was admitted without asking is counted
// once Redis answers again.
func TestWindowedRedisDown(t *testing.T) {
	f, e, lm := warmPair(t)
	now := t0.Add(60 * time.Millisecond)
	if d, w := decide(e, now, lm, "a", 1); w != nil || !d.Allowed {
		t.Fatalf("%+v", d)
	}
	f.open = true
	f.serve(0, now.Add(100*time.Millisecond)) // the report fails
	_, w := decide(e, now, lm, "a", 1)        // seen often: asks, and waits
	if w == nil {
		t.Fatal("a second request at once did not wait")
	}
	f.serve(0, now.Add(100*time.Millisecond))
	if d := w.Decision(); d.Allowed || d.Source != SourceFallback || d.Reason != ReasonBreakerOpen {
		t.Fatalf("with the breaker open: %+v, want the policy's denial", d)
	}
	f.open = false
	f.serve(0, now.Add(300*time.Millisecond)) // the next report
	if got := f.count("a", now); got != 1 {
		t.Errorf("count once Redis answers %d, want the one admitted without asking", got)
	}
}

// TestWindowedUnsentMarksAge: a mark a failed trip could not send goes again with the
// next trip, but not once its window ended more than windowMemory ago: an outage of the
// master that holds a key's marks does not pile up a mark per window.
func TestWindowedUnsentMarksAge(t *testing.T) {
	f := newWinFleet(t, 2, nil)
	f.warm()
	wl := f.lms[0].windowed()
	now := t0.Add(60 * time.Millisecond)
	wl.mu.Lock()
	k := wmk{id: "a", win: wire.WindowIndex(wl.rnow(now), wire.WindowPhase("a", wl.wUs), wl.wUs)}
	wl.announce[k] = wire.MarkSpent
	wl.due.Store(true)
	wl.mu.Unlock()
	held := func() bool {
		wl.mu.Lock()
		defer wl.mu.Unlock()
		_, ok := wl.announce[k]
		return ok
	}
	f.open = true
	f.serve(0, now.Add(100*time.Millisecond))
	if !held() {
		t.Fatal("a mark a failed trip could not send is not sent again")
	}
	f.serve(0, wl.end(k.win, wire.WindowPhase("a", wl.wUs)).Add(windowMemory-time.Millisecond))
	if !held() {
		t.Fatal("a mark dropped within windowMemory of its window's end")
	}
	f.serve(0, wl.end(k.win, wire.WindowPhase("a", wl.wUs)).Add(windowMemory+time.Second))
	if held() {
		t.Fatal("a mark of a window that ended more than windowMemory ago is still put back")
	}
}

// TestWindowedFleetBound: eight servers, a key at four times its limit spread over them
// for 3 s: every window of its admissions within 2·burst + rate·W + S·c, and at least a
// burst a window admitted.
func TestWindowedFleetBound(t *testing.T) {
	const servers = 8
	f := newWinFleet(t, servers, func(c *LimitConfig) { c.Rate, c.Burst = 40, 40 }) // 1 s windows, c = 5
	f.warm()
	var at []time.Time
	now := t0.Add(60 * time.Millisecond)
	end := now.Add(3 * time.Second)
	for i := 0; now.Before(end); i++ { // 160/s, round robin
		now = now.Add(time.Second / 160)
		s := i % servers
		d, w := decide(f.es[s], now, f.lms[s], "abuser", 1)
		if w != nil {
			f.serve(s, now)
			d = w.Decision()
		}
		if d.Allowed {
			at = append(at, now)
		}
		if i%16 == 0 {
			for j := range servers {
				f.serve(j, now)
			}
		}
	}
	bound := func(w time.Duration) float64 { return 2*40 + 40*w.Seconds() + servers*5 }
	for _, w := range []time.Duration{100 * time.Millisecond, time.Second, 2 * time.Second} {
		worst := 0
		for i := range at {
			j := i
			for j < len(at) && at[j].Sub(at[i]) < w {
				j++
			}
			worst = max(worst, j-i)
		}
		if float64(worst) > bound(w) {
			t.Errorf("%v: %d admitted, above 2·burst + rate·W + S·c = %.0f", w, worst, bound(w))
		}
	}
	if len(at) < 3*40 {
		t.Errorf("admitted %d in 3 s, want at least a burst a window (120)", len(at))
	}
}

func TestWindowedConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*LimitConfig)
	}{
		{"too short", func(c *LimitConfig) { c.Windowed = time.Microsecond }},
		{"and Async", func(c *LimitConfig) { c.Async = time.Second }},
		{"with tiers", func(c *LimitConfig) { c.Tiers = []TierConfig{{Name: "gold", Rate: 1, Burst: 1}} }},
		{"burst too large", func(c *LimitConfig) { c.Burst, c.Rate = redisstore.MaxWindowBurst+1, 1 }},
		{"width not a power of two", func(c *LimitConfig) { c.WindowWidth = 1000 }},
		{"width too small", func(c *LimitConfig) { c.WindowWidth = 16 }},
		{"shards below 0", func(c *LimitConfig) { c.WindowShards = -1 }},
		{"too many shards", func(c *LimitConfig) { c.WindowShards = 2 * redisstore.MaxWindowShards }},
		{"window of 1ms", func(c *LimitConfig) { c.Rate, c.Burst, c.Windowed = 1000, 1, time.Millisecond }},
		{"window under MinWindow", func(c *LimitConfig) { c.Rate, c.Burst, c.Windowed = 1000, 99, 10*time.Millisecond }},
		{"window over MaxWindow", func(c *LimitConfig) { c.Rate, c.Burst = 1e-6, 1 }},
		{"report over half the window", func(c *LimitConfig) { c.Windowed = 501 * time.Millisecond }},
		{"report interval of 1,000 h", func(c *LimitConfig) { c.Rate, c.Burst, c.Windowed = 1.0/86400, 1, 1000*time.Hour }},
	} {
		c := LimitConfig{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailClosed, Windowed: 100 * time.Millisecond}
		tc.mod(&c)
		_, err := New(Config{Limits: []LimitConfig{c}, Servers: 1, NextSeq: func() uint64 { return 1 }})
		if err == nil {
			t.Errorf("%s: no error", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	for _, c := range []LimitConfig{
		{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailClosed, Windowed: 100 * time.Millisecond},
		{Name: "api", Rate: 1000, Burst: 100, Policy: breaker.FailClosed, Windowed: 50 * time.Millisecond},  // MinWindow
		{Name: "api", Rate: 1000.0 / 86400, Burst: 1000, Policy: breaker.FailClosed, Windowed: time.Second}, // a day
	} {
		if _, err := New(Config{Limits: []LimitConfig{c}, Servers: 1, NextSeq: func() uint64 { return 1 }}); err != nil {
			t.Errorf("a valid windowed limit: %v", err)
		}
	}
}

// TestWindowedSetLimit: a windowed limit's policy may change at run time; its window
// (Rate, Burst, Windowed, WindowWidth) may not, nor may a bucket become windowed.
func TestWindowedSetLimit(t *testing.T) {
	base := LimitConfig{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailClosed, Windowed: 100 * time.Millisecond}
	e, err := New(Config{Limits: []LimitConfig{base}, Servers: 1, NextSeq: func() uint64 { return 1 }})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*LimitConfig)
		ok   bool
	}{
		{"policy", func(c *LimitConfig) { c.Policy = breaker.FailOpen }, true},
		{"rate", func(c *LimitConfig) { c.Rate, c.Version = 20, 1 }, false},
		{"burst", func(c *LimitConfig) { c.Burst, c.Version = 20, 1 }, false},
		{"report interval", func(c *LimitConfig) { c.Windowed = time.Second }, false},
		{"width", func(c *LimitConfig) { c.WindowWidth = 1 << 12 }, false},
		{"shards", func(c *LimitConfig) { c.WindowShards = 64 }, false},
		{"to a bucket", func(c *LimitConfig) { c.Windowed = 0 }, false},
	} {
		c := base
		tc.mod(&c)
		if err := e.SetLimit(t0, c); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	b, err := New(Config{Limits: []LimitConfig{{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailClosed}}, Servers: 1, NextSeq: func() uint64 { return 1 }})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetLimit(t0, base); err == nil {
		t.Error("a bucket became windowed at run time")
	}
}

// TestWindowedAfterReview: what a trip's partial failure, a stop, a request that gave
// up, an undone decision and an outage across a window's end do to a windowed limit.
func TestWindowedAfterReview(t *testing.T) {
	t.Run("one limit's error does not resend another's counts", func(t *testing.T) {
		f := newWinFleet(t, 1, nil)
		e := f.es[0]
		if err := e.AddLimit(LimitConfig{Name: "other", Rate: 10, Burst: 10, Policy: breaker.FailClosed,
			Windowed: 100 * time.Millisecond, WindowWidth: 1 << 10}); err != nil {
			t.Fatal(err)
		}
		other := e.Limit("other")
		decide(e, t0, other, "probe", 1)
		f.warm()
		now := t0.Add(2 * time.Second)
		key, _, _ := f.roomy("a", now, 500*time.Millisecond)       // its window outlasts the test
		decide(e, now.Add(-10*time.Millisecond), f.lms[0], "y", 1) // fresh marks for both
		decide(e, now.Add(-10*time.Millisecond), other, "y", 1)
		f.serve(0, now.Add(-10*time.Millisecond))
		for _, lm := range []*Limit{f.lms[0], other} {
			if d, w := decide(e, now, lm, key, 1); w != nil || d.Reason != ReasonAsync {
				t.Fatalf("%s: %+v", lm.Name(), d)
			}
		}
		at := now.Add(150 * time.Millisecond) // both reports due: one trip
		f.m.SetTime(at)
		e.Tick(at)
		trip := e.Next()
		if trip == nil || len(trip.Windows) != 2 {
			t.Fatalf("want one trip of both limits, got %+v", trip)
		}
		for j := range trip.Windows {
			if trip.Windows[j].Limit.Name == "other" {
				trip.WindowErrs[j] = storeerr.ErrUnavailable
				continue
			}
			trip.WindowErrs[j] = f.store.Windows(context.Background(), &trip.Windows[j])
		}
		trip.Answered, trip.Err = true, storeerr.ErrUnavailable
		e.Done(at, trip)
		later := at.Add(200 * time.Millisecond)
		e.Tick(later)
		again := 0 // the counts of the limit whose round trip failed, sent again
		for next := e.Next(); next != nil; next = e.Next() {
			for j, x := range next.Windows {
				if x.Limit.Name == f.lms[0].Name() && len(x.Ops) > 0 {
					t.Errorf("the limit that answered sends %v again", x.Ops)
				}
				if x.Limit.Name == "other" {
					again += len(x.Ops)
				}
				next.WindowErrs[j] = f.store.Windows(context.Background(), &next.Windows[j])
			}
			next.Answered = true
			e.Done(later, next)
		}
		if got := f.count(key, now); got != 1 {
			t.Errorf("%s's count in the limit that answered: %d, want 1", key, got)
		}
		// its count goes again as it was, not as the carry of an array found lost: the
		// round trip that failed answered no count
		if again != 1 || other.LostBuckets() != 0 {
			t.Errorf("the limit whose round trip failed sends %d counts again and counts %d arrays lost, want its one count and none",
				again, other.LostBuckets())
		}
	})
	t.Run("one shard's error fails its keys alone", func(t *testing.T) {
		// A trip of a limit counted in shards is a round trip per shard, on its master:
		// a shard whose master fails puts back its counts, which go again, and goes stale
		// alone; another shard's counts land once and its keys are still admitted
		// without asking.
		f := newWinFleet(t, 1, nil)
		e := f.es[0]
		f.warm()
		now := t0.Add(2 * time.Second)
		a, _, _ := f.roomy("a", now, 600*time.Millisecond)
		var b string
		for i := 0; b == ""; i++ {
			// b's shard holds its marks, and neither a's counts nor a's marks
			k, _, _ := f.roomy("b"+strconv.Itoa(i), now, 600*time.Millisecond)
			if s := wire.WindowShard(k, wire.WindowShards); s == wire.WindowMarksShard(k, wire.WindowShards) &&
				s != wire.WindowShard(a, wire.WindowShards) && s != wire.WindowMarksShard(a, wire.WindowShards) {
				b = k
			}
		}
		bad := wire.WindowShard(b, wire.WindowShards)
		decide(e, now.Add(-10*time.Millisecond), f.lms[0], "y", 1)
		f.serve(0, now.Add(-10*time.Millisecond)) // fresh marks
		for _, k := range []string{a, b} {
			if d, w := decide(e, now, f.lms[0], k, 1); w != nil || d.Reason != ReasonAsync {
				t.Fatalf("%s: %+v", k, d)
			}
		}
		at := now.Add(300 * time.Millisecond) // the report, and a read of every shard
		f.m.SetTime(at)
		e.Tick(at)
		trip := e.Next()
		if sets := wire.WindowShards / wire.WindowMarksGroup(wire.WindowShards); trip == nil || len(trip.Windows) < sets {
			t.Fatalf("want a round trip per shard with marks to read (%d) or counts, got %+v", sets, trip)
		}
		for j := range trip.Windows {
			if trip.Windows[j].Shard == bad {
				trip.WindowErrs[j] = storeerr.ErrUnavailable
				continue
			}
			trip.WindowErrs[j] = f.store.Windows(context.Background(), &trip.Windows[j])
		}
		trip.Answered = true
		e.Done(at, trip)
		if f.count(a, now) != 1 || f.count(b, now) != 0 {
			t.Fatalf("counts %d and %d, want 1 for %s (its shard answered), 0 for %s", f.count(a, now), f.count(b, now), a, b)
		}
		wl := f.lms[0].windowed()
		if fa, fb := wl.fresh(at, a), wl.fresh(at.Add(300*time.Millisecond), b); !fa || fb {
			t.Errorf("fresh: %v for the shard that answered, %v for the one that failed, 300ms on", fa, fb)
		}
		later := at.Add(100 * time.Millisecond)
		f.serve(0, later)
		if f.count(a, now) != 1 || f.count(b, now) != 1 {
			t.Errorf("once the failed shard answers: counts %d and %d, want 1 and 1", f.count(a, now), f.count(b, now))
		}
	})
	t.Run("a request after Stop is closed", func(t *testing.T) {
		f := newWinFleet(t, 1, nil)
		f.warm()
		f.es[0].Stop(t0.Add(time.Second))
		if d, w := decide(f.es[0], t0.Add(time.Second), f.lms[0], "k", 1); w != nil || d.Reason != ReasonClosed {
			t.Errorf("after Stop: %+v (waits %v), want closed", d, w != nil)
		}
	})
	t.Run("a request that gave up gives its grant back", func(t *testing.T) {
		f := newWinFleet(t, 1, nil)
		e, lm := f.es[0], f.lms[0]
		d, w := decide(e, t0, lm, "k", 1) // not warm: asks
		if w == nil {
			t.Fatalf("%+v", d)
		}
		e.GiveUp(t0, w, ReasonTimeout)
		f.serve(0, t0)
		if d, w := decide(e, t0, lm, "k", 1); w != nil || !d.Allowed || d.Reason != ReasonLease {
			t.Errorf("the next request: %+v (waits %v), want served from the grant given back", d, w != nil)
		}
	})
	t.Run("an undone admission is taken back from the count", func(t *testing.T) {
		f := newWinFleet(t, 1, nil)
		f.warm()
		e, lm := f.es[0], f.lms[0]
		now := t0.Add(2 * time.Second)
		d := f.admitFree("k", now)
		e.Return(now, now, lm, "", "k", 1, d)
		f.serve(0, now.Add(100*time.Millisecond))
		if got := f.count("k", now); got != 0 {
			t.Errorf("count after the admission was undone: %d, want 0", got)
		}
	})
	t.Run("an admission undone in a later window gives nothing back", func(t *testing.T) {
		// A reservation made in window win is canceled in win+1, which the fleet spent:
		// taken from win+1's count, it would give the fleet room there that win's
		// admission never used.
		f := newWinFleet(t, 1, nil)
		f.warm()
		e, lm := f.es[0], f.lms[0]
		now := t0.Add(2 * time.Second)
		key, win, end := f.roomy("k", now, 800*time.Millisecond)
		d := f.admitFree(key, now)
		f.serve(0, now.Add(100*time.Millisecond))
		next := end.Add(50 * time.Millisecond) // in window win+1
		f.m.SetTime(next)
		f.add(key, win+1, 10, false) // the fleet spent win+1
		e.Return(next, now, lm, "", key, 1, d)
		f.serve(0, next.Add(100*time.Millisecond))
		if got := f.count(key, next.Add(100*time.Millisecond)); got != 10 {
			t.Errorf("window win+1, spent by the fleet (10), counts %d after win's admission was undone", got)
		}
		if got := f.count(key, now); got != 1 {
			t.Errorf("window win counts %d, want its admission, 1", got)
		}
	})
	t.Run("admissions of a window that ended in an outage are counted", func(t *testing.T) {
		// Redis back soon after the window's end, or just before the end of the window
		// after it: the window's array lives until a second after that, and the count
		// still goes.
		for _, back := range []time.Duration{300 * time.Millisecond, 950 * time.Millisecond} {
			f := newWinFleet(t, 1, nil)
			f.warm()
			e, lm := f.es[0], f.lms[0]
			start := t0.Add(2 * time.Second)
			key, _, end := f.roomy("k", start, 0)
			for end.Sub(start) > 300*time.Millisecond { // a key whose window ends soon
				start = start.Add(100 * time.Millisecond)
				key, _, end = f.roomy("k", start, 0)
			}
			at := end.Add(-50 * time.Millisecond)
			f.fresh(at.Add(-10 * time.Millisecond))
			if d, w := decide(e, at, lm, key, 1); w != nil || d.Reason != ReasonAsync {
				t.Fatalf("%+v", d)
			}
			f.open = true
			before := f.trips
			f.serve(0, end.Add(120*time.Millisecond)) // the report fails, once the window has ended
			if f.trips == before {
				t.Fatal("no report went while Redis was away")
			}
			f.open = false
			f.serve(0, end.Add(back))
			if got := f.count(key, at); got != 1 {
				t.Errorf("Redis back %v after the window's end: it counts %d, want the admission made in it", back, got)
			}
		}
	})
}

// TestWindowedEvictedWhileWaiting: a key pushed out of the key store (MaxKeys 1) while
// its request waits for a grant is not made again by the answer: the request is served
// from its grant, the rest of the grant goes back to the window, and an admission
// answered after its key went is forgotten (nothing left owing for it).
func TestWindowedEvictedWhileWaiting(t *testing.T) {
	f := newWinFleet(t, 2, func(c *LimitConfig) { c.MaxKeys = 1 })
	e, lm := f.es[0], f.lms[0]
	f.serve(0, t0)
	// before the server is warm, every request asks and waits
	_, wa := decide(e, t0, lm, "a", 1)
	if wa == nil {
		t.Fatal("a request before the server is warm did not wait")
	}
	if _, wb := decide(e, t0, lm, "b", 1); wb == nil { // evicts "a"
		t.Fatal("a second key before the server is warm did not wait")
	}
	f.serve(0, t0)
	if d := wa.Decision(); !d.Allowed || d.Reason != ReasonGranted {
		t.Fatalf("the evicted key's request: %+v, want served from its grant", d)
	}
	if got := f.count("a", t0); got != 1 {
		t.Errorf("Redis counts %d for the evicted key, want its one admission", got)
	}
	// admitted without asking, then evicted before the report is answered
	f.warm()
	now := t0.Add(60 * time.Millisecond)
	key, _, _ := f.roomy("c", now, 500*time.Millisecond)
	if d, w := decide(e, now, lm, key, 1); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("%+v, want admitted without asking", d)
	}
	decide(e, now, lm, "other", 1) // evicts key
	lm.windowed().mu.Lock()
	owing := lm.windowed().gone[key]
	lm.windowed().mu.Unlock()
	if owing != 1 {
		t.Fatalf("evicted with its admission unanswered: %d owing, want 1", owing)
	}
	f.serve(0, now.Add(100*time.Millisecond))
	lm.windowed().mu.Lock()
	left := len(lm.windowed().gone)
	lm.windowed().mu.Unlock()
	if left != 0 {
		t.Errorf("%d evicted keys still owing once their reports were answered", left)
	}
	if got := f.count(key, now); got != 1 {
		t.Errorf("Redis counts %d for %s, want its one admission", got, key)
	}
}

// TestWindowedQueueCoalesces: the queue of a report holds one count per key and window
// between two other ops of the key, whatever the requests between two reports; a grant,
// a count taken back or a count of another window is an op of its own, in order.
func TestWindowedQueueCoalesces(t *testing.T) {
	f := newWinFleet(t, 2, nil)
	wl := f.lms[0].windowed()
	wl.mu.Lock()
	defer wl.mu.Unlock()
	for range 1000 {
		wl.count("a", 7, 1)
	}
	wl.count("a", 8, 2)
	wl.queue(wop{id: "a", win: 8, n: 1, grant: true})
	wl.count("a", 8, 3)
	wl.count("b", 7, 1)
	wl.queue(wop{id: "b", win: 7, n: -1}) // Return
	wl.count("b", 7, 1)
	// what follows a grant or a count taken back stays after it
	want := []wop{{id: "a", win: 7, n: 1000}, {id: "a", win: 8, n: 2}, {id: "a", win: 8, n: 1, grant: true},
		{id: "a", win: 8, n: 3}, {id: "b", win: 7, n: 1}, {id: "b", win: 7, n: -1}, {id: "b", win: 7, n: 1}}
	if len(wl.ops) != len(want) {
		t.Fatalf("queue %+v, want %+v", wl.ops, want)
	}
	for i := range want {
		if wl.ops[i] != want[i] {
			t.Errorf("op %d: %+v, want %+v", i, wl.ops[i], want[i])
		}
	}
}

// TestWindowedGoneEitherOrder: the store reports an eviction after letting go of the
// key's lock, so the answer of an evicted key's count may come before the eviction is
// recorded, or find a new entry of the key, or a new entry may be made between the
// answer and the eviction's record: whatever the order, nothing stays owed once all
// have happened, and a new entry does not inherit a count already answered.
func TestWindowedGoneEitherOrder(t *testing.T) {
	f := newWinFleet(t, 2, nil)
	wl := f.lms[0].windowed()
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.answerOut(nil, "a", 2) // answered first
	wl.owe("a", 2)            // then the eviction of an entry with 2 unanswered
	wl.owe("b", 3)            // evicted first
	wl.answerOut(nil, "b", 3) // then answered
	var st wkey               // a new entry of "c", made before the old one's eviction was recorded
	wl.owe("c", 1)
	wl.answerOut(&st, "c", 1) // the old entry's count, answered on the new entry
	wl.answerOut(nil, "d", 2) // answered, the old entry's eviction not yet recorded
	var sd wkey
	wl.key(&sd, "d", t0) // a new entry of "d" made then
	wl.owe("d", 2)       // then the old entry's eviction is recorded
	if len(wl.gone) != 0 || st.out != 0 || sd.out != 0 {
		t.Errorf("gone %v, new entries' out %d and %d: want nothing owed", wl.gone, st.out, sd.out)
	}
}

// TestWindowedQueueFull: with maxQueued ops queued, a count already queued still grows,
// but a new key's admission without asking is refused (ReasonPaced, to ask again after
// the next report) rather than admitted uncounted or queued without bound.
func TestWindowedQueueFull(t *testing.T) {
	_, e, lm := warmPair(t)
	now := t0.Add(60 * time.Millisecond)
	if d, w := decide(e, now, lm, "a", 1); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("%+v, want admitted without asking", d)
	}
	wl := lm.windowed()
	wl.mu.Lock()
	win := wl.ops[len(wl.ops)-1].win
	for i := 0; len(wl.ops) < maxQueued; i++ {
		wl.count("x"+strconv.Itoa(i), win, 1)
	}
	merged, added := wl.count("x0", win, 1), wl.count("y", win, 1)
	n := len(wl.ops)
	wl.mu.Unlock()
	if !merged || added || n != maxQueued {
		t.Fatalf("full queue: merged %v, new key added %v, %d ops; want true, false, %d", merged, added, n, maxQueued)
	}
	if d, w := decide(e, now, lm, "b", 1); w != nil || d.Allowed || d.Reason != ReasonPaced || d.RetryAfter != wl.iv {
		t.Fatalf("a new key with the queue full: %+v (waits: %v), want refused for a report interval", d, w != nil)
	}
}

// TestWindowedGoneCarries: a count answered for a key no longer held carries its part of
// an overshoot into the next window, a carry's as well, as answer does for a key held.
func TestWindowedGoneCarries(t *testing.T) {
	f := newWinFleet(t, 2, nil) // burst 10
	wl := f.lms[0].windowed()
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.answerGone(wop{id: "a", win: 5, n: 3}, 12, nil)
	wl.answerGone(wop{id: "b", win: 5, n: 4, carry: true}, 11, nil)
	want := []wop{{id: "a", win: 6, n: 2, carry: true}, {id: "b", win: 6, n: 1, carry: true}}
	if len(wl.ops) != len(want) || wl.ops[0] != want[0] || wl.ops[1] != want[1] {
		t.Fatalf("queue %+v, want %+v", wl.ops, want)
	}
}

// TestWindowedGrantsWithoutTheLimitLock: a key served from its grants, with nothing to
// ask, is decided under its own lock alone: a decision completes while another goroutine
// holds the limit's lock (as a report being built, or another key's decision, does),
// and it changes what the locked path would.
func TestWindowedGrantsWithoutTheLimitLock(t *testing.T) {
	f := newWinFleet(t, 2, func(c *LimitConfig) { c.Rate, c.Burst = 1000, 1000 })
	f.warm()
	e, lm := f.es[0], f.lms[0]
	now := t0.Add(60 * time.Millisecond)
	key, _, _ := f.roomy("hot", now, 600*time.Millisecond)
	var grants int
	for range 40 { // 200/s: seen often, served from grants sized by its rate
		now = now.Add(5 * time.Millisecond)
		if _, w := decide(e, now, lm, key, 1); w != nil {
			<-w.Done()
		}
		f.serve(0, now)
		lm.keys.Peek(key, func(en *entry, _ int64) { grants = en.win.grants })
	}
	if grants < 2 {
		t.Fatalf("the key holds %d grants: nothing to test", grants)
	}
	wl := lm.windowed()
	wl.mu.Lock()
	done := make(chan Decision, 1)
	go func() {
		d, _ := decide(e, now.Add(time.Millisecond), lm, key, 1)
		done <- d
	}()
	select {
	case d := <-done:
		wl.mu.Unlock()
		if !d.Allowed || d.Reason != ReasonLease {
			t.Fatalf("decided %+v, want admitted from the key's grants", d)
		}
	case <-time.After(10 * time.Second):
		wl.mu.Unlock()
		t.Fatal("a key served from its grants waited for the limit's lock")
	}
	lm.keys.Peek(key, func(en *entry, _ int64) {
		if en.win.grants != grants-1 {
			t.Errorf("grants %d after the decision, want %d", en.win.grants, grants-1)
		}
	})
}

// TestWindowedDecidesLocallyWhateverTheFleetSize: keys a server sees seldom, each within
// its limit (8 or 9 requests in a window of burst 10), are admitted without waiting for
// Redis at 1 and at 2 servers (at least 99% of their requests), and every one is
// admitted: a count answered for a key's window bounds what a server admits of it
// unasked (its allowance: the room the window had left, at most c), instead of making
// the key low as soon as it is within c of the burst, which with one server (c = burst)
// made every key with a count wait for Redis.
func TestWindowedDecidesLocallyWhateverTheFleetSize(t *testing.T) {
	for _, servers := range []int{1, 2} {
		t.Run(strconv.Itoa(servers), func(t *testing.T) {
			// arrays wide enough that no two of the keys share both counters
			f := newWinFleet(t, servers, func(c *LimitConfig) { c.WindowWidth = 1 << 16 })
			f.width = 1 << 16
			f.warm()
			const keys, every = 100, 12 // each key every 120 ms: 8 or 9 in a window of 1 s
			start := t0.Add(time.Second)
			waited, denied, all := 0, 0, 0
			for step := range 300 { // 3 s in steps of 10 ms
				now := start.Add(time.Duration(step) * 10 * time.Millisecond)
				for k := range keys {
					if step%every != k%every {
						continue
					}
					i := (step/every + k) % servers
					d, w := decide(f.es[i], now, f.lms[i], "c"+strconv.Itoa(k), 1)
					all++
					if w != nil {
						waited++
						f.serve(i, now)
						d = w.Decision()
					}
					if !d.Allowed {
						denied++
					}
				}
				for i := range servers {
					f.serve(i, now)
				}
			}
			t.Logf("%d servers: %d requests, %d waited for Redis, %d denied", servers, all, waited, denied)
			if waited*100 > all {
				t.Errorf("%d of %d requests within their limit waited for Redis, want at most 1%%", waited, all)
			}
			if denied > 0 {
				t.Errorf("%d of %d requests within their limit were denied", denied, all)
			}
		})
	}
}

// TestWindowedLostArray: a window's array lost while the fleet counts in it (a FLUSHALL
// here; an eviction or an empty restart alike) is found by the next answer of a server
// that counted there, a count below what that server alone added: it counts the loss
// (LimitStats.LostBuckets) and adds its part again, so that the window does not start
// over empty. A count at or above its part (another server's admissions) is no loss.
func TestWindowedLostArray(t *testing.T) {
	f := newWinFleet(t, 2, nil)
	f.warm()
	now := t0.Add(2 * time.Second)
	key, _, _ := f.roomy("k", now, 800*time.Millisecond)
	f.fresh(now.Add(-10 * time.Millisecond)) // fresh marks: admits without asking
	admitted := 0
	for i := range 3 { // three admissions of key, each counted with a report
		at := now.Add(time.Duration(i) * 100 * time.Millisecond)
		if d, w := decide(f.es[0], at, f.lms[0], key, 1); w == nil && d.Allowed {
			admitted++
		}
		f.serve(0, at.Add(50*time.Millisecond))
	}
	if got := f.count(key, now.Add(250*time.Millisecond)); got != admitted || admitted == 0 {
		t.Fatalf("count %d after %d admissions", got, admitted)
	}
	if n := f.lms[0].LostBuckets(); n != 0 {
		t.Fatalf("%d arrays counted lost before any was", n)
	}
	f.m.FlushAll()
	at := now.Add(300 * time.Millisecond)
	if d, w := decide(f.es[0], at, f.lms[0], key, 1); w == nil && d.Allowed {
		admitted++
	}
	f.serve(0, at.Add(50*time.Millisecond))  // its answer: 1, below the server's part
	f.serve(0, at.Add(100*time.Millisecond)) // the part added again
	if n := f.lms[0].LostBuckets(); n != 1 {
		t.Errorf("%d arrays counted lost, want 1", n)
	}
	if got := f.count(key, at.Add(100*time.Millisecond)); got != admitted {
		t.Errorf("count %d after the loss, want the server's %d admissions", got, admitted)
	}
	// The other server's admissions only raise the count: no loss found by server 0.
	if _, w := decide(f.es[1], at, f.lms[1], "x", 1); w != nil {
		f.serve(1, at)
	}
	if d, w := decide(f.es[1], at.Add(110*time.Millisecond), f.lms[1], key, 1); w == nil && d.Allowed {
		f.serve(1, at.Add(160*time.Millisecond))
	}
	if d, w := decide(f.es[0], at.Add(200*time.Millisecond), f.lms[0], key, 1); w == nil && d.Allowed {
		f.serve(0, at.Add(250*time.Millisecond))
	}
	if n := f.lms[0].LostBuckets() + f.lms[1].LostBuckets(); n != 1 {
		t.Errorf("%d arrays counted lost in all, want 1", n)
	}
}

// TestWindowedStalledTrip: a grant whose trip goes only after its window and the next
// have ended (a stalled client) is not sent, and, Redis being healthy, its request is not
// the failure policy's: it waits again for a grant of its key's current window, or, its
// key evicted meanwhile, is refused to try again.
func TestWindowedStalledTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		evict bool
		want  Decision
	}{
		{"held", false, Decision{Allowed: true, Source: SourceGlobal, Reason: ReasonGranted}},
		{"evicted", true, Decision{Source: SourceGlobal, Reason: ReasonPaced}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWinFleet(t, 2, func(c *LimitConfig) { c.MaxKeys = 1 })
			e, lm := f.es[0], f.lms[0]
			f.serve(0, t0)
			_, w := decide(e, t0, lm, "a", 1) // before the server is warm: it asks and waits
			if w == nil {
				t.Fatal("a request before the server is warm did not wait")
			}
			late := t0.Add(3 * time.Second) // the window of t0 and the next have ended
			if tc.evict {
				if _, wb := decide(e, late, lm, "b", 1); wb == nil {
					t.Fatal("a second key did not wait")
				}
			}
			f.serve(0, late)
			d := w.Decision()
			if d.Allowed != tc.want.Allowed || d.Source != tc.want.Source || d.Reason != tc.want.Reason {
				t.Fatalf("the stalled request: %+v, want %+v", d, tc.want)
			}
			if got, want := f.count("a", late), 0; tc.evict && got != want {
				t.Errorf("Redis counts %d for the evicted key's current window, want %d", got, want)
			}
			if got, want := f.count("a", late), 1; !tc.evict && got != want {
				t.Errorf("Redis counts %d for the key's current window, want its grant's %d", got, want)
			}
		})
	}
}

// TestCountDemandSampled: once the fleet's count of an over key's requests passes
// demandCounts a window, a server counts them at odds with inverse weights: the counts it
// sends add up to about the requests it saw (no bias), in about demandCounts·seen/count
// ops; below it every request is counted, at its own weight.
func TestCountDemandSampled(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dem, req int // the fleet's last count, and the requests this server sees
		wantOps  float64
	}{
		{"under demandCounts", demandCounts / 2, 1000, 1000},
		{"at 10 times", 10 * demandCounts, 20000, 2000},
		{"weights not whole", 100, 50000, 50000 * demandCounts / 100},
		{"at 1000 times", 1000 * demandCounts, 4000000, 4000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wl := &windowed{lm: &Limit{seed: 1 ^ demandSalt}, demOp: map[string]int{}}
			st := &wkey{win: 1, dem: tc.dem}
			ops, sum := 0, 0
			for i := range tc.req {
				wl.countDemand(st, "k", 1, float64(st.dem), time.Unix(0, int64(i)*1000))
				for _, op := range wl.ops { // each request its own report: every op counts
					if !op.demand || op.id != "k" {
						t.Fatalf("queued %+v", op)
					}
					ops, sum = ops+1, sum+op.n
				}
				wl.ops = wl.ops[:0]
				clear(wl.demOp)
			}
			if got := float64(sum) / float64(tc.req); got < 0.9 || got > 1.1 {
				t.Errorf("counted %d for %d requests (%.3f×)", sum, tc.req, got)
			}
			if got := float64(ops) / tc.wantOps; got < 0.8 || got > 1.2 {
				t.Errorf("%d ops, want about %.0f", ops, tc.wantOps)
			}
		})
	}
}

// TestCountedAfter: from countedAfter decay times on, 1 - exp(-t/tau) is 1 in float64,
// so rate's shortcut changes no answer.
func TestCountedAfter(t *testing.T) {
	for _, tau := range []time.Duration{time.Millisecond, 400 * time.Millisecond, 4 * time.Second} {
		for _, d := range []time.Duration{countedAfter * tau, countedAfter*tau + 1, 2 * countedAfter * tau, 24 * time.Hour} {
			if got := 1 - math.Exp(-float64(d)/float64(tau)); got != 1 {
				t.Errorf("tau %v, t %v: 1 - exp(-t/tau) = %v, want 1", tau, d, got)
			}
		}
	}
}

// TestExpNeg: expNeg is math.Exp(-x) to within 2 ulps where it takes the series, and
// math.Exp(-x) itself elsewhere.
func TestExpNeg(t *testing.T) {
	ulp := math.Nextafter(1, 0) - 1 // negative: one ulp below 1, the results' scale
	xs := []float64{0, 5e-324, 1e-300, 1e-12, 1e-9, 1e-6, 1e-4, 0x1p-11, math.Nextafter(0x1p-10, 0)}
	for i := 1; i <= 100000; i++ {
		xs = append(xs, 0x1p-10*float64(i)/100000)
	}
	for _, x := range xs {
		got, want := expNeg(x), math.Exp(-x)
		if d := math.Abs(got - want); d > -2*ulp {
			t.Errorf("expNeg(%g) = %v, math.Exp = %v: %g ulps apart", x, got, want, d/-ulp)
		}
	}
	for _, x := range []float64{0x1p-10, 0.5, 1, 38, 1000, math.Inf(1), -1e-9, -1, math.NaN()} {
		if got, want := expNeg(x), math.Exp(-x); got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Errorf("expNeg(%g) = %v, want math.Exp's %v", x, got, want)
		}
	}
}

// BenchmarkWindowRate is a key's rate estimate on the windowed kind's hot path, for a key
// seen every microsecond, in a server's first minute and once it has run for an hour
// (past countedAfter decay times, when the count's decay is expNeg's series alone; in
// the first minute math.Exp runs beside it, for the share of the decay time counted).
//
//	go test ./internal/engine -run '^$' -bench WindowRate -count 5
func BenchmarkWindowRate(b *testing.B) {
	for _, c := range []struct {
		name string
		ran  time.Duration
	}{{"first-minute", 30 * time.Second}, {"after-an-hour", time.Hour}} {
		b.Run(c.name, func(b *testing.B) {
			wl := &windowed{windowTimes: timesOf(time.Second.Microseconds(), 120*time.Millisecond), start: t0, startAt: at(t0)}
			st := &wkey{}
			now := t0.Add(c.ran)
			var sum float64
			for b.Loop() {
				now = now.Add(time.Microsecond)
				ewc, perSec := wl.rate(st, at(now))
				st.ewc, st.ewAt = ewc, at(now)
				sum += perSec
			}
			if sum <= 0 {
				b.Fatal("no rate")
			}
		})
	}
}

// TestWindowLeft: left, from a key's window bounds (setWin), is end's Sub, and endAt is
// at(end) (but for the zero Time, which at
// reads as never), on virtual instants
// from the zero Time (the simulator's), on the wall clock with and without a monotonic
// reading, with Redis's clock ahead and behind, windows of a microsecond to an hour.
func TestWindowLeft(t *testing.T) {
	for _, base := range []time.Time{{}, t0, time.Now(), time.Unix(0, 0), time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)} {
		for _, w := range []time.Duration{time.Microsecond, 7 * time.Millisecond, time.Second, time.Hour} {
			for _, off := range []time.Duration{0, 1, -1, 3*time.Millisecond + 17, -time.Hour} {
				wl := &windowed{windowTimes: timesOf(w.Microseconds(), 0)}
				wl.offset.Store(int64(off))
				for i, d := range []time.Duration{0, 1, 999, time.Microsecond, 1234567, w / 2, w, 3*w + 11} {
					now := base.Add(d)
					phase := wire.WindowPhase("key"+strconv.Itoa(i), wl.wUs)
					win := wire.WindowIndex(wl.rnow(now), phase, wl.wUs)
					for _, k := range []int64{win - 1, win, win + 2} {
						st := &wkey{init: true, phase: phase}
						st.setWin(k, wl.wUs)
						if got, want := wl.left(st, now.UnixNano()), wl.end(k, phase).Sub(now); got != want {
							t.Errorf("base %v, w %v, off %v, now +%v, win %d: left %v, end's Sub %v", base, w, off, d, k-win, got, want)
						}
						if e := wl.end(k, phase); !e.IsZero() && wl.endAt(k, phase) != at(e) { // at(zero) is never
							t.Errorf("base %v, w %v, off %v, win %d: endAt %d, at(end) %d", base, w, off, k-win, wl.endAt(k, phase), at(e))
						}
					}
				}
			}
		}
	}
}

// TestShiftMicro holds shiftMicro to now.Add(off).UnixMicro(), the rule it computes
// without building the instant: instants with and without a monotonic reading, before
// 1970 and from the zero Time (the simulator's), offsets of either sign with every
// carry of their nanoseconds.
func TestShiftMicro(t *testing.T) {
	nows := []time.Time{
		time.Unix(1_700_000_000, 0), time.Unix(1_700_000_000, 999), time.Unix(1_700_000_000, 999_999_999),
		time.Unix(-5, 1), time.Unix(-1, 999_999_500), time.Unix(0, 0),
		{}, time.Time{}.Add(1500 * time.Nanosecond), time.Time{}.Add(3*time.Hour + 999),
		time.Now(), time.Now().Add(123_456_789),
	}
	offs := []time.Duration{0, 1, -1, 999, -999, 1000, -1000, 1001, -1001, 500, -500,
		time.Second + 1, -time.Second - 1, 37*time.Minute + 999_999, -(37*time.Minute + 999_999), 1 << 40, -(1 << 40)}
	for _, now := range nows {
		for _, off := range offs {
			for _, ns := range []time.Duration{0, 1, 499, 500, 501, 999} {
				n := now.Add(ns)
				if got, want := shiftMicro(n, off), n.Add(off).UnixMicro(); got != want {
					t.Errorf("shiftMicro(%v, %v) = %d, want %d", n, off, got, want)
				}
			}
		}
	}
}

// TestWindowCountsRequeuedStayOne: the counts a failed trip carried are put back joined
// to the key's count queued for their window, and the next admissions join them: under
// FailLocal with Redis away for most of a window, a key's admissions stay one count per
// window, adding up to every admission, however many trips fail.
func TestWindowCountsRequeuedStayOne(t *testing.T) {
	f := newWinFleet(t, 1, func(c *LimitConfig) { c.Policy = breaker.FailLocal(); c.Rate, c.Burst = 100, 100 })
	f.warm()
	e, lm := f.es[0], f.lms[0]
	wl := lm.windowed()
	f.open = true
	base := t0.Add(2 * time.Second)
	admitted := 0
	for ms := 0; ms < 900; ms += 10 {
		now := base.Add(time.Duration(ms) * time.Millisecond)
		d, w := decide(e, now, lm, "hot", 1)
		f.serve(0, now)
		if w != nil {
			d = w.Decision()
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted == 0 || f.trips < 5 {
		t.Fatalf("admitted %d in %d failed trips: the test needs both", admitted, f.trips)
	}
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wins := map[int64]int{}
	sum := 0
	for _, op := range wl.ops {
		if op.id == wire.KeyID("hot") && op.admits() {
			wins[op.win]++
			sum += op.n
		}
	}
	for win, n := range wins {
		if n != 1 {
			t.Errorf("window %d: %d counts of the key queued, want 1", win, n)
		}
	}
	if sum != admitted {
		t.Errorf("the queued counts add %d, want the %d admissions", sum, admitted)
	}
}

// TestWindowMarksReadThroughOneMillisecond: more marks than one read returns, all
// recorded in one millisecond (one writer's trip), are read through, each read past the
// ones before it, and the marks after them are learnt: the reads do not return the same
// page without end, leaving the shard never fresh.
func TestWindowMarksReadThroughOneMillisecond(t *testing.T) {
	f := newWinFleet(t, 1, func(c *LimitConfig) { c.WindowShards = 0 })
	f.warm()
	e, lm := f.es[0], f.lms[0]
	wl := lm.windowed()
	at := t0.Add(time.Second)
	f.m.SetTime(at)
	glim := redisstore.Limit{Name: lm.Name(), Rate: lm.Rate(), Burst: lm.Burst()}
	var marks []redisstore.WindowMark
	for i := 0; i <= redisstore.MaxMarksRead+5; i++ {
		marks = append(marks, redisstore.WindowMark{ID: redisstore.KeyID("m" + strconv.Itoa(i)), Flags: wire.MarkLow, Win: 1})
	}
	w := redisstore.WindowTrip{Limit: glim, Width: redisstore.ShardWidth(1<<10, 1), Marks: marks, At: at, Memory: windowMemory}
	if err := f.store.Windows(context.Background(), &w); err != nil {
		t.Fatal(err)
	}
	late := redisstore.WindowTrip{Limit: glim, Width: redisstore.ShardWidth(1<<10, 1), At: at.Add(5 * time.Millisecond), Memory: windowMemory,
		Marks: []redisstore.WindowMark{{ID: "late", Flags: wire.MarkLow | wire.MarkSpent, Win: 1}}}
	if err := f.store.Windows(context.Background(), &late); err != nil {
		t.Fatal(err)
	}
	now := at
	for ms := 10; ms <= 500; ms += 10 {
		now = at.Add(time.Duration(ms) * time.Millisecond)
		decide(e, now, lm, "x"+strconv.Itoa(ms), 1) // something to report
		f.serve(0, now)
	}
	wl.mu.Lock()
	defer wl.mu.Unlock()
	for _, id := range []string{"m0", "m" + strconv.Itoa(redisstore.MaxMarksRead+5), "late"} {
		if _, ok := wl.marks[id]; !ok {
			t.Errorf("mark %s not learnt", id)
		}
	}
	if !wl.fresh(now, "zz") {
		t.Errorf("the shard's marks are not fresh 500 ms after they were written: next read from %v, skipping %d", wl.since[0].Sub(at), wl.skip[0])
	}
}

// TestWindowedRemovedReportsLast: a windowed limit removed at run time sends a last
// report: what it admitted without asking is counted, and a request waiting for its
// grant is decided on the answer, as it would have been (not denied as closed: the
// limiter is not).
func TestWindowedRemovedReportsLast(t *testing.T) {
	f := newWinFleet(t, 1, nil)
	f.warm()
	e := f.es[0]
	now := t0.Add(2 * time.Second)
	key, _, _ := f.roomy("k", now, 800*time.Millisecond)
	f.admitFree(key, now)
	g := newWinFleet(t, 1, nil) // a server not warm yet: its request waits for a grant
	g.serve(0, t0)
	_, w := decide(g.es[0], t0, g.lms[0], "z", 1)
	if w == nil {
		t.Fatal("a request before the server is warm did not wait")
	}
	for _, x := range []*Engine{e, g.es[0]} {
		if err := x.RemoveLimit("api"); err != nil {
			t.Fatal(err)
		}
	}
	g.serve(0, t0.Add(10*time.Millisecond))
	select {
	case <-w.Done():
		if d := w.Decision(); !d.Allowed || d.Reason != ReasonGranted {
			t.Errorf("the waiting request: %+v, want it admitted by its grant", d)
		}
	default:
		t.Error("the request waiting for a grant of the removed limit was not decided")
	}
	f.serve(0, now.Add(100*time.Millisecond))
	if got := f.count(key, now); got != 1 {
		t.Errorf("the admission without asking counts %d in Redis, want 1", got)
	}
	e.mu.Lock()
	left := len(e.retiring)
	e.windowsDue() // drops the limits whose last report went
	left2 := len(e.retiring)
	e.mu.Unlock()
	if left2 != 0 {
		t.Errorf("%d removed limits retiring after their last report went (%d before the check)", left2, left)
	}
}

// TestExpAge: expAge is math.Exp(-d/tau) to within two ulps of 1 (the scale of 1 - e^-x,
// which rate reads) for the ages a server's decisions bring in its first countedAfter
// decay times, in order and out of it (steps of a microsecond to a minute, and back),
// whether the age held serves them or not, also from goroutines at once.
func TestExpAge(t *testing.T) {
	tau := decayTime(time.Second)
	near := func(t *testing.T, got float64, d time.Duration) {
		t.Helper()
		if want := math.Exp(-float64(d) / float64(tau)); math.Abs(got-want) > 2*0x1p-52 {
			t.Fatalf("expAge(%v) = %v, want math.Exp's %v", d, got, want)
		}
	}
	t.Run("in turn", func(t *testing.T) {
		wl := &windowed{windowTimes: timesOf(time.Second.Microseconds(), 120*time.Millisecond)}
		r := rand.New(rand.NewPCG(1, 2))
		d, held := 100*time.Millisecond, 0
		for range 20000 {
			switch k := r.IntN(100); {
			case k < 90:
				d += time.Duration(r.IntN(int(time.Millisecond)))
			case k < 95:
				d += time.Duration(r.IntN(int(time.Minute)))
			default:
				d = max(d-time.Duration(r.IntN(int(time.Second))), time.Microsecond)
			}
			if d >= countedAfter*tau { // rate asks only for younger ages
				d = time.Duration(r.Int64N(int64(countedAfter * tau)))
			}
			if a := wl.ageAt.Load(); a > 0 && d >= time.Duration(a) && float64(d-time.Duration(a))/float64(tau) < 0x1p-10 {
				held++
			}
			near(t, wl.expAge(d), d)
		}
		if held < 10000 {
			t.Fatalf("the age held served %d of 20000: the test does not test it", held)
		}
	})
	t.Run("at once", func(t *testing.T) {
		wl := &windowed{windowTimes: timesOf(time.Second.Microseconds(), 120*time.Millisecond)}
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				d := time.Duration(g+1) * time.Millisecond
				for i := range 5000 {
					d += time.Duration(i%7) * time.Microsecond
					if got := wl.expAge(d); math.Abs(got-math.Exp(-float64(d)/float64(tau))) > 2*0x1p-52 {
						t.Errorf("goroutine %d: expAge(%v) = %v, want math.Exp's %v", g, d, got, math.Exp(-float64(d)/float64(tau)))
						return
					}
				}
			})
		}
		wg.Wait()
	})
}

// TestRnowAtIsRnow: a hit's reading of Redis's time from Unix nanoseconds (rnowAt) is
// rnow's of the same instant, for instants UnixNano holds (Engine.Decide's): before and
// after 1970, with every carry of the nanoseconds below a microsecond, Redis's clock
// ahead and behind.
func TestRnowAtIsRnow(t *testing.T) {
	nows := []time.Time{
		time.Unix(1_700_000_000, 0), time.Unix(1_700_000_000, 999_999_999), time.Unix(-5, 1),
		time.Unix(-1, 999_999_500), time.Unix(0, 0), t0, time.Now(),
		time.Date(1678, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2261, 12, 31, 0, 0, 0, 0, time.UTC),
	}
	offs := []time.Duration{0, 1, -1, 999, -999, 1000, -1000, 1001, -1001, 500, -500, 37*time.Minute + 999_999, -(37*time.Minute + 999_999)}
	for _, now := range nows {
		for _, off := range offs {
			wl := &windowed{}
			wl.offset.Store(int64(off))
			for _, ns := range []time.Duration{0, 1, 499, 500, 501, 999} {
				n := now.Add(ns)
				if got, want := wl.rnowAt(n.UnixNano()), wl.rnow(n); got != want {
					t.Errorf("rnowAt(%v) with offset %v = %d, rnow %d", n, off, got, want)
				}
			}
		}
	}
}

// TestSeen: what a trip is built at (latest) never runs back, takes every instant a
// microsecond or more past the one it holds, and every instant the limit's lock (nowAt)
// brings, and is never a microsecond or more behind the latest instant seen: in 2026,
// and around and before 1970, where the clocks a Limiter takes may read too.
func TestSeen(t *testing.T) {
	for _, base := range []int64{t0.UnixNano() - t0.UnixNano()%1000, 0, -5_000_000, time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()} {
		for _, tc := range []struct {
			name  string
			steps []int64 // nanoseconds after base; below 0: through nowAt
			want  []int64 // latest after each, after base
		}{
			{"within a microsecond", []int64{0, 1, 500, 999}, []int64{0, 0, 0, 0}},
			{"past it", []int64{0, 999, 1000, 1001, 2500}, []int64{0, 0, 1000, 1000, 2500}},
			{"never back", []int64{3000, 1000, 2999, 0}, []int64{3000, 3000, 3000, 3000}},
			{"the lock's instants", []int64{10, -20, 30, -40, 1040}, []int64{0, 20, 20, 40, 1040}},
		} {
			t.Run(fmt.Sprintf("%d/%s", base, tc.name), func(t *testing.T) {
				wl := &windowed{}
				wl.last.Store(never)
				if !wl.latest().IsZero() {
					t.Fatalf("latest %v before any instant", wl.latest())
				}
				wl.seen(base)
				latest := base
				for i, s := range tc.steps {
					if s < 0 {
						wl.nowAt(base - s)
						latest = max(latest, base-s)
					} else {
						wl.seen(base + s)
						latest = max(latest, base+s)
					}
					got := wl.latest().UnixNano()
					if got != base+tc.want[i] {
						t.Errorf("step %d (%d): latest +%d, want +%d", i, s, got-base, tc.want[i])
					}
					if latest-got >= 1000 {
						t.Errorf("step %d (%d): latest %d behind the latest instant seen", i, s, latest-got)
					}
				}
			})
		}
	}
}

// TestWindowedPanicLeavesTheShardUnlocked: a windowed decision that panics past its hit
// (in missLocked, the key's window state lost) leaves the key's shard unlocked, and the
// limit's lock too, as a bucket's does (TestPanicLeavesTheShardUnlocked).
func TestWindowedPanicLeavesTheShardUnlocked(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) {
		c.Limits[0].Rate, c.Limits[0].Burst = 10, 10
		c.Limits[0].Windowed = 100 * time.Millisecond
	})
	decide(e, t0, lm, "k", 1)
	// With a lock left held, Inspect or the decision blocks, and go test's -timeout
	// reports the test.
	set := func(st *wkey) {
		lm.keys.Inspect("k", t0.UnixNano(), func(ke *keystore.Entry[entry]) {
			if ke == nil {
				t.Fatal("no entry for the key")
			}
			ke.Val.win, ke.Val.shape = st, nil // no shape: the decision skips the hit
		})
	}
	set(nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the decision did not panic")
			}
		}()
		decide(e, t0, lm, "k", 1)
	}()
	set(new(wkey))
	if d, w := decide(e, t0, lm, "k", 1); w == nil && d.Reason == ReasonClosed {
		t.Fatalf("the next decision: %+v", d)
	}
}

// TestSetWinBounds: a key's window bounds (setWin), which a hit compares Redis's time
// with, hold exactly the instants WindowIndex puts in its window, for windows of a
// microsecond to an hour, any phase, before and after 1970; and the time left read from
// them (left) is end's Sub.
func TestSetWinBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, w := range []int64{1, 7, 1000, 999_983, 3_600_000_000} {
		for range 2000 {
			st := &wkey{phase: r.Int64N(w)}
			us := r.Int64N(1<<52) - 1<<51
			win := wire.WindowIndex(us, st.phase, w)
			st.setWin(win, w)
			for _, d := range []int64{-w - 1, -w, -1, 0, 1, w - 1, w, w + 1} {
				x := us + d
				if in, want := x >= st.lo && x < st.hi, wire.WindowIndex(x, st.phase, w) == win; in != want {
					t.Fatalf("w %d, phase %d, window %d [%d, %d): %d in it %v, WindowIndex says %v", w, st.phase, win, st.lo, st.hi, x, in, want)
				}
			}
			// left, a key's time left in its window, is end's Sub, whatever Redis's offset.
			wl := &windowed{windowTimes: timesOf(w, 0)}
			wl.offset.Store(r.Int64N(2e9) - 1e9)
			if ns := us*1000 + r.Int64N(3000) - 1500; wl.left(st, ns) != wl.end(win, st.phase).Sub(time.Unix(0, ns)) {
				t.Fatalf("w %d, window %d, at %d: left %v, end's Sub %v", w, win, ns, wl.left(st, ns), wl.end(win, st.phase).Sub(time.Unix(0, ns)))
			}
		}
	}
}

// TestWindowedFallbackRefusedKeepsThePreCheck: a request whose wait for Redis ran out,
// with the limit's queue for Redis full, cannot be counted where its policy admits it:
// it is refused for a report interval, and its pre-check tokens go back, so that the
// refusal costs the key nothing.
func TestWindowedFallbackRefusedKeepsThePreCheck(t *testing.T) {
	e, lm := testEngine(t, func(c *Config) {
		c.Limits[0].Windowed, c.Limits[0].Policy = 100*time.Millisecond, breaker.FailOpen
		c.Limits[0].PreRate, c.Limits[0].PreBurst = 1, 2
	})
	_, w := decide(e, t0, lm, "k", 1)
	if w == nil {
		t.Fatal("a new key of a new server did not ask Redis")
	}
	wl := lm.windowed()
	wl.mu.Lock()
	wl.ops = make([]wop, maxQueued) // full
	wl.mu.Unlock()
	d := e.GiveUp(t0, w, ReasonTimeout)
	if d.Allowed || d.Source != SourceFallback || d.RetryAfter <= 0 {
		t.Fatalf("a request its policy admits, the queue full: %+v, want refused for a report interval", d)
	}
	var pre float64
	lm.keys.Peek("k", func(en *entry, _ int64) { pre = en.pre.TokensAt(t0.UnixNano()) })
	if pre != 2 {
		t.Errorf("the key's pre-check holds %v after the refusal, want its burst, 2", pre)
	}
}

// TestWindowGranted: a grant gets what the key's count, answered after it, leaves
// within the burst: all it asked below it, the part that fits across it, none past it.
func TestWindowGranted(t *testing.T) {
	_, lm := testEngine(t, func(c *Config) { c.Limits[0].Burst, c.Limits[0].Windowed = 10, 10*time.Millisecond })
	wl := lm.windowed()
	for _, tc := range []struct{ n, count, want int }{
		{3, 5, 3}, {3, 10, 3}, {5, 12, 3}, {5, 15, 0}, {5, 20, 0}, {1, 11, 0}, {10, 10, 10},
	} {
		if got := wl.granted(wop{n: tc.n}, tc.count); got != tc.want {
			t.Errorf("a grant of %d answered %d of a burst of 10: %d, want %d", tc.n, tc.count, got, tc.want)
		}
	}
}

// TestWindowedTripAsksTheClock: a server's first trip asks Redis's time, and then a
// trip asks it once a windowClock; every trip records its marks (At) at Redis's time as
// the last answer measured it, this server's now plus the offset (here Redis 3 s ahead).
// A shard's set of marks is trimmed (Tidy) with its marks at most once a windowClock.
func TestWindowedTripAsksTheClock(t *testing.T) {
	f := newWinFleet(t, 1, nil)
	e, wl := f.es[0], f.lms[0].windowed()
	const ahead = 3 * time.Second
	// a trip at now with a mark of key "a" to send, answered at Redis's time now+ahead
	trip := func(now time.Time) *Trip {
		t.Helper()
		e.Tick(now)
		wl.mu.Lock()
		wl.announce[wmk{id: "a", win: 1}] = wire.MarkLow
		wl.due.Store(true)
		wl.mu.Unlock()
		x := e.Next()
		if x == nil || x.Kind != WindowsTrip {
			t.Fatalf("at %v: trip %+v, want the limit's", now.Sub(t0), x)
		}
		f.m.SetTime(now.Add(ahead))
		for j := range x.Windows {
			x.WindowErrs[j] = f.store.Windows(context.Background(), &x.Windows[j])
		}
		x.Answered = true
		e.Done(now, x)
		return x
	}
	marks := wire.WindowMarksShard("a", wire.WindowShards)
	for _, tc := range []struct {
		after       time.Duration
		clock, tidy bool
		at          time.Duration // At, less the trip's instant
	}{
		{0, true, true, 0}, // the first trip: no offset measured yet
		{100 * time.Millisecond, false, false, ahead}, // within a windowClock of the first
		{windowClock, true, true, ahead},              // a windowClock after it
	} {
		now := t0.Add(tc.after)
		x := trip(now)
		for j, w := range x.Windows {
			if clock := j == 0 && tc.clock; w.Clock != clock {
				t.Errorf("%v: round trip %d asks the clock %v, want %v", tc.after, j, w.Clock, clock)
			}
			if tidy := w.Shard == marks && tc.tidy; w.Tidy != tidy {
				t.Errorf("%v: shard %d tidies %v, want %v", tc.after, w.Shard, w.Tidy, tidy)
			}
			if !w.At.Equal(now.Add(tc.at)) {
				t.Errorf("%v: shard %d's At %v after the trip, want %v", tc.after, w.Shard, w.At.Sub(now), tc.at)
			}
		}
	}
	if got := wl.off(); got != ahead {
		t.Errorf("Redis's clock measured %v ahead, want %v", got, ahead)
	}
}

// TestWindowedReadsAloneOnlyAfterFreeAdmissions: a read makes a trip of its own only if
// the server admitted without asking since its last read went (fresh marks allow that);
// once such a read went, a server with nothing to report makes no trip at all.
func TestWindowedReadsAloneOnlyAfterFreeAdmissions(t *testing.T) {
	f := newWinFleet(t, 1, nil)
	f.warm()
	now := t0.Add(2 * time.Second)
	key, _, _ := f.roomy("k", now, 800*time.Millisecond)
	f.admitFree(key, now)                     // its read went at now-10ms
	f.serve(0, now.Add(100*time.Millisecond)) // the report of the admission, no read due
	before := f.trips
	f.serve(0, now.Add(300*time.Millisecond)) // a read due, and an admission since the last
	if got := f.trips - before; got != 1 {
		t.Fatalf("%d trips with a read due after an admission without asking, want 1: the read alone", got)
	}
	before = f.trips
	for ms := 350; ms <= 1500; ms += 50 {
		f.serve(0, now.Add(time.Duration(ms)*time.Millisecond))
	}
	if got := f.trips - before; got != 0 {
		t.Errorf("%d trips of a server with nothing to report and no admission since its last read, want 0", got)
	}
}

// TestWindowedDemandCountedApart: an over key's requests counted for odds (countDemand)
// go to Redis as demand, in the window's demand row: the key's count, which its grants
// and marks are judged by, does not grow with them.
func TestWindowedDemandCountedApart(t *testing.T) {
	f := newWinFleet(t, 1, nil)
	f.warm()
	lm := f.lms[0]
	wl := lm.windowed()
	now := t0.Add(2 * time.Second)
	key, win, _ := f.roomy("k", now, 500*time.Millisecond)
	wl.mu.Lock()
	var st wkey
	wl.key(&st, key, now)
	wl.countDemand(&st, key, 3, 0, now) // below demandCounts: each request counted
	wl.due.Store(true)
	wl.mu.Unlock()
	f.serve(0, now)
	if c, d := f.count(key, now), f.add(key, win, 0, true); c != 0 || d != 3 {
		t.Errorf("the key's count %d, its demand %d; want 0 and the 3 requests", c, d)
	}
}

// TestWindowedFirstMarkGoesAtOnce: a count answered past the burst makes the key's first
// mark in a while, which goes at once: the trip that answered it is followed by one that
// carries the mark, without waiting for the next report.
func TestWindowedFirstMarkGoesAtOnce(t *testing.T) {
	f := newWinFleet(t, 2, nil)
	f.warm()
	e := f.es[0]
	now := t0.Add(2 * time.Second)
	key, win, _ := f.roomy("k", now, 900*time.Millisecond) // its window began 100 ms ago or less
	f.admitFree(key, now)
	f.add(key, win, 10, false) // the fleet spent the window
	at := now.Add(100 * time.Millisecond)
	f.m.SetTime(at)
	e.Tick(at)
	var marks []redisstore.WindowMark
	for trip := e.Next(); trip != nil; trip = e.Next() { // the report (count 11), then what it made due
		for j := range trip.Windows {
			trip.WindowErrs[j] = f.store.Windows(context.Background(), &trip.Windows[j])
			marks = append(marks, trip.Windows[j].Marks...)
		}
		trip.Answered = true
		e.Done(at, trip)
	}
	// spent 200 ms or less into its window: at four times its rate or more, over too
	want := redisstore.WindowMark{ID: redisstore.KeyID(key), Flags: wire.MarkLow | wire.MarkSpent | wire.MarkOver, Win: win}
	if len(marks) != 1 || marks[0] != want {
		t.Errorf("marks sent at once %+v, want %+v", marks, want)
	}
}

// TestWindowedGrantOfAnotherWindow: what a grant leaves unspent serves its own window
// alone. Answered in its window, a grant larger than its request leaves the rest to the
// key's next requests; answered once the key's window has changed, it leaves the key no
// grants of the new window, nor does one whose request gave up; and a grant refused (the
// fleet spent the window) gives the request that gave up nothing back. A key that holds
// no grants waits for Redis with its next request (the server is not warm), or, its
// window known spent, is refused.
func TestWindowedGrantOfAnotherWindow(t *testing.T) {
	for _, tc := range []struct {
		name         string
		grant        int    // asked for the request of 1
		giveUp, full bool   // the request gives up before the answer; the fleet spent the window
		late         bool   // answered in the key's next window
		next         Reason // of the key's next request; ReasonNone: it waits for Redis
		left         int    // the key's grants after its next request, served from them
	}{
		{"larger than the request", 4, false, false, false, ReasonLease, 2},
		{"larger than the request, answered late", 4, false, false, true, ReasonNone, 0},
		{"given up, answered late", 1, true, false, true, ReasonNone, 0},
		{"given up, refused", 1, true, true, false, ReasonPaced, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWinFleet(t, 2, nil)
			e, lm := f.es[0], f.lms[0]
			wl := lm.windowed()
			start := t0
			key, win, end := f.roomy("g", start, 0)
			for end.Sub(start) > 100*time.Millisecond { // a key whose window ends soon
				start = start.Add(50 * time.Millisecond)
				key, win, end = f.roomy("g", start, 0)
			}
			_, w := decide(e, start, lm, key, 1) // a new server: it asks, and waits
			if w == nil {
				t.Fatal("a request before the server is warm did not wait")
			}
			wl.mu.Lock()
			for i := range wl.ops {
				if wl.ops[i].w == w {
					wl.ops[i].n = tc.grant // as a key seen often asks for its rate
				}
			}
			wl.mu.Unlock()
			if tc.full {
				f.add(key, win, 10, false)
			}
			e.Tick(start)
			trip := e.Next()
			if trip == nil || trip.Kind != WindowsTrip {
				t.Fatalf("trip %+v, want the grant's", trip)
			}
			at := start // when the round trip runs, and is answered
			if tc.late {
				at = end.Add(10 * time.Millisecond)
			}
			if tc.giveUp {
				e.GiveUp(start, w, ReasonTimeout)
			}
			f.m.SetTime(at)
			for j := range trip.Windows {
				trip.WindowErrs[j] = f.store.Windows(context.Background(), &trip.Windows[j])
			}
			trip.Answered = true
			e.Done(at, trip)
			if d := w.Decision(); !tc.giveUp && (!d.Allowed || d.Reason != ReasonGranted) {
				t.Fatalf("the request: %+v, want granted", d)
			}
			d, w2 := decide(e, at, lm, key, 1)
			switch tc.next {
			case ReasonNone:
				if w2 == nil {
					t.Errorf("the key's next request: %+v, want it to wait for Redis, no grant held", d)
				}
			case ReasonLease:
				if w2 != nil || !d.Allowed || d.Reason != ReasonLease || d.Remaining != tc.left {
					t.Errorf("the key's next request: %+v (waits %v), want served from its grants, %d left", d, w2 != nil, tc.left)
				}
			default:
				if w2 != nil || d.Allowed || d.Reason != tc.next {
					t.Errorf("the key's next request, its window spent: %+v (waits %v), want refused", d, w2 != nil)
				}
			}
		})
	}
}

// TestWindowedReadsLowMark: a low mark another server wrote for a key's window, read,
// holds until that window ends: the key's requests ask Redis and wait meanwhile.
func TestWindowedReadsLowMark(t *testing.T) {
	f, e, lm := warmPair(t)
	now := t0.Add(2 * time.Second)
	key, win, _ := f.roomy("k", now, 800*time.Millisecond)
	f.mark(key, win, wire.MarkLow, now.Add(-20*time.Millisecond))
	f.fresh(now.Add(-10 * time.Millisecond)) // a trip, and with it a read: the mark learnt, marks fresh
	if d, w := decide(e, now, lm, key, 1); w == nil {
		t.Errorf("a key marked low for its window: %+v, want it to ask and wait", d)
	}
}

// TestWindowedKeyWithGrantsLearnsMarks: a read that brings marks makes every key's next
// decision learn them, a key served from the grants it holds too: marked over by the
// fleet, its request is still served from its grants, and, seen seldom, it asks a grant
// ahead, as an over key does.
func TestWindowedKeyWithGrantsLearnsMarks(t *testing.T) {
	f := newWinFleet(t, 2, nil)
	e, lm := f.es[0], f.lms[0]
	wl := lm.windowed()
	key, win, _ := f.roomy("k", t0, 800*time.Millisecond)
	_, w := decide(e, t0, lm, key, 1) // a new server: it asks, and waits
	if w == nil {
		t.Fatal("a request before the server is warm did not wait")
	}
	wl.mu.Lock()
	for i := range wl.ops {
		if wl.ops[i].w == w {
			wl.ops[i].n = 4 // 3 left for the key to hold
		}
	}
	wl.mu.Unlock()
	f.serve(0, t0)
	if d := w.Decision(); !d.Allowed || d.Reason != ReasonGranted {
		t.Fatalf("the request: %+v, want granted", d)
	}
	over := t0.Add(5 * time.Millisecond) // another server marks the key over
	f.mark(key, win, wire.MarkOver, over)
	f.fresh(t0.Add(10 * time.Millisecond)) // its trip reads the mark (not warm: every trip reads)
	if d, w := decide(e, t0.Add(20*time.Millisecond), lm, key, 1); w != nil || !d.Allowed || d.Reason != ReasonLease {
		t.Fatalf("the key's next request: %+v (waits %v), want served from its grants", d, w != nil)
	}
	var learnt instant
	lm.keys.Peek(key, func(en *entry, _ int64) { learnt = en.win.over })
	asked := false
	wl.mu.Lock()
	for _, op := range wl.ops {
		asked = asked || op.id == key && op.grant && op.ask != nil
	}
	wl.mu.Unlock()
	// over for windowMemory from when the mark was written (Redis's clock, this server's
	// the same)
	if want := at(over.Add(windowMemory)); learnt != want || !asked {
		t.Errorf("the key over until %d (0: never), a grant asked ahead %v; want %d, true", learnt, asked, want)
	}
}

// TestWindowAnswer: what the answer to one op of a key held does to the key's state
// (answer; failed, for a round trip that failed). Burst 10 over 2 servers: c = 5. The
// key admitted one request without asking (out 1), whose own count is not answered here.
func TestWindowAnswer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		prep  func(st *wkey)
		op    func(win int64) wop // of the key's current window win
		count int                 // the count answered; -1: the round trip failed
		at    time.Duration       // when, after the start of the key's window
		check func(t *testing.T, wl *windowed, st *wkey, key string)
	}{{
		// a carry is no admission: it answers none of the key's admissions
		name:  "a carry",
		op:    func(win int64) wop { return wop{win: win, n: 2, carry: true} },
		count: 5, at: 300 * time.Millisecond,
		check: func(t *testing.T, wl *windowed, st *wkey, _ string) {
			if st.out != 1 || len(wl.gone) != 0 {
				t.Errorf("out %d, owed %v; want the admission still unanswered, nothing owed", st.out, wl.gone)
			}
		},
	}, {
		// refused outright: the next window is full, and an over key may skip asking
		// for the one after (askNext)
		name:  "a grant of the next window, refused",
		prep:  func(st *wkey) { st.nextAsked = true },
		op:    func(win int64) wop { return wop{win: win + 1, n: 3, grant: true, nextWin: true} },
		count: 13, at: 300 * time.Millisecond,
		check: func(t *testing.T, wl *windowed, st *wkey, _ string) {
			if st.next != 0 || !st.passed || st.nextAsked || st.nextFull != st.win+1 {
				t.Errorf("next %d, passed %v, asked %v, full %d; want 0, true, false, %d", st.next, st.passed, st.nextAsked, st.nextFull, st.win+1)
			}
		},
	}, {
		name:  "a grant of the next window",
		prep:  func(st *wkey) { st.nextAsked, st.passed = true, true },
		op:    func(win int64) wop { return wop{win: win + 1, n: 3, grant: true, nextWin: true} },
		count: 5, at: 300 * time.Millisecond,
		check: func(t *testing.T, wl *windowed, st *wkey, _ string) {
			if st.next != 3 || st.passed || st.nextAsked || st.nextFull != 0 {
				t.Errorf("next %d, passed %v, asked %v, full %d; want 3, false, false, 0", st.next, st.passed, st.nextAsked, st.nextFull)
			}
		},
	}, {
		// its trip failed: a grant of the next window may be asked again
		name:  "a grant of the next window, failed",
		prep:  func(st *wkey) { st.nextAsked = true },
		op:    func(win int64) wop { return wop{win: win + 1, n: 3, grant: true, nextWin: true} },
		count: -1, at: 300 * time.Millisecond,
		check: func(t *testing.T, wl *windowed, st *wkey, _ string) {
			if st.nextAsked || st.next != 0 {
				t.Errorf("asked %v, next %d; want false, 0", st.nextAsked, st.next)
			}
		},
	}, {
		// count 16 in the window before: a debt of 6 carried into this one, within c
		// of its burst: low until it ends, and announced so; not spent
		name:  "an admission of the window before, past the burst",
		op:    func(win int64) wop { return wop{win: win - 1, n: 1} },
		count: 16, at: 300 * time.Millisecond,
		check: func(t *testing.T, wl *windowed, st *wkey, key string) {
			if f := wl.announce[wmk{key, st.win}]; st.low != wl.endAt(st.win, st.phase) || st.failed() || f != wire.MarkLow {
				t.Errorf("low until %d, spent %v, announced %b; want %d, false, %b", st.low, st.failed(), f, wl.endAt(st.win, st.phase), wire.MarkLow)
			}
		},
	}, {
		// An answer of a window older than the last this server counted in (a count put
		// back by a failed trip) says nothing of the newer one's: no array lost.
		name:  "an admission of an older window",
		prep:  func(st *wkey) { st.mine, st.mineWin = 1, st.win },
		op:    func(win int64) wop { return wop{win: win - 1, n: 1} },
		count: 1, at: 300 * time.Millisecond,
		check: func(t *testing.T, wl *windowed, st *wkey, _ string) {
			if n := wl.lm.LostBuckets(); n != 0 || len(wl.ops) != 0 || st.mine != 1 {
				t.Errorf("%d arrays lost, %d ops queued, mine %d; want none, none, 1", n, len(wl.ops), st.mine)
			}
		},
	}, {
		// A grant of 5 answered 12 got 3, and the window stands at 10: spent 275 ms
		// in, slower than four times the rate (10 in 250 ms), so not over; and nothing
		// left.
		name:  "a grant refused in part",
		op:    func(win int64) wop { return wop{win: win, n: 5, grant: true} },
		count: 12, at: 275 * time.Millisecond,
		check: func(t *testing.T, wl *windowed, st *wkey, _ string) {
			if st.grants != 3 || !st.failed() || st.over != 0 || st.room != 0 {
				t.Errorf("grants %d, spent %v, over until %d, room %d; want 3, true, never, 0", st.grants, st.failed(), st.over, st.room)
			}
		},
	}, {
		// a key this server sees often asks for itself: its marks are not announced
		name:  "spent, seen often",
		prep:  func(st *wkey) { st.often = true },
		op:    func(win int64) wop { return wop{win: win, n: 1} },
		count: 10, at: 300 * time.Millisecond,
		check: func(t *testing.T, wl *windowed, st *wkey, _ string) {
			if !st.failed() || len(wl.announce) != 0 {
				t.Errorf("spent %v, announced %v; want true, nothing", st.failed(), wl.announce)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWinFleet(t, 2, nil)
			f.warm()
			lm := f.lms[0]
			wl := lm.windowed()
			now := t0.Add(2 * time.Second)
			key, win, _ := f.roomy("k", now, 800*time.Millisecond) // its window began 200 ms ago or less
			f.admitFree(key, now)
			start := wl.end(win-1, wire.WindowPhase(key, wl.wUs))
			at := start.Add(tc.at)
			op := tc.op(win)
			op.id = key
			lm.keys.Peek(key, func(en *entry, _ int64) {
				wl.mu.Lock()
				defer wl.mu.Unlock()
				wl.ops, wl.admOp, wl.announce = nil, map[string]int{}, map[wmk]int{} // nothing queued
				if tc.prep != nil {
					tc.prep(en.win)
				}
				if tc.count >= 0 {
					wl.answer(en, op, tc.count, at, nil)
				}
			})
			if tc.count < 0 {
				wl.failed(at, op, storeerr.ErrUnavailable, nil)
			}
			lm.keys.Peek(key, func(en *entry, _ int64) {
				wl.mu.Lock()
				defer wl.mu.Unlock()
				tc.check(t, wl, en.win, key)
			})
		})
	}
}

// TestWindowedLostArrayAfterGiveBacks: what this server counts as its part of a key's
// window (st.mine) follows the counter, which a give-back never takes below zero: give-
// backs of admissions counted in an array since lost take off at most what the new one
// holds, and a second loss of the window is then found in full, the count restored to
// what it was before it.
func TestWindowedLostArrayAfterGiveBacks(t *testing.T) {
	f, e, lm := warmPair(t)
	now := t0.Add(2 * time.Second)
	key, _, _ := f.roomy("k", now, 800*time.Millisecond)
	d1 := f.admitFree(key, now)
	d2, w := decide(e, now.Add(20*time.Millisecond), lm, key, 1)
	if w != nil || d2.Reason != ReasonAsync {
		t.Fatalf("a second request: %+v, want admitted without asking", d2)
	}
	f.serve(0, now.Add(100*time.Millisecond)) // count 2
	f.m.FlushAll()
	if d, w := decide(e, now.Add(150*time.Millisecond), lm, key, 1); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("a third request: %+v, want admitted without asking", d)
	}
	e.Return(now.Add(160*time.Millisecond), now, lm, "", key, 1, d1)
	e.Return(now.Add(160*time.Millisecond), now, lm, "", key, 1, d2)
	// the third's count finds the loss (1 against 3: the first two are carried), then
	// the give-backs take the new counter to 0, the second of them past what it held
	f.serve(0, now.Add(200*time.Millisecond))
	f.serve(0, now.Add(300*time.Millisecond)) // the carry: 2
	before := f.count(key, now)
	if before != 2 {
		t.Fatalf("count %d once the loss was carried, want the 2 carried", before)
	}
	f.m.FlushAll()
	if d, w := decide(e, now.Add(350*time.Millisecond), lm, key, 1); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("a fourth request: %+v, want admitted without asking", d)
	}
	f.serve(0, now.Add(400*time.Millisecond)) // its count finds the second loss
	f.serve(0, now.Add(500*time.Millisecond)) // its carry
	if got, lost := f.count(key, now), lm.LostBuckets(); got != before+1 || lost != 2 {
		t.Errorf("count %d after the second loss, %d arrays lost; want the %d before it and the fourth admission, 2", got, lost, before)
	}
}

// TestWindowedAllowanceIsTheRoomLeft: once a count was answered for a key's window, a
// server admits of it without asking no more than what that count left (room), even
// where its share c is more: with one server c is the whole burst, and a key the fleet
// counts 9 of 10 in its window has one admission left to decide here; the next request
// asks Redis, and its grant is what the window still holds.
func TestWindowedAllowanceIsTheRoomLeft(t *testing.T) {
	f := newWinFleet(t, 1, nil) // burst 10, c = 10
	f.warm()
	e, lm := f.es[0], f.lms[0]
	now := t0.Add(2 * time.Second)
	key, win, _ := f.roomy("k", now, 800*time.Millisecond)
	f.add(key, win, 8, false) // the other admissions of its window
	f.admitFree(key, now)
	f.serve(0, now.Add(100*time.Millisecond)) // its count answered: 9, a room of 1
	at := now.Add(150 * time.Millisecond)
	if d, w := decide(e, at, lm, key, 1); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("%s with a room of 1: %+v (waits %v), want admitted without asking", key, d, w != nil)
	}
	d, w := decide(e, at, lm, key, 1)
	if w == nil {
		t.Fatalf("%s with its room taken: %+v, want it to ask Redis", key, d)
	}
	f.serve(0, at)
	if d := w.Decision(); d.Allowed || d.Reason != ReasonPaced {
		t.Errorf("its answer: %+v, want refused: the window counts its burst", d)
	}
	// 8, the two admitted without asking, and the refused grant, left counted
	if got := f.count(key, at); got != 11 {
		t.Errorf("count %d, want 11", got)
	}
}

// TestWindowedFreshForTwoReads: a key's marks are fresh while its shard's last read went
// within two read periods, that instant included, and stale a nanosecond later; a server
// not warm has no fresh marks.
func TestWindowedFreshForTwoReads(t *testing.T) {
	f := newWinFleet(t, 1, nil)
	wl := f.lms[0].windowed()
	if wl.fresh(t0, "k") {
		t.Fatal("fresh before the server is warm")
	}
	f.warm()
	wl.mu.Lock()
	defer wl.mu.Unlock()
	last := wl.lastRead[wire.WindowMarksShard("k", wl.shards)]
	if last.IsZero() {
		t.Fatal("no read of k's shard went while the server warmed up")
	}
	if !wl.fresh(last.Add(2*windowRead), "k") || wl.fresh(last.Add(2*windowRead+1), "k") {
		t.Errorf("fresh %v two read periods after the last read, %v a nanosecond later; want true, false",
			wl.fresh(last.Add(2*windowRead), "k"), wl.fresh(last.Add(2*windowRead+1), "k"))
	}
}

// TestWindowedCosts: a request may cost up to the burst: with one server (c = the
// burst) a new key's request of the whole burst is admitted without asking; one past
// the burst can never be, nor a negative cost; a cost of 0 is admitted at once.
func TestWindowedCosts(t *testing.T) {
	f := newWinFleet(t, 1, nil) // burst 10
	f.warm()
	now := t0.Add(2 * time.Second)
	for _, tc := range []struct {
		n    int
		want Decision
	}{
		{10, Decision{Allowed: true, Source: SourceLease, Reason: ReasonAsync, Servers: 1}},
		{11, Decision{Source: SourceLease, Reason: ReasonExceedsBurst, RetryAfter: InfDuration, Servers: 1}},
		{-1, Decision{Source: SourceLease, Reason: ReasonInvalidCost, RetryAfter: InfDuration, Servers: 1}},
		{0, Decision{Allowed: true, Source: SourceLease, Reason: ReasonLease, Servers: 1}},
	} {
		key, _, _ := f.roomy("k"+strconv.Itoa(tc.n)+"-", now, 500*time.Millisecond)
		f.fresh(now.Add(-10 * time.Millisecond)) // fresh marks
		if d, w := decide(f.es[0], now, f.lms[0], key, tc.n); w != nil || d != tc.want {
			t.Errorf("a new key's request of %d: %+v (waits %v), want %+v", tc.n, d, w != nil, tc.want)
		}
	}
}

// TestWindowedHotKeyAcrossWindows: a key a server sees often is served from grants of
// its window sized by its rate, each asked before the last runs out (its first request,
// admitted without asking, asks the first); near its window's end it asks a grant of the
// next window with its grant of this one, so that the first request of each new window
// finds grants too: no request after the first waits or goes unasked. What it held of a
// window goes with it, not into the window after (each window's grants are asked of that
// window). Closed, the server gives back what it holds: the last window counts exactly
// its admissions, and no window counts fewer than it admitted.
func TestWindowedHotKeyAcrossWindows(t *testing.T) {
	f := newWinFleet(t, 2, func(c *LimitConfig) { c.Rate, c.Burst = 1000, 1000 }) // windows of 1 s
	f.warm()
	e, lm := f.es[0], f.lms[0]
	wl := lm.windowed()
	start := t0.Add(60 * time.Millisecond)
	key, first, _ := f.roomy("hot", start, 300*time.Millisecond)
	phase := wire.WindowPhase(key, wl.wUs)
	admitted := map[int64]int{}
	now, win := start, first
	for i := 0; now.Before(start.Add(2500 * time.Millisecond)); i++ { // 200/s across two window ends
		now = now.Add(5 * time.Millisecond)
		d, w := decide(e, now, lm, key, 1)
		f.serve(0, now)
		if w != nil {
			d = w.Decision()
		}
		if !d.Allowed {
			t.Fatalf("at +%v: %+v, want every request admitted", now.Sub(start), d)
		}
		k := wire.WindowIndex(now.UnixMicro(), phase, wl.wUs)
		admitted[k]++
		if i > 0 && (w != nil || d.Reason != ReasonLease) {
			t.Errorf("request %d, window %d (its first: %v): %+v (waited %v), want served from a grant asked ahead",
				i+1, k-first, k != win, d, w != nil)
		}
		win = k
	}
	if win != first+2 {
		t.Fatalf("the run ended in window %d, want %d", win-first, 2)
	}
	e.Stop(now)
	e.Drain()
	f.serve(0, now)
	e.Finish()
	for k := first; k <= win; k++ {
		at := time.UnixMicro(wire.WindowStart(k, phase, wl.wUs))
		switch got := f.count(key, at); {
		case k == win && got != admitted[k]:
			t.Errorf("the last window counts %d once the server closed, want its %d admissions", got, admitted[k])
		case got < admitted[k]:
			t.Errorf("window %d counts %d, below its %d admissions", k-first, got, admitted[k])
		}
	}
}

// TestWindowedOverKeyAsksEveryOtherWindow: a key a server sees often, over its limit
// (window A spent in its first moments), is refused while its window is spent and asks
// ahead for a grant of the next one. Refused that grant (B full), it knows B spent when B
// comes: refused without asking until B ends. In B it does not ask for C (the every other
// window of an abusive client), so C too is refused until it ends, though it has room;
// in C it asks for D, and D's first request is served from that grant.
func TestWindowedOverKeyAsksEveryOtherWindow(t *testing.T) {
	f := newWinFleet(t, 2, func(c *LimitConfig) { c.Rate, c.Burst = 1000, 1000 }) // windows of 1 s
	f.warm()
	e, lm := f.es[0], f.lms[0]
	wl := lm.windowed()
	start := t0.Add(60 * time.Millisecond)
	key, a, _ := f.roomy("over", start, 300*time.Millisecond)
	phase := wire.WindowPhase(key, wl.wUs)
	f.m.SetTime(start)        // Redis's clock, which the arrays' lives follow
	f.add(key, a, 999, false) // the fleet's: A all but spent, B full
	f.add(key, a+1, 1000, false)
	now, win := start, a
	for win < a+3 { // 200/s into D
		now = now.Add(5 * time.Millisecond)
		d, w := decide(e, now, lm, key, 1)
		f.serve(0, now)
		k := wire.WindowIndex(now.UnixMicro(), phase, wl.wUs)
		switch end := time.UnixMicro(wire.WindowStart(k+1, phase, wl.wUs)); {
		case k == a && now == start.Add(5*time.Millisecond):
			if w != nil || d.Reason != ReasonAsync {
				t.Fatalf("the first request of A: %+v (waits %v), want admitted without asking", d, w != nil)
			}
		case k < a+3:
			// B spent as the answer to its grant said, C as one this server did not ask
			if w != nil || d.Allowed || d.Reason != ReasonPaced || d.RetryAfter != end.Sub(now) {
				t.Fatalf("window %c at +%v: %+v (waits %v), want refused until the window ends in %v",
					'A'+k-a, now.Sub(start), d, w != nil, end.Sub(now))
			}
		default:
			if w != nil || d.Reason != ReasonLease {
				t.Errorf("the first request of D: %+v (waits %v), want served from the grant asked in C", d, w != nil)
			}
		}
		win = k
	}
	// the key's window state is under its lock
	if !lm.keys.Peek(key, func(en *entry, _ int64) {
		if at(now) >= en.win.over {
			t.Errorf("%s not over in D: the test does not test an over key", key)
		}
	}) {
		t.Fatalf("%s not held", key)
	}
}

// TestWindowedLowKeyAsks: a key the fleet marked low (a debt carried into its window)
// asks Redis for what it admits: seen often, with no grant and nothing unanswered, it
// still waits for a grant rather than being admitted without asking, until its window
// ends.
func TestWindowedLowKeyAsks(t *testing.T) {
	f := newWinFleet(t, 2, func(c *LimitConfig) { c.Rate, c.Burst = 1000, 1000 }) // windows of 1 s; a pre-check that passes 200/s
	f.warm()
	e, lm := f.es[0], f.lms[0]
	now := t0.Add(400 * time.Millisecond)
	key, win, _ := f.roomy("low", now, 500*time.Millisecond)
	f.mark(key, win, wire.MarkLow, t0.Add(100*time.Millisecond))
	decide(e, now.Add(-10*time.Millisecond), lm, "y", 1)
	f.serve(0, now.Add(-10*time.Millisecond)) // a read: the mark learnt
	waited := 0
	for range 40 { // 200/s: seen often
		now = now.Add(5 * time.Millisecond)
		d, w := decide(e, now, lm, key, 1)
		f.serve(0, now)
		if w != nil {
			waited++
			d = w.Decision()
		}
		if !d.Allowed || d.Reason == ReasonAsync {
			t.Fatalf("%s, low, at +%v: %+v, want admitted by Redis (a grant)", key, now.Sub(t0), d)
		}
	}
	if waited == 0 {
		t.Error("no request of the low key waited for Redis: the test tests nothing")
	}
}

// TestWindowedOverKeyGrantAhead: a key over its limit (the fleet's mark), marked low,
// that this server sees seldom, is refused and asks a grant of one ahead, with the next
// report; each grant then serves one request, which asks the next (an over key's
// requests never pass unasked). Once its window is known spent (the fleet's mark), the
// grant it holds still serves a request, which asks none: Redis's count stays, and the
// next request is refused until the window ends.
func TestWindowedOverKeyGrantAhead(t *testing.T) {
	f := newWinFleet(t, 2, nil) // burst 10, windows of 1 s
	f.warm()
	e, lm := f.es[0], f.lms[0]
	now := t0.Add(2 * time.Second)
	key, win, end := f.roomy("over", now, 950*time.Millisecond)
	f.mark(key, win, wire.MarkLow|wire.MarkOver, now.Add(-300*time.Millisecond))
	if _, w := decide(e, now.Add(-10*time.Millisecond), lm, "y", 1); w == nil { // stale marks: y asks
		t.Fatal("y did not ask with stale marks")
	}
	f.serve(0, now.Add(-10*time.Millisecond)) // a read: the marks learnt
	step := func(ms int, want Decision) {
		t.Helper()
		at := now.Add(time.Duration(ms) * time.Millisecond)
		want.Servers = 2
		if d, w := decide(e, at, lm, key, 1); w != nil || d != want {
			t.Fatalf("+%dms: %+v (waits %v), want %+v", ms, d, w != nil, want)
		}
	}
	lease := Decision{Allowed: true, Source: SourceLease, Reason: ReasonLease}
	// refused for a refill (Burst/Rate over Burst), asking a grant with the next report
	step(0, Decision{Source: SourceLease, Reason: ReasonPaced, RetryAfter: 100 * time.Millisecond})
	f.serve(0, now.Add(100*time.Millisecond))
	step(200, lease)
	f.serve(0, now.Add(300*time.Millisecond))
	step(400, lease)
	f.serve(0, now.Add(500*time.Millisecond))
	if got := f.count(key, now); got != 3 {
		t.Fatalf("count %d, want the three grants asked", got)
	}
	f.mark(key, win, wire.MarkLow|wire.MarkSpent|wire.MarkOver, now.Add(550*time.Millisecond))
	decide(e, now.Add(690*time.Millisecond), lm, "y", 1)
	f.serve(0, now.Add(700*time.Millisecond)) // a read: the window known spent
	step(750, lease)
	f.serve(0, now.Add(850*time.Millisecond))
	if got := f.count(key, now); got != 3 {
		t.Errorf("count %d once the window is known spent, want 3: a key known spent asks no grant", got)
	}
	at := now.Add(900 * time.Millisecond)
	step(900, Decision{Source: SourceLease, Reason: ReasonPaced, RetryAfter: end.Sub(at)})
}

// TestWindowedOverKeyGrantUrgent: a key over its limit, seen often and holding no grant,
// is refused while its grant comes; the grant goes at once where windows are short
// against reports (under four report intervals), so that the next request finds it,
// else with the next report.
func TestWindowedOverKeyGrantUrgent(t *testing.T) {
	for _, tc := range []struct {
		report time.Duration
		atOnce bool
	}{
		{300 * time.Millisecond, true},  // windows of 1 s < 4 × 300 ms
		{100 * time.Millisecond, false}, // windows of 1 s ≥ 4 × 100 ms
	} {
		t.Run(tc.report.String(), func(t *testing.T) {
			f := newWinFleet(t, 2, func(c *LimitConfig) { c.Windowed = tc.report })
			now := t0.Add(60 * time.Millisecond)
			key, win, _ := f.roomy("over", now, 800*time.Millisecond)
			f.mark(key, win, wire.MarkOver, t0)
			f.warm() // its reads learn the mark
			e, lm := f.es[0], f.lms[0]
			refused := Decision{Source: SourceLease, Reason: ReasonPaced, RetryAfter: 100 * time.Millisecond, Servers: 2}
			if d, w := decide(e, now, lm, key, 1); w != nil || d != refused {
				t.Fatalf("%s, over: %+v (waits %v), want %+v", key, d, w != nil, refused)
			}
			f.serve(0, now) // no report due: only what goes at once
			d, w := decide(e, now, lm, key, 1)
			if w != nil || d.Allowed != tc.atOnce || tc.atOnce && d.Reason != ReasonLease {
				t.Fatalf("the next request at once: %+v (waits %v), want admitted from its grant %v", d, w != nil, tc.atOnce)
			}
			next := now.Add(2 * tc.report)
			f.serve(0, next) // the next report has gone
			if d, w := decide(e, next, lm, key, 1); w != nil || d.Reason != ReasonLease {
				t.Fatalf("after the next report: %+v (waits %v), want admitted from its grant", d, w != nil)
			}
		})
	}
}

// TestWindowedOverKeySeldomAllowance: a key over its limit that this server sees seldom
// is admitted without asking at odds (here 1: burst over S times this server's rate is
// above 1), but no more of it unanswered than its allowance, c = 5 of a burst of 10 over
// 2 servers: the sixth request at once is refused, for a refill.
func TestWindowedOverKeySeldomAllowance(t *testing.T) {
	f, e, lm := warmPair(t)
	now := t0.Add(2 * time.Second)
	key, win, _ := f.roomy("over", now, 500*time.Millisecond)
	f.mark(key, win-1, wire.MarkOver, now.Add(-time.Second)) // over since its last window
	decide(e, now.Add(-10*time.Millisecond), lm, "y", 1)
	f.serve(0, now.Add(-10*time.Millisecond)) // a read: the mark learnt
	for i := range 6 {
		want := Decision{Allowed: true, Source: SourceLease, Reason: ReasonAsync, Servers: 2}
		if i == 5 {
			want = Decision{Source: SourceLease, Reason: ReasonPaced, RetryAfter: 100 * time.Millisecond, Servers: 2}
		}
		if d, w := decide(e, now, lm, key, 1); w != nil || d != want {
			t.Fatalf("request %d at once: %+v (waits %v), want %+v", i+1, d, w != nil, want)
		}
	}
	lm.keys.Peek(key, func(en *entry, _ int64) {
		if at(now) >= en.win.over || en.win.often {
			t.Errorf("%s over %v, often %v: want over, seen seldom", key, at(now) < en.win.over, en.win.often)
		}
	})
}

// TestWindowedOverKeyOdds: a server admits each of many over keys it sees seldom, once
// each, at odds of burst over S times its rate (S = 8 here, the fleet's count of their
// requests not known yet): about that share of them, over 300 keys. The draws are a hash
// of the limit's seed, the key and the instant, so the count is the same on every run;
// the bounds, a quarter either way, are over three standard deviations of such a count.
func TestWindowedOverKeyOdds(t *testing.T) {
	const servers, keys = 8, 300
	f := newWinFleet(t, servers, nil) // burst 10, windows of 1 s, c = 2
	f.warm()
	e, lm := f.es[0], f.lms[0]
	wl := lm.windowed()
	now := t0.Add(320 * time.Millisecond)
	for i := range keys {
		key := "o" + strconv.Itoa(i)
		f.mark(key, wire.WindowIndex(now.UnixMicro(), wire.WindowPhase(key, wl.wUs), wl.wUs)-1, wire.MarkOver, t0.Add(60*time.Millisecond))
	}
	decide(e, now.Add(-10*time.Millisecond), lm, "y", 1)
	f.serve(0, now.Add(-10*time.Millisecond)) // a read: the marks learnt
	admitted := 0
	var perSec float64
	for i := range keys {
		key := "o" + strconv.Itoa(i)
		d, w := decide(e, now, lm, key, 1)
		if w != nil || d.Allowed && d.Reason != ReasonAsync || !d.Allowed && d.Reason != ReasonPaced {
			t.Fatalf("%s: %+v (waits %v), want admitted without asking or refused", key, d, w != nil)
		}
		if d.Allowed {
			admitted++
		}
		var over, often bool
		lm.keys.Peek(key, func(en *entry, _ int64) {
			over, often = at(now) < en.win.over, en.win.often
			perSec = en.win.perSec // the same for each: its first request at the same age
		})
		if !over || often {
			t.Fatalf("%s over %v, often %v: want over, seen seldom", key, over, often)
		}
	}
	p := 10 / (servers * perSec * 1) // burst / (S · rate · window)
	if p < 0.2 || p > 0.5 {
		t.Fatalf("odds %.3f: the test wants them well within (0, 1/2]", p)
	}
	t.Logf("admitted %d of %d at odds %.3f", admitted, keys, p)
	if want := p * keys; float64(admitted) < 0.75*want || float64(admitted) > 1.25*want {
		t.Errorf("admitted %d of %d over keys, want about %.0f (odds %.3f)", admitted, keys, want, p)
	}
}

// TestWindowedOverKeyDemand: a server counts an over key's requests for odds at their
// own weight while its own rate says the fleet sees few, whatever a count of the key's
// demand from a flood says (the lower of the two is taken): the demand row grows by one
// a request.
func TestWindowedOverKeyDemand(t *testing.T) {
	f, e, lm := warmPair(t)
	now := t0.Add(2 * time.Second)
	key, win, _ := f.roomy("over", now, 500*time.Millisecond)
	f.mark(key, win-1, wire.MarkOver, now.Add(-time.Second))
	f.add(key, win, 10000, true) // a flood's requests, counted for odds
	decide(e, now.Add(-10*time.Millisecond), lm, "y", 1)
	f.serve(0, now.Add(-10*time.Millisecond)) // a read: the mark learnt
	for i := range 3 {
		at := now.Add(time.Duration(i) * 150 * time.Millisecond)
		decide(e, at, lm, key, 1)
		f.serve(0, at.Add(100*time.Millisecond)) // its demand counted, and answered
	}
	if got := f.add(key, win, 0, true); got != 10003 {
		t.Errorf("the demand row counts %d, want the flood's 10000 and the 3 requests", got)
	}
	lm.keys.Peek(key, func(en *entry, _ int64) {
		if en.win.dem < 10001 || en.win.often {
			t.Errorf("the key's demand as answered %d, often %v: want the flood's, seen seldom", en.win.dem, en.win.often)
		}
	})
}

// TestWindowAskGrant: the grant a key seen often asks is what its rate wants in the next
// two report intervals of its window, less three standard deviations, less what it
// holds: at least the request's cost, at most the burst. Within two report intervals of
// the window's end it asks, with it, a grant of the next window sized for that window's
// first two intervals (at most the burst), but not where the rate wants none there.
// Here windows of 1 s, reports every 100 ms, a burst of 1000.
func TestWindowAskGrant(t *testing.T) {
	f := newWinFleet(t, 1, func(c *LimitConfig) { c.Rate, c.Burst = 1000, 1000 })
	wl := f.lms[0].windowed()
	type ask struct {
		win int64 // 0: the key's window, 1: the next
		n   int
	}
	for _, tc := range []struct {
		name   string
		left   time.Duration // to the window's end
		perSec float64
		grants int
		want   []ask
	}{
		// 1000/s over 200 ms: 200 - 3·√200 = 157.6
		{"mid-window", 500 * time.Millisecond, 1000, 0, []ask{{0, 158}}},
		{"less what it holds", 500 * time.Millisecond, 1000, 50, []ask{{0, 108}}},
		{"at least its cost", 500 * time.Millisecond, 1000, 300, []ask{{0, 1}}},
		{"at most the burst", 500 * time.Millisecond, 1e5, 0, []ask{{0, 1000}}},
		{"just past two intervals from the end", 2*100*time.Millisecond + time.Microsecond, 1000, 0, []ask{{0, 158}}},
		// 1000/s over the 150 ms left: 150 - 3·√150 = 113.3; the next window's first 200 ms
		{"within two intervals of the end", 150 * time.Millisecond, 1000, 0, []ask{{0, 114}, {1, 158}}},
		{"within one", 50 * time.Millisecond, 1000, 0, []ask{{0, 29}, {1, 158}}},
		{"the next window's at most the burst", 150 * time.Millisecond, 1e5, 0, []ask{{0, 1000}, {1, 1000}}},
		{"none of the next window at 10/s", 150 * time.Millisecond, 10, 0, []ask{{0, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wl.mu.Lock()
			defer wl.mu.Unlock()
			wl.ops = nil
			st := &wkey{init: true, phase: wire.WindowPhase("k", wl.wUs), grants: tc.grants}
			st.setWin(wire.WindowIndex(t0.UnixMicro(), st.phase, wl.wUs), wl.wUs)
			now := wl.end(st.win, st.phase).Add(-tc.left)
			wl.askGrant(st, "k", 1, tc.perSec, true, now)
			var got []ask
			for _, op := range wl.ops {
				if !op.grant || op.id != "k" || op.nextWin != (op.win == st.win+1) {
					t.Fatalf("queued %+v", op)
				}
				got = append(got, ask{op.win - st.win, op.n})
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("asked %v, want %v", got, tc.want)
			}
		})
	}
}

// TestWindowOdds: the odds of admitting a request of an over key this server sees
// seldom are burst over the fleet's count of the key's requests a window, from the count
// answered in its window or the one before, over the part of a window that count
// covers (from the start of the count's window, at most one, at least a quarter);
// otherwise burst over S times this server's rate. At most 1. Here a burst of 10, windows
// of 1 s, 2 servers; at 4/s, S times this server's rate would give 1.
func TestWindowOdds(t *testing.T) {
	f := newWinFleet(t, 2, nil)
	wl := f.lms[0].windowed()
	const win = 1000
	start := func(w int64) instant { return wl.endAt(w-1, 0) } // a window's start, phase 0
	for _, tc := range []struct {
		name   string
		demWin int64
		dem    int
		demAt  time.Duration // after the start of demWin
		perSec float64
		want   float64
	}{
		{"no count: S times its rate", 0, 0, 0, 10, 0.5},
		{"no count, above 1", 0, 0, 0, 4, 1},
		{"a count of the window, half of it", win, 40, 500 * time.Millisecond, 4, 10 * 0.5 / 40},
		{"a count of the window, a quarter of it", win, 40, 250 * time.Millisecond, 4, 10 * 0.25 / 40},
		{"a count of under a quarter", win, 40, 249 * time.Millisecond, 10, 0.5},
		{"a count of the window before, answered in this one", win - 1, 40, 1500 * time.Millisecond, 4, 10.0 / 40},
		{"a count of two windows before", win - 2, 40, 500 * time.Millisecond, 10, 0.5},
		{"a count below the burst", win, 5, 500 * time.Millisecond, 10, 1},
	} {
		st := &wkey{win: win, demWin: tc.demWin, dem: tc.dem, demAt: start(tc.demWin) + instant(tc.demAt)}
		if got := wl.odds(st, tc.perSec, t0); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: odds %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestWindowJoin: a request that waits for its key's grant asked ahead makes that grant
// go at once (it was to go with the next report), and a trip due; with no grant asked,
// it asks one now, sized for itself and the key's rate.
func TestWindowJoin(t *testing.T) {
	f := newWinFleet(t, 1, nil)
	wl := f.lms[0].windowed()
	wl.mu.Lock()
	defer wl.mu.Unlock()
	st := &wkey{init: true}
	st.setWin(wire.WindowIndex(t0.UnixMicro(), 0, wl.wUs), wl.wUs)
	wl.ask(st, "k", 3)
	wl.due.Store(false)
	ahead := st.ask
	w := &Waiter{n: 1}
	wl.join(st, "k", w, t0)
	if st.ask != ahead || !ahead.now || len(ahead.waiters) != 1 || ahead.waiters[0] != w || !wl.due.Load() || len(wl.ops) != 1 {
		t.Errorf("joined the grant asked ahead: now %v, waiters %d, a trip due %v, %d ops; want it to go at once with the request, one op",
			ahead.now, len(ahead.waiters), wl.due.Load(), len(wl.ops))
	}
	st2 := &wkey{init: true}
	st2.setWin(st.win, wl.wUs)
	w2 := &Waiter{n: 2}
	wl.join(st2, "k2", w2, t0)
	if op := wl.ops[len(wl.ops)-1]; st2.ask == nil || !st2.ask.now || op.ask != st2.ask || op.w != w2 || op.n != 2 || !op.grant {
		t.Errorf("no grant asked ahead: %+v, want a grant of 2 asked now for the request", op)
	}
}

// TestWindowedCountsAfterStopStayCounts: Stop takes the grants out of the queue, which
// moves the ops after them; a count a trip out at the time carried, put back when that
// trip fails, is then queued as a count of admissions again, never joined to the key's
// count of requests for odds (its demand row) that took its place in the queue.
func TestWindowedCountsAfterStopStayCounts(t *testing.T) {
	f := newWinFleet(t, 1, nil)
	wl := f.lms[0].windowed()
	wl.mu.Lock()
	wl.queue(wop{id: "g", win: 7, n: 2, grant: true}) // another key's grant asked ahead
	wl.count("a", 7, 1)
	wl.countDemand(&wkey{win: 7}, "a", 1, 0, t0)
	wl.mu.Unlock()
	wl.stop(nil)
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.unsent(wop{id: "a", win: 7, n: 2}, nil, 7, storeerr.ErrUnavailable, nil) // the failed trip's count
	adm, dem := 0, 0
	for _, op := range wl.ops {
		switch {
		case op.id == "a" && op.demand:
			dem += op.n
		case op.id == "a" && op.admits():
			adm += op.n
		default:
			t.Errorf("queued %+v", op)
		}
	}
	if adm != 3 || dem != 1 {
		t.Errorf("queued %d admissions and %d requests for odds of a, want 3 and 1", adm, dem)
	}
}

// TestWindowedOftenFromOnceAReportInterval: a key is seen often from one request a
// report interval on, that rate included: with the server's count of every key complete
// (it has run for countedAfter decay times of 4 s), 40 requests at one instant are 10/s,
// one per interval of 100 ms. With one server (c = 1000 of a burst of 1000) the first 39
// are admitted without asking; the 40th, seen often with admissions unanswered, waits for
// a grant.
func TestWindowedOftenFromOnceAReportInterval(t *testing.T) {
	f := newWinFleet(t, 1, func(c *LimitConfig) { c.Rate, c.Burst = 1000, 1000 })
	f.warm()
	e, lm := f.es[0], f.lms[0]
	now := t0.Add(countedAfter*decayTime(time.Second) + time.Minute)
	decide(e, now.Add(-10*time.Millisecond), lm, "y", 1)
	f.serve(0, now.Add(-10*time.Millisecond)) // fresh marks
	key, _, _ := f.roomy("k", now, 100*time.Millisecond)
	for i := 1; i <= 40; i++ {
		d, w := decide(e, now, lm, key, 1)
		if i < 40 && (w != nil || d.Reason != ReasonAsync) || i == 40 && w == nil {
			t.Fatalf("request %d at once: %+v (waits %v), want admitted without asking up to the 39th", i, d, w != nil)
		}
	}
}

// TestWindowedAtTheWindowsEnd: a key's state changes with its window at the instant the
// window ends, on Redis's clock, and not before: a grant of the window serves a request
// a nanosecond before its end but not at it, and a key marked low until its window ends
// is low a nanosecond before the end but not at it.
func TestWindowedAtTheWindowsEnd(t *testing.T) {
	for _, tc := range []struct {
		name   string
		low    bool          // marked low, else holding a grant
		before time.Duration // before the window's end
		want   Reason        // 0: it waits for Redis
	}{
		{"a grant, just before the end", false, 1, ReasonLease},
		{"a grant, at the end", false, 0, 0},
		{"low, just before the end", true, 1, 0},
		{"low, at the end", true, 0, ReasonAsync},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWinFleet(t, 1, nil)
			e, lm := f.es[0], f.lms[0]
			var key string
			var win int64
			var end time.Time
			if !tc.low {
				// a server not warm, whose request gave up: its grant held by the key
				f.serve(0, t0)
				key, _, end = f.roomy("g", t0, 100*time.Millisecond)
				_, w := decide(e, t0, lm, key, 1)
				if w == nil {
					t.Fatal("a request before the server is warm did not wait")
				}
				e.GiveUp(t0, w, ReasonTimeout)
				f.serve(0, t0)
			} else {
				// the fleet's mark, read 100 ms before the window ends
				f.warm()
				now := t0.Add(2 * time.Second)
				for i := 0; key == "" || end.Sub(now) > 150*time.Millisecond; i++ {
					key, win, end = f.roomy("low"+strconv.Itoa(i)+"-", now, 100*time.Millisecond)
				}
				f.mark(key, win, wire.MarkLow, now)
				decide(e, end.Add(-100*time.Millisecond), lm, "y", 1)
				f.serve(0, end.Add(-100*time.Millisecond))
			}
			d, w := decide(e, end.Add(-tc.before), lm, key, 1)
			if tc.want == 0 && w == nil || tc.want != 0 && (w != nil || d.Reason != tc.want) {
				t.Errorf("%+v (waits %v), want reason %v (0: waits for Redis)", d, w != nil, tc.want)
			}
		})
	}
}

// TestWindowedReadsWhileAdmittingUnasked: a server that admitted without asking since
// its last read keeps its marks fresh with a trip of its own for the read, once it is
// due, though it has nothing else to send: 500 ms after its last read of the warm-up, a
// new key is still admitted without asking.
func TestWindowedReadsWhileAdmittingUnasked(t *testing.T) {
	f, e, lm := warmPair(t)
	wl := lm.windowed()
	wl.mu.Lock()
	last := wl.lastRead[wire.WindowMarksShard("b", wl.shards)]
	wl.mu.Unlock()
	if d, w := decide(e, last.Add(10*time.Millisecond), lm, "a", 1); w != nil || d.Reason != ReasonAsync {
		t.Fatalf("a: %+v (waits %v), want admitted without asking", d, w != nil)
	}
	f.serve(0, last.Add(110*time.Millisecond)) // the report, before a read is due
	f.serve(0, last.Add(210*time.Millisecond))
	before := f.trips
	f.serve(0, last.Add(300*time.Millisecond)) // a read due, nothing else to send
	if f.trips != before+1 {
		t.Errorf("%d trips once a read was due, want 1", f.trips-before)
	}
	if d, w := decide(e, last.Add(520*time.Millisecond), lm, "b", 1); w != nil || d.Reason != ReasonAsync {
		t.Errorf("b, 520 ms after the warm-up's read: %+v (waits %v), want admitted without asking", d, w != nil)
	}
}

// TestWindowedLastGrantWithoutTheLimitLock: a key this server sees seldom, served from
// its last grant with nothing to ask, is decided under its own lock alone, as one with
// grants to spare is (TestWindowedGrantsWithoutTheLimitLock): here a server not warm,
// whose request gave up and gave its grant of one back to the key.
func TestWindowedLastGrantWithoutTheLimitLock(t *testing.T) {
	f := newWinFleet(t, 1, nil)
	e, lm := f.es[0], f.lms[0]
	f.serve(0, t0)
	_, w := decide(e, t0, lm, "k", 1)
	if w == nil {
		t.Fatal("a request before the server is warm did not wait")
	}
	e.GiveUp(t0, w, ReasonTimeout)
	f.serve(0, t0)
	grants := func() (n int) {
		lm.keys.Peek("k", func(en *entry, _ int64) { n = en.win.grants })
		return n
	}
	if n := grants(); n != 1 {
		t.Fatalf("the key holds %d grants, want the one given back", n)
	}
	wl := lm.windowed()
	wl.mu.Lock()
	done := make(chan Decision, 1)
	go func() {
		d, _ := decide(e, t0.Add(time.Millisecond), lm, "k", 1)
		done <- d
	}()
	select {
	case d := <-done:
		wl.mu.Unlock()
		if !d.Allowed || d.Reason != ReasonLease {
			t.Fatalf("decided %+v, want admitted from the key's grant", d)
		}
	case <-time.After(10 * time.Second):
		wl.mu.Unlock()
		t.Fatal("a key served from its last grant waited for the limit's lock")
	}
	if n := grants(); n != 0 {
		t.Errorf("the key holds %d grants after the decision, want 0", n)
	}
}

// warmPair is a warm fleet of two servers, with its first server's engine and limit.
func warmPair(t *testing.T) (*winFleet, *Engine, *Limit) {
	t.Helper()
	f := newWinFleet(t, 2, nil)
	f.warm()
	return f, f.es[0], f.lms[0]
}
