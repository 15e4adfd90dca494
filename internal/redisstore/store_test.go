package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// lname is a limit name unique to the test, short enough for MaxNameLen.
func lname(t testing.TB) string {
	u := redistest.Unique(t)
	return "t-" + u[strings.LastIndexByte(u, '-')+1:]
}

func newStore(t testing.TB, c redis.Scripter, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// TestNewRefusesNilClient: a nil client, untyped or a nil *redis.Client (or cluster,
// or ring) in the interface, is an invalid configuration, not a panic.
func TestNewRefusesNilClient(t *testing.T) {
	var c *redis.Client
	var cc *redis.ClusterClient
	var r *redis.Ring
	for _, client := range []redis.Scripter{nil, c, cc, r} {
		if _, err := redisstore.New(client); !errors.Is(err, storeerr.ErrInvalidConfig) {
			t.Errorf("New(%T(nil)) = %v, want ErrInvalidConfig", client, err)
		}
	}
}

func TestNewRefusesRetryingClient(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client redis.Scripter
		want   string // "" = accepted
	}{
		{"default client", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "Options.MaxRetries = 3"},
		{"MaxRetries 1", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: 1}), "Options.MaxRetries = 1"},
		{"MaxRetries -1", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}), ""},
		{"Configure", func() redis.Scripter {
			o := &redis.Options{Addr: "127.0.0.1:1"}
			global.Configure(o)
			return redis.NewClient(o)
		}(), ""},
		{"default cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), "ClusterOptions.MaxRedirects = 3"},
		{"cluster node retries", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, MaxRedirects: -1, MaxRetries: 2}), "ClusterOptions.MaxRetries = 2"},
		{"ConfigureCluster", func() redis.Scripter {
			o := &redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}
			global.ConfigureCluster(o)
			return redis.NewClusterClient(o)
		}(), ""},
		{"universal single", func() redis.Scripter {
			o := &redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}}
			global.ConfigureUniversal(o)
			return redis.NewUniversalClient(o)
		}(), ""},
		{"universal cluster", func() redis.Scripter {
			o := &redis.UniversalOptions{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}
			global.ConfigureUniversal(o)
			return redis.NewUniversalClient(o)
		}(), ""},
		{"default ring", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}}), "RingOptions.MaxRetries = 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer tc.client.(interface{ Close() error }).Close()
			_, err := redisstore.New(tc.client)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if !errors.Is(err, storeerr.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), "-1") || !strings.Contains(err.Error(), "RetryingClient") {
				t.Fatalf("New = %v, want ErrInvalidConfig naming %q and how to fix it", err, tc.want)
			}
			// Accepted when the caller says so; AllowN is then refused, takes work.
			s, err := redisstore.New(tc.client, redisstore.RetryingClient())
			if err != nil {
				t.Fatalf("New with RetryingClient: %v", err)
			}
			_, err = s.AllowN(context.Background(), redisstore.Limit{Name: "a", Rate: 1, Burst: 1}, "k", 1)
			if !errors.Is(err, storeerr.ErrInvalidConfig) {
				t.Fatalf("AllowN on a retrying client = %v, want ErrInvalidConfig", err)
			}
		})
	}
	if _, err := redisstore.New(nil); !errors.Is(err, storeerr.ErrInvalidConfig) {
		t.Fatalf("New(nil) = %v", err)
	}
	_, c := redistest.Mini(t)
	for _, id := range []string{"", "has space", strings.Repeat("i", 65)} {
		if _, err := redisstore.New(c, redisstore.ServerID(id)); !errors.Is(err, storeerr.ErrInvalidConfig) {
			t.Errorf("ServerID(%q) = %v, want ErrInvalidConfig", id, err)
		}
	}
	if s := newStore(t, c, redisstore.ServerID("web-17")); s.ServerID() != "web-17" {
		t.Errorf("ServerID() = %q", s.ServerID())
	}
	if a, b := newStore(t, c), newStore(t, c); a.ServerID() == b.ServerID() || a.ServerID() == "" {
		t.Errorf("default server ids %q, %q: want distinct", a.ServerID(), b.ServerID())
	}
}

// TestAllowN: the seed's behaviour through the Store, with the Result's durations.
func TestAllowN(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		if tg.Mini != nil {
			tg.Mini.SetTime(t0)
		}
		s := newStore(t, tg.Client)
		// The article's example: capacity 100, rate 10: allowed, 99 left, full in 100 ms.
		lim := redisstore.Limit{Name: lname(t), Rate: 10, Burst: 100}
		r, err := s.AllowN(ctx, lim, "alice", 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := (redisstore.Result{Allowed: true, Remaining: 99, ResetAfter: 100 * time.Millisecond}); r != want {
			t.Fatalf("first AllowN = %+v, want %+v", r, want)
		}
		pttl, _ := tg.Client.PTTL(ctx, s.Key(lim.Name, "alice")).Result()
		if pttl > 11*time.Second || pttl < 10*time.Second {
			t.Fatalf("PTTL = %v, want 11s", pttl)
		}
		// A slow bucket so a real Redis's clock cannot change the answers: rate 1e-3/s.
		slow := redisstore.Limit{Name: lname(t), Rate: 1e-3, Burst: 3}
		steps := []struct {
			n       int
			allowed bool
			left    float64
			retry   time.Duration
		}{
			{2, true, 1, 0},
			{2, false, 1, 1000 * time.Second}, // 1 token short at 1e-3/s
			{1, true, 0, 0},
			{1, false, 0, 1000 * time.Second},
		}
		for i, st := range steps {
			r, err := s.AllowN(ctx, slow, "bob", st.n)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed != st.allowed || !near(r.Remaining, st.left, 1e-3) ||
				!near(r.RetryAfter.Seconds(), st.retry.Seconds(), 2) {
				t.Fatalf("step %d: AllowN(%d) = %+v, want allowed %v, %v left, retry %v", i, st.n, r, st.allowed, st.left, st.retry)
			}
			if want := (3 - r.Remaining) / 1e-3; !near(r.ResetAfter.Seconds(), want, 1) {
				t.Fatalf("step %d: ResetAfter %v, want %vs", i, r.ResetAfter, want)
			}
		}
		// Invalid input never reaches Redis.
		for _, bad := range []struct {
			lim redisstore.Limit
			n   int
		}{{slow, 0}, {slow, 4}, {redisstore.Limit{Name: "x", Rate: 0, Burst: 1}, 1}} {
			if _, err := s.AllowN(ctx, bad.lim, "bob", bad.n); !errors.Is(err, storeerr.ErrInvalidLimit) {
				t.Errorf("AllowN(%+v, %d) = %v, want ErrInvalidLimit", bad.lim, bad.n, err)
			}
		}
	})
}

