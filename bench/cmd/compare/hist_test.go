package main

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketBoundsContainTheValue(t *testing.T) {
	values := []uint64{0, 1, 127, 128, 129, 255, 256, 1000, 1 << 20, 123456789, 1<<62 + 12345}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		values = append(values, r.Uint64N(1<<40))
	}
	for _, v := range values {
		i := bucket(v)
		if lo, hi := lowest(i), lowest(i+1); v < lo || v >= hi {
			t.Fatalf("value %d in bucket %d = [%d, %d)", v, i, lo, hi)
		}
		if lo, hi := lowest(i), lowest(i+1); v >= 1<<subBits && float64(hi-lo)/float64(lo) > 1.0/(1<<subBits) {
			t.Fatalf("bucket %d = [%d, %d) is wider than 1/%d of its start", i, lo, hi, 1<<subBits)
		}
	}
}

func TestQuantileMatchesSortedSample(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var h, part histogram
	var all []time.Duration
	for i := range 100000 {
		d := time.Duration(r.ExpFloat64() * 50000) // ~50 µs, with a long tail
		all = append(all, d)
		if i%2 == 0 {
			h.record(d)
		} else {
			part.record(d)
		}
	}
	h.merge(&part)
	slices.Sort(all)
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999} {
		want := all[int(q*float64(len(all))+0.999999999)-1]
		got := h.quantile(q)
		if diff := float64(got-want) / float64(want); diff > 0.01 || diff < -0.01 {
			t.Errorf("quantile(%v) = %v, sorted sample says %v", q, got, want)
		}
	}
	var empty histogram
	if got := empty.quantile(0.5); got != 0 {
		t.Errorf("empty histogram's median = %v, want 0", got)
	}
}
