// Package hybridtest helps test code that reads a hybrid.Limiter: metrics exporters,
// dashboards, handlers. Busy returns a Limiter over an embedded miniredis that has made
// decisions of every source and of the common reasons; Tally counts decisions through Config.OnDecision;
// Bitfield gives an embedded miniredis the BITFIELD a Windowed limit needs.
package hybridtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/minibits"
	"github.com/fleetlimit/fleetlimit/internal/sysclock"
)

// frozen is the system clock stopped at one instant: no bucket refills and no lease
// expires while a test runs, so the decisions it makes are the ones it expects.
type frozen struct {
	sysclock.Clock
	at time.Time
}

func (c frozen) Now() time.Time { return c.at }

// Outcome is a decision's labels: its limit, outcome, source and reason.
type Outcome struct {
	Limit   string
	Allowed bool
	Source  hybrid.Source
	Reason  hybrid.Reason
}

// Tally counts the decisions Config.OnDecision hears of. The zero Tally is ready to use.
type Tally struct {
	mu sync.Mutex
	n  map[Outcome]int64
}

// Record is a Config.OnDecision that counts d.
func (c *Tally) Record(_ string, d hybrid.Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[Outcome]int64{}
	}
	c.n[Outcome{d.Limit, d.Allowed, d.Source, d.Reason}]++
}

// Counts returns the decisions counted so far.
func (c *Tally) Counts() map[Outcome]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[Outcome]int64, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// Busy returns a Limiter over an embedded miniredis that has made decisions of every tier:
// a refill from the global bucket, leases, pre-check denials, a cost above the burst,
// Redis refusing commands under a fail-open and a fail-closed policy, then Redis down
// until the breaker opens and decides alone. The breaker stays open (for an hour) and
// the Limiter's clock is frozen, so its counters change no more once it returns. It
// also returns what OnDecision heard.
func Busy(t testing.TB) (*hybrid.Limiter, *Tally) {
	t.Helper()
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	opts := &redis.Options{Addr: m.Addr()}
	global.Configure(opts)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	store, err := global.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	brk, err := breaker.New(breaker.Settings{Timeout: 2 * time.Second, FailureThreshold: 1, OpenTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	seen := &Tally{}
	l, err := hybrid.New(store, hybrid.Config{
		FleetSize:  2,
		Breaker:    brk,
		Clock:      frozen{at: time.Now()},
		OnDecision: seen.Record,
		Limits: []hybrid.Limit{
			{Name: "api", Rate: 0.001, Burst: 100, Policy: breaker.FailOpen, MaxWait: time.Second},
			{Name: "tight", Rate: 0.001, Burst: 10, PreBurst: 3, PreRate: 0.001, Policy: breaker.FailClosed, MaxWait: time.Second},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })

	ctx := context.Background()
	allow := func(limit, key string, n int) {
		t.Helper()
		if _, err := l.AllowN(ctx, limit, key, n); err != nil {
			t.Fatal(err)
		}
	}
	for range 40 {
		allow("api", "k", 1)
	}
	for range 8 {
		allow("tight", "k", 1)
	}
	allow("tight", "k", 11) // above the burst: denied without asking Redis

	m.SetError("ERR injected outage") // Redis answers every command with an error
	for _, k := range []string{"a", "b", "c"} {
		allow("api", k, 1)
		allow("tight", k, 1)
	}
	m.SetError("")

	m.Close() // Redis is gone: the first refill fails and opens the breaker
	for _, k := range []string{"d", "e", "f"} {
		allow("api", k, 1)
		allow("tight", k, 1)
	}
	if got := l.Stats().Breaker; got != breaker.StateOpen {
		t.Fatalf("breaker %v after Redis went away, want open", got)
	}
	return l, seen
}

// Bitfield adds BITFIELD and BITFIELD_RO to m, an embedded miniredis, which has none: a
// Limiter with a Windowed limit counts its windows with BITFIELD. Call it after
// m.Start (and again after m.Restart). The command is atomic against other BITFIELD
// calls on m, not against other commands on the same key.
func Bitfield(m *miniredis.Miniredis) error { return minibits.Register(m) }