func TestTakeAndRefund(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-3, Burst: 10}
		steps := []struct {
			want, min int
			granted   int
			left      float64
			wait      time.Duration
		}{
			{4, 1, 4, 6, 0},
			{8, 2, 6, 0, 0},
			{3, 2, 0, 0, 2000 * time.Second},
		}
		for i, st := range steps {
			g, err := s.Take(ctx, lim, "k", st.want, st.min)
			if err != nil {
				t.Fatal(err)
			}
			if g.Granted != st.granted || !near(g.Remaining, st.left, 1e-2) || !near(g.Wait.Seconds(), st.wait.Seconds(), 5) {
				t.Fatalf("step %d: Take(%d, %d) = %+v, want %d granted, %v left, wait %v", i, st.want, st.min, g, st.granted, st.left, st.wait)
			}
			if d := time.Since(g.Now); tg.Real() && (d > time.Minute || d < -time.Minute) {
				t.Fatalf("step %d: Now = %v, want Redis's clock", i, g.Now)
			}
		}
		if err := s.Refund(ctx, lim, "k", 7); err != nil {
			t.Fatal(err)
		}
		if err := s.Refund(ctx, lim, "k", 0); err != nil {
			t.Fatal(err)
		}
		g, err := s.Take(ctx, lim, "k", 10, 1)
		if err != nil || g.Granted != 7 {
			t.Fatalf("after refund 7: %+v %v, want 7 granted", g, err)
		}
		if err := s.Refund(ctx, lim, "k", 10); err != nil {
			t.Fatal(err)
		}
		if err := s.Refund(ctx, lim, "k", 10); err != nil {
			t.Fatal(err)
		}
		if g, _ := s.Take(ctx, lim, "k", 10, 10); g.Granted != 10 || !near(g.Remaining, 0, 1e-2) {
			t.Fatalf("refunds must cap at burst: %+v", g)
		}
		for _, bad := range []struct{ want, min int }{{0, 0}, {11, 1}, {3, 0}, {3, 4}} {
			if _, err := s.Take(ctx, lim, "k", bad.want, bad.min); !errors.Is(err, storeerr.ErrInvalidLimit) {
				t.Errorf("Take(%d, %d) = %v, want ErrInvalidLimit", bad.want, bad.min, err)
			}
		}
		for _, n := range []int{-redisstore.MaxDebt - 1, 11} {
			if err := s.Refund(ctx, lim, "k", n); !errors.Is(err, storeerr.ErrInvalidLimit) {
				t.Errorf("Refund(%d) = %v, want ErrInvalidLimit", n, err)
			}
		}
		for _, floor := range []int{-1, 11} {
			r := redisstore.TakeRequest{Limit: lim, Key: "k", Want: 1, Min: 1, Floor: floor}
			if _, err := s.TakeOne(ctx, r); !errors.Is(err, storeerr.ErrInvalidLimit) {
				t.Errorf("TakeOne(floor %d) = %v, want ErrInvalidLimit", floor, err)
			}
		}
		if err := s.Reset(ctx, lim, "k"); err != nil {
			t.Fatal(err)
		}
		if g, _ := s.Take(ctx, lim, "k", 10, 10); g.Granted != 10 {
			t.Fatalf("after Reset: %+v, want a full bucket", g)
		}
	})
}

// TestTakeWait checks Wait against miniredis's clock: rate 2/s, need 1 token.
func TestTakeWait(t *testing.T) {
	m, c := redistest.Mini(t)
	m.SetTime(t0)
	s := newStore(t, c)
	lim := redisstore.Limit{Name: "w", Rate: 2, Burst: 4}
	if g, _ := s.Take(context.Background(), lim, "k", 4, 4); g.Granted != 4 || !g.Now.Equal(t0) {
		t.Fatalf("%+v", g)
	}
	m.SetTime(t0.Add(100 * time.Millisecond))
	g, err := s.Take(context.Background(), lim, "k", 2, 1)
	if err != nil || g.Granted != 0 || g.Wait != 400*time.Millisecond || !near(g.Remaining, 0.2, 1e-9) {
		t.Fatalf("Take = %+v, %v; want 0 granted, wait 400ms, 0.2 left", g, err)
	}
}

func TestTakeBatch(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-3, Burst: 10}
		reqs := []redisstore.TakeRequest{
			{Limit: lim, Key: "a", Want: 4, Min: 1},
			{Limit: lim, Key: "b", Want: 10, Min: 10},
			{Limit: lim, Key: "a", Want: 10, Min: 1}, // same bucket: 6 left after the first
			{Limit: redisstore.Limit{Name: "", Rate: 1, Burst: 1}, Key: "x", Want: 1, Min: 1},
			{Limit: lim, Key: "a", Want: 1, Min: 1}, // empty now
		}
		out := make([]redisstore.TakeResult, len(reqs))
		err := s.TakeBatch(ctx, reqs, out)
		if !errors.Is(err, storeerr.ErrInvalidLimit) {
			t.Fatalf("TakeBatch error = %v, want the invalid item's error", err)
		}
		want := []int{4, 10, 6, -1, 0}
		for i, w := range want {
			if w < 0 {
				if !errors.Is(out[i].Err, storeerr.ErrInvalidLimit) {
					t.Errorf("item %d: %v, want ErrInvalidLimit", i, out[i].Err)
				}
				continue
			}
			if out[i].Err != nil || out[i].Granted != w {
				t.Errorf("item %d: %+v, want %d granted", i, out[i], w)
			}
		}
		if out[4].Wait < 900*time.Second {
			t.Errorf("empty bucket: Wait %v, want about 1000s", out[4].Wait)
		}
		if err := s.TakeBatch(ctx, reqs, out[:2]); !errors.Is(err, storeerr.ErrInvalidConfig) {
			t.Errorf("short out: %v, want ErrInvalidConfig", err)
		}
		if err := s.TakeBatch(ctx, nil, nil); err != nil {
			t.Errorf("empty batch: %v", err)
		}
	})
}

