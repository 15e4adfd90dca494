package engine

import (
	"sync"
	"testing"
)

// TestCountersStriped: goroutines counting at once spread their counts over the shards
// (stripe), and the sums are exact whatever shard each decision went to.
func TestCountersStriped(t *testing.T) {
	const goroutines, each = 64, 1000
	var lm Limit
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range goroutines {
		wg.Go(func() {
			<-start
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
	// Tokens spent: 1, 2, 3 in turn, the denials' (i%4 == 0) left out. Granted that
	// and 7 more, the server holds the 7.
	spent := int64(0)
	for i := range each {
		if i%4 != 0 {
			spent += int64(1 + i%3)
		}
	}
	lm.stats.granted.Add(goroutines*spent + 7)
	if s := lm.Stats(); s.Held != 7 {
		t.Errorf("held %d, want 7: the shards' tokens spent do not sum to %d", s.Held, goroutines*spent)
	}
	used := 0
	for i := range lm.stats.decisions {
		if lm.stats.decisions[i].n[1][SourceLease][ReasonLease].Load() > 0 {
			used++
		}
	}
	if used < counterShards/2 {
		t.Errorf("%d goroutines counted in %d of %d shards, want at least %d", goroutines, used, counterShards, counterShards/2)
	}
}
