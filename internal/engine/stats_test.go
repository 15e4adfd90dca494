package engine

import (
	"sync"
	"testing"
)

// TestCountersStriped: goroutines counting at once each write a shard of their own
// (stripe), and the sums are exact whatever shard each decision went to.
func TestCountersStriped(t *testing.T) {
	const goroutines, each = 64, 1000
	var lm Limit
	stripes := make([]uintptr, goroutines)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range goroutines {
		wg.Go(func() {
			<-start
			stripes[g] = stripe()
			for i := range each {
				d := Decision{Allowed: i%4 != 0, Source: SourceLease, Reason: ReasonLease}
				if !d.Allowed {
					d.Source, d.Reason = SourcePreCheck, ReasonPreCheck
				}
				lm.stats.count(&d, 1+i%3)
			}
		})
	}
	close(start)
	wg.Wait()
	s := lm.Stats()
	if got, want := s.Decisions[1][SourceLease][ReasonLease], int64(goroutines*each*3/4); got != want {
		t.Errorf("admitted from leases: %d, want %d", got, want)
	}
	if got, want := s.Decisions[0][SourcePreCheck][ReasonPreCheck], int64(goroutines*each/4); got != want {
		t.Errorf("denied by the pre-check: %d, want %d", got, want)
	}
	// Tokens spent: 1, 2, 3 in turn, the denials' (i%4 == 0) left out.
	spent := int64(0)
	for i := range each {
		if i%4 != 0 {
			spent += int64(1 + i%3)
		}
	}
	lm.stats.granted.Add(goroutines * spent)
	if s := lm.Stats(); s.Held != 0 {
		t.Errorf("held %d after granting what was spent, want 0: the shards' extra tokens do not sum", s.Held)
	}
	seen := map[uintptr]bool{}
	for _, s := range stripes {
		if s >= counterShards {
			t.Fatalf("stripe %d, want < %d", s, counterShards)
		}
		seen[s] = true
	}
	if len(seen) < counterShards/2 {
		t.Errorf("%d goroutines counted in %d of %d shards, want at least %d", goroutines, len(seen), counterShards, counterShards/2)
	}
}