// countingHook counts the commands each pipeline sends, by name.
type countingHook struct {
	mu        sync.Mutex
	pipelines [][]string
	dropOdd   atomic.Bool // answer NOSCRIPT for odd positions without sending them
}

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}

func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		if countOf(names, "eval")+countOf(names, "evalsha") > 0 { // not the connection handshake
			h.mu.Lock()
			h.pipelines = append(h.pipelines, names)
			h.mu.Unlock()
		}
		if h.dropOdd.CompareAndSwap(true, false) {
			// Simulate a cluster where some nodes lost their script cache: the odd
			// commands never reach Redis and answer NOSCRIPT.
			var send []redis.Cmder
			for i, c := range cmds {
				if i%2 == 1 {
					c.SetErr(redis.ErrNoScript)
				} else {
					send = append(send, c)
				}
			}
			return next(ctx, send)
		}
		return next(ctx, cmds)
	}
}

// TestNoScript: an empty script cache (a restarted or failed-over Redis) costs no error,
// for single calls and in pipelines, and only the failed commands are re-sent.
// checkBatchNoScript runs batch three times on a client watched by hook and checks its
// round trips: after SCRIPT FLUSH, 6 EVALSHA then the same n re-sent as EVAL (afterFlush
// then checks the answers); with a warm cache, one round trip; with half the items
// answered NOSCRIPT by the hook, only those re-sent as EVAL.
func checkBatchNoScript(t *testing.T, c *redis.Client, hook *countingHook, name string, n int, batch func() error, afterFlush func()) {
	t.Helper()
	if err := c.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	hook.pipelines = nil
	if err := batch(); err != nil {
		t.Fatalf("%s after SCRIPT FLUSH: %v", name, err)
	}
	afterFlush()
	if len(hook.pipelines) != 2 || countOf(hook.pipelines[0], "evalsha") != n || countOf(hook.pipelines[1], "eval") != n {
		t.Fatalf("pipelines %v, want %d EVALSHA then %d EVAL", hook.pipelines, n, n)
	}
	// Warm cache: one round trip.
	hook.pipelines = nil
	if err := batch(); err != nil || len(hook.pipelines) != 1 {
		t.Fatalf("warm %s: %v, %d pipelines", name, err, len(hook.pipelines))
	}
	// Partial NOSCRIPT: only the failed half is re-sent, and each item runs once.
	hook.pipelines = nil
	hook.dropOdd.Store(true)
	if err := batch(); err != nil {
		t.Fatal(err)
	}
	if len(hook.pipelines) != 2 || len(hook.pipelines[1]) != n/2 || countOf(hook.pipelines[1], "eval") != n/2 {
		t.Fatalf("pipelines %v, want the %d failed items re-sent as EVAL", hook.pipelines, n/2)
	}
}

func TestNoScript(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, c *redis.Client) {
		hook := &countingHook{}
		c.AddHook(hook)
		s := newStore(t, c)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-3, Burst: 100}
		flush := func() {
			t.Helper()
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		flush()
		if r, err := s.AllowN(ctx, lim, "a", 1); err != nil || !r.Allowed {
			t.Fatalf("AllowN after SCRIPT FLUSH: %+v %v", r, err)
		}
		flush()
		if g, err := s.Take(ctx, lim, "a", 5, 1); err != nil || g.Granted != 5 {
			t.Fatalf("Take after SCRIPT FLUSH: %+v %v", g, err)
		}
		flush()
		if err := s.Refund(ctx, lim, "a", 2); err != nil {
			t.Fatalf("Refund after SCRIPT FLUSH: %v", err)
		}
		flush()
		if n, err := s.Heartbeat(ctx, "fleet", "s1", time.Minute); err != nil || n != 1 {
			t.Fatalf("Heartbeat after SCRIPT FLUSH: %d %v", n, err)
		}

		reqs := make([]redisstore.TakeRequest, 6)
		for i := range reqs {
			reqs[i] = redisstore.TakeRequest{Limit: lim, Key: "b" + strconv.Itoa(i), Want: 3, Min: 1}
		}
		out := make([]redisstore.TakeResult, len(reqs))
		checkBatchNoScript(t, c, hook, "TakeBatch", len(reqs), func() error { return s.TakeBatch(ctx, reqs, out) }, func() {
			for i, r := range out {
				if r.Granted != 3 {
					t.Fatalf("item %d: %+v", i, r)
				}
			}
		})
		for i := range reqs {
			// 100 - 3 (first batch) - 3 (warm) - 3 (this one) = 91 left in every bucket.
			if out[i].Err != nil || out[i].Granted != 3 || !near(out[i].Remaining, 91, 1e-2) {
				t.Fatalf("item %d: %+v, want 3 granted, 91 left", i, out[i])
			}
		}
		sets := make([]redisstore.LowSet, 4)
		for i := range sets {
			sets[i] = redisstore.LowSet{Limit: lim.Name, Shards: len(sets), Shard: i, Mark: []redisstore.KeyID{redisstore.KeyID("k" + strconv.Itoa(i))}}
		}
		got, errs := make([][]redisstore.KeyID, len(sets)), make([]error, len(sets))
		checkBatchNoScript(t, c, hook, "LowBatch", len(sets), func() error { return s.LowBatch(ctx, sets, time.Minute, got, errs) }, func() {
			for i := range sets {
				if errs[i] != nil || !slices.Equal(got[i], sets[i].Mark) {
					t.Fatalf("set %d: %q, %v; want its mark", i, got[i], errs[i])
				}
			}
		})
	}
	t.Run("miniredis", func(t *testing.T) {
		_, c := redistest.Mini(t)
		check(t, c)
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.StartServer(t) // its own server: SCRIPT FLUSH is not for the shared one
		check(t, srv.Client())
	})
}

func countOf(names []string, name string) int {
	n := 0
	for _, s := range names {
		if s == name {
			n++
		}
	}
	return n
}

