package main

import (
	"math/bits"
	"time"
)

// subBits is the number of mantissa bits a histogram bucket keeps: 2^subBits buckets per
// power of two, so a recorded duration is off by less than 1/2^subBits (under 1%).
const subBits = 7

// histogram counts durations in log-linear buckets. Recording is a few instructions
// and never allocates, so a goroutine can time every decision it makes.
type histogram struct {
	counts [64 << subBits]uint64
	n      uint64
}

// bucket returns the index of the bucket holding v nanoseconds.
func bucket(v uint64) int {
	if v < 1<<subBits {
		return int(v) // exact below 2^subBits ns
	}
	e := bits.Len64(v) - subBits - 1 // how far v is shifted to keep subBits+1 bits
	return (e+1)<<subBits + int(v>>uint(e)) - 1<<subBits
}

// lowest returns the smallest value that falls in bucket i.
func lowest(i int) uint64 {
	if i < 1<<subBits {
		return uint64(i)
	}
	e := i>>subBits - 1
	m := uint64(i&(1<<subBits-1)) | 1<<subBits
	return m << uint(e)
}

// record adds one duration; negative ones count as 0.
func (h *histogram) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucket(uint64(d))]++
	h.n++
}

// merge adds o's counts to h.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile returns the duration below which a fraction q (0 to 1) of the recorded ones
// lie: the middle of the bucket holding the ⌈q·n⌉-th smallest. It is 0 when h is empty.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.999999999)
	rank = max(1, min(rank, h.n))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := lowest(i), lowest(i+1)
			return time.Duration(lo + (hi-lo)/2)
		}
	}
	return time.Duration(lowest(len(h.counts) - 1))
}
