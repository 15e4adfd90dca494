package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// TestEvictionWithWaiters: keys pushed out of a small key store (MaxKeys 1 and 10) while
// their requests wait for Redis, for every kind of limit, on miniredis and a real Redis.
// Every request is decided, from its grant when its key went meanwhile (none by the
// failure policy: Redis is healthy), none panics, and Close returns within its context.
func TestEvictionWithWaiters(t *testing.T) {
	kinds := []struct {
		name string
		mode hybrid.Mode
	}{
		{"bucket", hybrid.Exact()},
		{"charge-later", hybrid.ChargeLater(20 * time.Millisecond)},
		{"windowed", hybrid.Windowed(20 * time.Millisecond)},
	}
	targets(t, func(t *testing.T, addr string, real bool) {
		for _, k := range kinds {
			for _, maxKeys := range []int{1, 10} {
				t.Run(fmt.Sprintf("%s/MaxKeys=%d", k.name, maxKeys), func(t *testing.T) {
					lim := hybrid.Limit{Name: "api", Rate: 1000, Burst: 100, Policy: breaker.FailClosed, Mode: k.mode,
						MaxKeys: maxKeys, MaxWait: time.Second}
					s := newServer(t, addr, randomPrefix(), nil, breaker.Settings{Timeout: time.Second},
						hybrid.Config{FleetSize: 2, Limits: []hybrid.Limit{lim}})
					ctx := context.Background()
					var wg sync.WaitGroup
					var policy atomic.Int64
					decided := make([]int, 8)
					for g := range decided {
						wg.Go(func() {
							for i := range 150 {
								d, err := s.limiter.Allow(ctx, "api", fmt.Sprintf("k%d", (g*7+i)%(3*maxKeys+5)))
								if err != nil {
									t.Error(err)
									return
								}
								if d.Source == hybrid.SourceFallback {
									policy.Add(1)
								}
								decided[g]++
							}
						})
					}
					wg.Wait()
					// Redis is healthy: a request whose key went while it waited is decided
					// from its grant, not by the policy after MaxWait.
					if n := policy.Load(); n > 0 {
						t.Errorf("%d requests decided by the failure policy on a healthy Redis", n)
					}
					for g, n := range decided {
						if n != 150 {
							t.Errorf("goroutine %d: %d of 150 requests decided", g, n)
						}
					}
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					defer cancel()
					done := make(chan error, 1)
					go func() { done <- s.limiter.Close(cctx) }()
					select {
					case err := <-done:
						if err != nil {
							t.Logf("Close: %v", err)
						}
					case <-time.After(10 * time.Second):
						t.Fatal("Close did not return within 10 s of a 5 s context")
					}
				})
			}
		}
	})
}