func TestHeartbeat(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		fleet := lname(t)
		for i, id := range []string{"a", "b", "a", "c"} {
			n, err := s.Heartbeat(ctx, fleet, id, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if want := []int{1, 2, 2, 3}[i]; n != want {
				t.Fatalf("beat %d (%s): %d live, want %d", i, id, n, want)
			}
		}
		for _, bad := range []struct {
			fleet, id string
			ttl       time.Duration
		}{{"", "a", time.Second}, {"f{", "a", time.Second}, {"f", "", time.Second}, {"f", "a", time.Microsecond}} {
			if _, err := s.Heartbeat(ctx, bad.fleet, bad.id, bad.ttl); !errors.Is(err, storeerr.ErrInvalidLimit) {
				t.Errorf("Heartbeat(%q, %q, %v) = %v, want ErrInvalidLimit", bad.fleet, bad.id, bad.ttl, err)
			}
		}
	})
	m, c := redistest.Mini(t)
	m.SetTime(t0)
	s := newStore(t, c)
	_, _ = s.Heartbeat(context.Background(), "f", "old", time.Second)
	m.SetTime(t0.Add(2 * time.Second))
	if n, _ := s.Heartbeat(context.Background(), "f", "new", time.Second); n != 1 {
		t.Fatalf("live = %d, want 1 (the old member expired by Redis TIME)", n)
	}
}

// TestLow: each server's marks add up, the latest first; a mark moves later, never
// earlier; marks expire by Redis TIME; bad arguments fail before any call.
func TestLow(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := lname(t)
		for i, tc := range []struct {
			mark []redisstore.KeyID
			want []redisstore.KeyID
		}{
			{nil, []redisstore.KeyID{}},
			{[]redisstore.KeyID{"a"}, []redisstore.KeyID{"a"}},
			{[]redisstore.KeyID{"b", "{0123456789abcdef0123456789abcdef"}, nil}, // marked at one instant or two
			{nil, nil},
		} {
			got, err := s.Low(ctx, lim, 1, 0, tc.mark, nil, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if len(got) != 3 || got[2] != "a" {
					t.Fatalf("call %d: %q, want b and the digest, then a", i, got)
				}
				continue
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("call %d: %q, want %q", i, got, tc.want)
			}
		}
		for _, bad := range []struct {
			limit  string
			memory time.Duration
		}{{"", time.Second}, {"l{", time.Second}, {"l", time.Microsecond}} {
			if _, err := s.Low(ctx, bad.limit, 1, 0, nil, nil, bad.memory); !errors.Is(err, storeerr.ErrInvalidLimit) {
				t.Errorf("Low(%q, %v) = %v, want ErrInvalidLimit", bad.limit, bad.memory, err)
			}
		}
	})
	m, c := redistest.Mini(t)
	m.SetTime(t0)
	s := newStore(t, c)
	ctx := context.Background()
	_, _ = s.Low(ctx, "l", 1, 0, []redisstore.KeyID{"old"}, nil, time.Second)
	m.SetTime(t0.Add(500 * time.Millisecond))
	_, _ = s.Low(ctx, "l", 1, 0, []redisstore.KeyID{"new", "gone"}, nil, time.Second)
	_, _ = s.Low(ctx, "l", 1, 0, []redisstore.KeyID{"new"}, nil, time.Millisecond) // earlier: the mark stays
	m.SetTime(t0.Add(1200 * time.Millisecond))
	if got, _ := s.Low(ctx, "l", 1, 0, nil, []redisstore.KeyID{"gone"}, time.Second); !slices.Equal(got, []redisstore.KeyID{"new"}) {
		t.Fatalf("%q, want only new (old expired by Redis TIME, gone unmarked, new's mark not moved back)", got)
	}
}

// evalHook records the replies of the scripts each pipeline ran (not those answered
// NOSCRIPT, which ran nothing).
// A pipeline's hook runs on the goroutine that sends it: the test reads replies after
// the call returned, with no lock.
type evalHook struct {
	replies [][]any // by pipeline, each EVALSHA's or EVAL's reply
}

func (*evalHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*evalHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *evalHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		var rs []any
		for _, c := range cmds {
			if n := strings.ToLower(c.Name()); n == "evalsha" || n == "eval" {
				if v, err := c.(*redis.Cmd).Result(); err == nil { // not NOSCRIPT: ran
					rs = append(rs, v)
				}
			}
		}
		h.replies = append(h.replies, rs)
		return err
	}
}

// TestLowManyMarks: a set's marks and unmarks beyond wire.MaxLowWrite go in several runs
// of the script in one round trip, each of at most that many, of which only the last
// reads the set; every mark and unmark is made, and the answer is the whole set's.
func TestLowManyMarks(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		h := &evalHook{}
		tg.Client.AddHook(h)
		s := newStore(t, tg.Client)
		lim := lname(t)
		ids := func(prefix string, n int) []redisstore.KeyID {
			out := make([]redisstore.KeyID, n)
			for i := range out {
				out[i] = redisstore.KeyID(prefix + strconv.Itoa(i))
			}
			return out
		}
		marks := ids("k", 2*wire.MaxLowWrite+276)
		for _, tc := range []struct {
			mark, unmark []redisstore.KeyID
			runs, want   int
		}{
			{marks, nil, 3, len(marks)},
			{ids("n", 100), marks[:700], 2, len(marks) - 700 + 100},
		} {
			h.replies = nil
			got := make([][]redisstore.KeyID, 1)
			if err := s.LowBatch(ctx, []redisstore.LowSet{{Limit: lim, Shards: 1, Mark: tc.mark, Unmark: tc.unmark}}, time.Minute, got, make([]error, 1)); err != nil {
				t.Fatal(err)
			}
			if len(got[0]) != tc.want {
				t.Fatalf("%d marks and %d unmarks: answered %d IDs, want the set's %d", len(tc.mark), len(tc.unmark), len(got[0]), tc.want)
			}
			var runs []any
			ran := 0 // pipelines that ran the script: one, after a NOSCRIPT one if the cache was cold
			for _, p := range h.replies {
				runs = append(runs, p...)
				if len(p) > 0 {
					ran++
				}
			}
			if ran != 1 {
				t.Fatalf("%d marks and %d unmarks: the runs went in %d round trips, want 1", len(tc.mark), len(tc.unmark), ran)
			}
			if len(runs) != tc.runs {
				t.Fatalf("%d marks and %d unmarks: %d runs of the script, want %d", len(tc.mark), len(tc.unmark), len(runs), tc.runs)
			}
			for i, r := range runs {
				n := len(r.([]any))
				if i < len(runs)-1 && n != 0 || i == len(runs)-1 && n != tc.want {
					t.Fatalf("run %d of %d answered %d IDs; want none but from the last, which answers the set's %d", i+1, len(runs), n, tc.want)
				}
			}
			set, err := s.Low(ctx, lim, 1, 0, nil, nil, time.Minute)
			if err != nil || len(set) != tc.want {
				t.Fatalf("the set marks %d keys (%v), want %d", len(set), err, tc.want)
			}
		}
	})
}

// TestLowMost: luascript.Low answers at most ARGV[3] of the set's marks, the latest
// first, none for 0, and refuses a bound that is not a whole number from 0 to 10,000.
func TestLowMost(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		key := "fl:low:{" + lname(t) + "}"
		for _, tc := range []struct {
			most any
			want int // -1: refused
		}{{0, 0}, {1, 1}, {2, 2}, {10000, 3}, {-1, -1}, {10001, -1}, {"1.5", -1}, {"x", -1}} {
			got, err := luascript.Low.Run(ctx, tg.Client, []string{key}, 60000, 3, tc.most, "a", "b", "c").StringSlice()
			switch {
			case tc.want < 0 && err == nil:
				t.Errorf("most %v: answered %q, want the arguments refused", tc.most, got)
			case tc.want >= 0 && (err != nil || len(got) != tc.want):
				t.Errorf("most %v: %q, %v; want %d IDs", tc.most, got, err, tc.want)
			}
		}
	})
}

// TestLowBatch: a batch exchanges with each set of a limit's low keys in one round trip,
// each mark in its set; a set with nothing to write is read at the caller's estimate of
// Redis's time; a bad set fails alone. (An empty script cache: TestNoScript.)
func TestLowBatch(t *testing.T) {
	const sets = 3
	keyOf := func(shard int) redisstore.KeyID {
		for i := range 1000 {
			if k := "key" + strconv.Itoa(i); wire.LowShard(k, sets) == shard {
				return redisstore.KeyID(k)
			}
		}
		panic("no key")
	}
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := lname(t)
		a, c := keyOf(0), keyOf(2)
		batch := []redisstore.LowSet{
			{Limit: lim, Shards: sets, Shard: 0, Mark: []redisstore.KeyID{a}},
			{Limit: lim, Shards: sets, Shard: 1, ReadAt: time.Now()},
			{Limit: lim, Shards: sets, Shard: 2, Mark: []redisstore.KeyID{c}},
			{Limit: lim, Shards: sets, Shard: sets}, // no such set
		}
		got, errs := make([][]redisstore.KeyID, len(batch)), make([]error, len(batch))
		err := s.LowBatch(ctx, batch, time.Minute, got, errs)
		if !errors.Is(err, storeerr.ErrInvalidLimit) || !errors.Is(errs[3], storeerr.ErrInvalidLimit) {
			t.Fatalf("LowBatch = %v (%v), want the bad set's ErrInvalidLimit", err, errs)
		}
		want := [][]redisstore.KeyID{{a}, {}, {c}, nil}
		for i := range 3 {
			if errs[i] != nil || !slices.Equal(got[i], want[i]) {
				t.Fatalf("set %d: %q, %v; want %q", i, got[i], errs[i], want[i])
			}
		}
		// read only: set 0's mark, until its memory has passed
		read := func(at time.Time) ([]redisstore.KeyID, error) {
			got, errs := make([][]redisstore.KeyID, 1), make([]error, 1)
			err := s.LowBatch(ctx, []redisstore.LowSet{{Limit: lim, Shards: sets, ReadAt: at}}, time.Minute, got, errs)
			return got[0], err
		}
		if got, err := read(time.Now()); err != nil || !slices.Equal(got, []redisstore.KeyID{a}) {
			t.Fatalf("a read of set 0 = %q, %v; want %s", got, err, a)
		}
		if got, err := read(time.Now().Add(2 * time.Minute)); err != nil || len(got) != 0 {
			t.Fatalf("a read past the mark's memory = %q, %v; want none", got, err)
		}
		if err := s.LowBatch(ctx, batch, time.Minute, got[:1], errs); !errors.Is(err, storeerr.ErrInvalidConfig) {
			t.Fatalf("LowBatch with too few answers = %v, want ErrInvalidConfig", err)
		}
	})
}

func TestErrorClasses(t *testing.T) {
	ctx := context.Background()
	lim := redisstore.Limit{Name: "e", Rate: 1, Burst: 10}
	m, c := redistest.Mini(t)
	s := newStore(t, c)
	type call func(ctx context.Context) error
	calls := map[string]call{
		"allow": func(ctx context.Context) error { _, err := s.AllowN(ctx, lim, "k", 1); return err },
		"take":  func(ctx context.Context) error { _, err := s.Take(ctx, lim, "k", 1, 1); return err },
		"refund": func(ctx context.Context) error {
			return s.Refund(ctx, lim, "k", 1)
		},
		"batch": func(ctx context.Context) error {
			out := make([]redisstore.TakeResult, 1)
			return s.TakeBatch(ctx, []redisstore.TakeRequest{{Limit: lim, Key: "k", Want: 1, Min: 1}}, out)
		},
		"heartbeat": func(ctx context.Context) error { _, err := s.Heartbeat(ctx, "f", "s", time.Second); return err },
	}
	for _, tc := range []struct {
		name        string
		setErr      string
		unavailable bool
		redisErr    bool
	}{
		{"LOADING", "LOADING Redis is loading the dataset in memory", true, false},
		{"BUSY", "BUSY Redis is busy running a script", true, false},
		{"CLUSTERDOWN", "CLUSTERDOWN The cluster is down", true, false},
		{"READONLY", "READONLY You can't write against a read only replica.", true, false},
		{"OOM", "OOM command not allowed when used memory > 'maxmemory'.", true, false},
		{"MOVED", "MOVED 3999 127.0.0.1:6381", true, false},
		{"ERR", "ERR something went wrong", false, true},
		{"NOPERM", "NOPERM this user has no permissions", false, true},
		{"WRONGTYPE", "WRONGTYPE Operation against a key holding the wrong kind of value", false, true},
	} {
		m.SetError(tc.setErr)
		for name, f := range calls {
			err := f(ctx)
			if err == nil {
				t.Fatalf("%s with %s: no error", name, tc.name)
			}
			if storeerr.IsUnavailable(err) != tc.unavailable || errors.Is(err, storeerr.ErrRedis) != tc.redisErr ||
				!strings.HasPrefix(err.Error(), "global: ") {
				t.Errorf("%s with %s: %v: IsUnavailable %v, ErrRedis %v; want %v, %v",
					name, tc.name, err, storeerr.IsUnavailable(err), errors.Is(err, storeerr.ErrRedis), tc.unavailable, tc.redisErr)
			}
		}
	}
	m.SetError("")

	// The caller's cancellation is not the store's failure, and stays matchable.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	for name, f := range calls {
		err := f(cctx)
		if !errors.Is(err, context.Canceled) || storeerr.IsUnavailable(err) || errors.Is(err, storeerr.ErrRedis) {
			t.Errorf("%s cancelled: %v, want context.Canceled only", name, err)
		}
	}
	// A deadline that passed: the store did not answer in time.
	dctx, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel2()
	for name, f := range calls {
		if err := f(dctx); !errors.Is(err, context.DeadlineExceeded) || !storeerr.IsUnavailable(err) {
			t.Errorf("%s past deadline: %v, want DeadlineExceeded and unavailable", name, err)
		}
	}
	// A Redis that is gone: connection refused.
	m.Close()
	for name, f := range calls {
		if err := f(ctx); !storeerr.IsUnavailable(err) {
			t.Errorf("%s on a closed server: %v, want unavailable", name, err)
		}
	}
	// A closed client.
	_ = c.Close()
	if err := calls["take"](ctx); !storeerr.IsUnavailable(err) || !errors.Is(err, redis.ErrClosed) {
		t.Errorf("closed client: %v", err)
	}
	// Raw go-redis errors are classified too (the breaker may see them).
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false}, {context.Canceled, false}, {context.DeadlineExceeded, true},
		{redis.ErrPoolTimeout, true}, {redis.ErrClosed, true}, {redis.Nil, false},
		{storeerr.ErrInvalidLimit, false}, {storeerr.ErrInvalidConfig, false}, {storeerr.ErrUnavailable, true},
	} {
		if got := storeerr.IsUnavailable(tc.err); got != tc.want {
			t.Errorf("IsUnavailable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestScriptErrorIsRedisError: a wrong-type key is Redis answering with an error.
func TestScriptErrorIsRedisError(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1, Burst: 10}
		if err := tg.Client.Set(ctx, s.Key(lim.Name, "k"), "a string", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := s.Take(ctx, lim, "k", 1, 1)
		if !errors.Is(err, storeerr.ErrRedis) || storeerr.IsUnavailable(err) {
			t.Fatalf("Take on a string key: %v, want ErrRedis", err)
		}
	})
}

// TestConcurrentAllowN: 50 goroutines fire 2,000 requests at a bucket of 100 that
// refills at 1e-4/s: exactly 100 are admitted.
func TestConcurrentAllowN(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		const workers = 50
		total := 2000
		if testing.Short() && !tg.Real() {
			total = 500 // miniredis runs a script in ~0.3 ms (more under -race); real Redis keeps 2,000
		}
		var admitted, done atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < total/workers; i++ {
					r, err := s.AllowN(context.Background(), lim, "hot", 1)
					if err != nil {
						t.Error(err)
						return
					}
					done.Add(1)
					if r.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		if done.Load() != int64(total) {
			t.Fatalf("%d of %d requests answered", done.Load(), total)
		}
		// At 1e-4/s the bucket refills one token in 10,000 s; the test takes seconds.
		if admitted.Load() != 100 {
			t.Fatalf("admitted %d of %d, want exactly 100 (elapsed %v)", admitted.Load(), total, elapsed)
		}
		t.Logf("%s: %d requests from %d goroutines in %v, %d admitted", tg.Name, total, workers, elapsed, admitted.Load())
	})
}

// TestConcurrentTakes: concurrent lease takes (with partial grants) never grant more
// than the bucket held, and drain it.
func TestConcurrentTakes(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		const workers = 50
		perWorker := 40
		if testing.Short() && !tg.Real() {
			perWorker = 10
		}
		var granted atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < perWorker; i++ {
					want := 1 + (w+i)%7
					g, err := s.Take(context.Background(), lim, "hot", want, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if g.Granted < 0 || g.Granted > want {
						t.Errorf("granted %d for want %d", g.Granted, want)
					}
					granted.Add(int64(g.Granted))
				}
			}(w)
		}
		wg.Wait()
		if granted.Load() != 100 {
			t.Fatalf("granted %d tokens in total, want exactly the 100 the bucket held", granted.Load())
		}
	})
}

// TestBatchedTakesConcurrent: the same with TakeBatch from many goroutines.
func TestBatchedTakesConcurrent(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 50}
		var granted atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < 20; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				reqs := []redisstore.TakeRequest{
					{Limit: lim, Key: "x", Want: 3, Min: 1},
					{Limit: lim, Key: "y", Want: 2, Min: 2},
					{Limit: lim, Key: "x", Want: 1, Min: 1},
				}
				out := make([]redisstore.TakeResult, len(reqs))
				for i := 0; i < 10; i++ {
					if err := s.TakeBatch(context.Background(), reqs, out); err != nil {
						t.Error(err)
						return
					}
					for _, r := range out {
						granted.Add(int64(r.Granted))
					}
				}
			}()
		}
		wg.Wait()
		if granted.Load() != 100 {
			t.Fatalf("granted %d over two buckets of 50, want 100", granted.Load())
		}
	})
}

// TestRetriedTakeSpendsOnce: against a stalled Redis, a go-redis client that retries
// timed-out commands sends the take script several times. Each attempt waits in the
// server's socket buffers and runs when the server resumes. The take spends once; the
// article's script, run the same way, is charged once per attempt.
func TestRetriedTakeSpendsOnce(t *testing.T) {
	srv := redistest.StartServer(t)
	retrying := srv.Client(func(o *redis.Options) {
		o.MaxRetries = 3
		o.ReadTimeout = 50 * time.Millisecond
		o.MinRetryBackoff = time.Millisecond
		o.MaxRetryBackoff = 2 * time.Millisecond
	})
	admin := srv.Client()
	ctx := context.Background()
	s := newStore(t, retrying, redisstore.RetryingClient())
	lim := redisstore.Limit{Name: "retry", Rate: 1e-4, Burst: 100}
	key := s.Key(lim.Name, "k")
	seedKey := s.Key(lim.Name, "seed")
	// Warm up: scripts loaded, and six connections that have done their handshake (a
	// retry on a new connection would stall in HELLO and never send the script).
	if err := luascript.Take.Load(ctx, admin).Err(); err != nil {
		t.Fatal(err)
	}
	if err := luascript.Bucket.Load(ctx, admin).Err(); err != nil {
		t.Fatal(err)
	}
	var warm sync.WaitGroup
	for i := 0; i < 6; i++ {
		warm.Add(1)
		go func() { // each WAIT (no replicas) holds its connection for 100 ms, so six are opened
			defer warm.Done()
			_ = retrying.Wait(ctx, 1, 100*time.Millisecond).Err()
		}()
	}
	warm.Wait()

	calls := func(cmd string) int {
		info, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "cmdstat_"+cmd+":calls=") {
				n, _ := strconv.Atoi(strings.SplitN(strings.TrimPrefix(line, "cmdstat_"+cmd+":calls="), ",", 2)[0])
				return n
			}
		}
		return 0
	}
	stalled := func(f func() error) int {
		t.Helper()
		before := calls("evalsha")
		srv.Stop()
		err := f() // every attempt times out: the server is frozen
		srv.Cont()
		if !storeerr.IsUnavailable(err) && !redistestTimeout(err) {
			t.Fatalf("call against a frozen server: %v, want a timeout", err)
		}
		// Wait until the server has run every queued attempt (the count stops growing).
		deadline := time.Now().Add(5 * time.Second)
		last, stable := -1, 0
		for stable < 20 && time.Now().Before(deadline) {
			n := calls("evalsha")
			if n == last {
				stable++
			} else {
				last, stable = n, 0
			}
		}
		return last - before
	}

	attempts := stalled(func() error { _, err := s.Take(ctx, lim, "k", 10, 10); return err })
	if attempts < 2 {
		t.Fatalf("the client sent the take %d times; the test needs a retrying client", attempts)
	}
	tok, err := admin.HGet(ctx, key, "tokens").Float64()
	if err != nil || !near(tok, 90, 1e-2) {
		t.Fatalf("after %d attempts of one take of 10: tokens %v (%v), want 90", attempts, tok, err)
	}
	t.Logf("one Take sent %d times by the client, spent once", attempts)

	seedAttempts := stalled(func() error {
		return luascript.Bucket.Run(ctx, retrying, []string{seedKey}, 100, 1e-4, 10).Err()
	})
	seedTok, _ := admin.HGet(ctx, seedKey, "tokens").Float64()
	if want := 100 - 10*float64(seedAttempts); !near(seedTok, want, 1e-2) {
		t.Fatalf("the article's script sent %d times left %v tokens, want %v", seedAttempts, seedTok, want)
	}
	t.Logf("the article's script sent %d times spent %v tokens", seedAttempts, 100-seedTok)
}

func redistestTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

// overtakeHook runs other just before each of the next left script calls (EVALSHA or
// EVAL, alone or in a pipeline) other did not make itself: another call of the same
// bucket through the same Store, whose later sequence number reaches Redis first, as
// when two goroutines use one key at once over two connections. ran counts its runs.
type overtakeHook struct {
	left  atomic.Int32
	ran   atomic.Int32
	busy  atomic.Bool // other is running: its own calls are not overtaken
	other func()
}

// overtakes returns an overtakeHook that runs other before the next n script calls.
func overtakes(n int, other func()) *overtakeHook {
	h := &overtakeHook{other: other}
	h.left.Store(int32(n))
	return h
}

// overtake runs other if one of cmds is a script call it overtakes.
func (h *overtakeHook) overtake(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && !h.busy.Load() && h.left.Add(-1) >= 0 {
			h.busy.Store(true)
			defer h.busy.Store(false)
			h.ran.Add(1)
			h.other()
			return
		}
	}
}

func (h *overtakeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *overtakeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.overtake(cmd)
		return next(ctx, cmd)
	}
}
func (h *overtakeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.overtake(cmds...)
		return next(ctx, cmds)
	}
}

// TestConcurrentTakesOfOneKeyAreNotStale: a Store is safe for concurrent use, so two
// goroutines may take from one bucket at once, and their sequence numbers may reach
// Redis out of order. The script answers the older one as stale (nothing spent, 0
// granted); Take and TakeBatch must not pass that on as "the bucket is empty" while it
// holds tokens.
func TestConcurrentTakesOfOneKeyAreNotStale(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			redistest.Run(t, func(t *testing.T, tg redistest.Target) {
				ctx := context.Background()
				lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
				h := overtakes(1, nil)
				tg.Client.AddHook(h)
				s := newStore(t, tg.Client)
				h.other = func() {
					if g, err := s.Take(ctx, lim, "k", 10, 1); err != nil || g.Granted != 10 {
						t.Errorf("other take: %+v, %v", g, err)
					}
				}
				var g redisstore.Grant
				if batch {
					out := make([]redisstore.TakeResult, 1)
					err := s.TakeBatch(ctx, []redisstore.TakeRequest{{Limit: lim, Key: "k", Want: 5, Min: 5}}, out)
					if err != nil {
						t.Fatal(err)
					}
					g = out[0].Grant
				} else {
					var err error
					if g, err = s.Take(ctx, lim, "k", 5, 5); err != nil {
						t.Fatal(err)
					}
				}
				if h.ran.Load() == 0 {
					t.Fatal("the hook did not run")
				}
				if g.Granted != 5 || !near(g.Remaining, 85, 1e-3) {
					t.Fatalf("take with 90 tokens in the bucket = %+v, want 5 granted and 85 left", g)
				}
			})
		})
	}
}

// TestConcurrentRefundsOfOneKeyAreNotLost: as for takes, a refund that reaches Redis
// after a later refund of the same bucket from the same Store is answered stale
// (nothing refunded); Refund must send it again rather than drop the tokens.
func TestConcurrentRefundsOfOneKeyAreNotLost(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		s := newStore(t, tg.Client)
		if g, err := s.Take(ctx, lim, "k", 50, 50); err != nil || g.Granted != 50 {
			t.Fatalf("take: %+v, %v", g, err)
		}
		h := overtakes(1, func() {
			if err := s.Refund(ctx, lim, "k", 10); err != nil {
				t.Errorf("other refund: %v", err)
			}
		})
		tg.Client.AddHook(h)
		if err := s.Refund(ctx, lim, "k", 5); err != nil {
			t.Fatal(err)
		}
		if h.ran.Load() == 0 {
			t.Fatal("the hook did not run")
		}
		g, err := s.Take(ctx, lim, "k", 100, 1)
		if err != nil {
			t.Fatal(err)
		}
		if g.Granted != 65 {
			t.Fatalf("after refunds of 10 and 5 into 50 left, a take found %d tokens, want 65", g.Granted)
		}
	})
}

// TestTakeWaitSlowRate: at one token in 250 years (the slowest refill Validate accepts
// is about 292 years) the wait is reported exactly, in range, on miniredis and on real
// Redis. A slower limit wrapped the wait to a negative Duration on real Redis, and on
// miniredis its TTL wrapped and the bucket vanished at once.
func TestTakeWaitSlowRate(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		s := newStore(t, tg.Client)
		year := 365.25 * 24 * 3600.0
		lim := redisstore.Limit{Name: "slow", Rate: 1 / (250 * year), Burst: 1}
		ctx := context.Background()
		key := redistest.Unique(t) // the bucket lives 250 years: never reuse it
		if g, err := s.Take(ctx, lim, key, 1, 1); err != nil || g.Granted != 1 {
			t.Fatalf("first Take = %+v, %v", g, err)
		}
		g, err := s.Take(ctx, lim, key, 1, 1)
		if err != nil || g.Granted != 0 || g.Wait < 249*time.Duration(year)*time.Second {
			t.Fatalf("Take = %+v, %v; want 0 granted and a wait of 250 years", g, err)
		}
		if err := s.Reset(ctx, lim, key); err != nil {
			t.Fatal(err)
		}
	})
}

// TestTakeSentAgain: a take sent again under the Seq of one that ran is answered from the
// bucket's record (Replayed, the same grant) and spends nothing; under the Seq of one that
// never reached Redis it runs; under one older than a later take of the bucket it runs
// under a fresh number (it was overtaken). Through TakeBatch and TakeOne alike.
func TestTakeSentAgain(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-3, Burst: 10}
		batch := func(r redisstore.TakeRequest) redisstore.TakeResult {
			out := make([]redisstore.TakeResult, 1)
			if err := s.TakeBatch(ctx, []redisstore.TakeRequest{r}, out); err != nil {
				t.Fatal(err)
			}
			return out[0]
		}
		for _, via := range []struct {
			name string
			take func(redisstore.TakeRequest) redisstore.TakeResult
		}{
			{"TakeBatch", batch},
			{"TakeOne", func(r redisstore.TakeRequest) redisstore.TakeResult {
				g, err := s.TakeOne(ctx, r)
				return redisstore.TakeResult{Grant: g, Err: err}
			}},
		} {
			t.Run(via.name, func(t *testing.T) {
				key := via.name
				ran := s.NextSeq()
				if r := via.take(redisstore.TakeRequest{Limit: lim, Key: key, Want: 4, Min: 1, Seq: ran}); r.Err != nil || r.Granted != 4 || r.Replayed {
					t.Fatalf("first take: %+v", r)
				}
				// Its answer lost: sent again, asking for another amount.
				r := via.take(redisstore.TakeRequest{Limit: lim, Key: key, Want: 2, Min: 1, Seq: ran})
				if r.Err != nil || r.Granted != 4 || !r.Replayed {
					t.Fatalf("sent again: %+v, want the first's 4, replayed", r)
				}
				never := s.NextSeq() // a take that timed out before it reached Redis
				r = via.take(redisstore.TakeRequest{Limit: lim, Key: key, Want: 2, Min: 1, Seq: never})
				if r.Err != nil || r.Granted != 2 || r.Replayed {
					t.Fatalf("under the seq of a take that never ran: %+v, want 2 granted fresh", r)
				}
				r = via.take(redisstore.TakeRequest{Limit: lim, Key: key, Want: 1, Min: 1, Seq: ran})
				if r.Err != nil || r.Granted != 1 || r.Replayed {
					t.Fatalf("under a seq older than the bucket's last take: %+v, want 1 granted fresh", r)
				}
				if left := 10 - 4 - 2 - 1; int(r.Remaining) != left {
					t.Errorf("the bucket holds %v, want %d: a replay spent", r.Remaining, left)
				}
			})
		}
	})
}

// TestTakeBatchGrants: a batch's items are independent takes, in order: a second item of
// one bucket sees what the first left, and an empty bucket answers how long until Min
// tokens are there.
func TestTakeBatchGrants(t *testing.T) {
	m, c := redistest.Mini(t)
	m.SetTime(t0)
	s := newStore(t, c)
	api, _ := redisstore.NewLimit("api", 10, 100)
	reqs := []redisstore.TakeRequest{
		{Limit: api, Key: "tenant-1", Want: 20, Min: 1},
		{Limit: api, Key: "tenant-2", Want: 100, Min: 100},
		{Limit: api, Key: "tenant-2", Want: 10, Min: 1},
	}
	out := make([]redisstore.TakeResult, len(reqs))
	if err := s.TakeBatch(context.Background(), reqs, out); err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		granted int
		wait    time.Duration
	}{{20, 0}, {100, 0}, {0, 100 * time.Millisecond}} {
		if out[i].Granted != want.granted || out[i].Wait != want.wait {
			t.Errorf("item %d (%s): granted %d, wait %v; want %d, %v", i, reqs[i].Key, out[i].Granted, out[i].Wait, want.granted, want.wait)
		}
	}
}
