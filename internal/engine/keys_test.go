package engine

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// sendAll makes every round trip the engine has queued, each answered in full.
func sendAll(e *Engine, now time.Time) {
	for t := e.Next(); t != nil; t = e.Next() {
		answerAll(t)
		e.Done(now, t)
	}
}

// TestLongKeysHoldBoundedMemory: a server that sees many distinct keys of a megabyte
// each holds a bounded number of bytes per key, wherever it keeps the key: the key's
// store entry (pre-check, lease), the FailLocal fallback's bucket, a refill waiting to
// be sent and the requests waiting for it, a queued refund, the expiry heap.
func TestLongKeysHoldBoundedMemory(t *testing.T) {
	const keys, keyLen, perKey = 200, 1 << 20, 2048
	var seq uint64
	e, err := New(Config{
		Limits: []LimitConfig{
			{Name: "short", Rate: 100, Burst: 100, Policy: breaker.FailLocal(), LowWatermark: -1, Lifetime: time.Second, MaxKeys: 4 * keys},
			{Name: "long", Rate: 100, Burst: 100, Policy: breaker.FailLocal(), LowWatermark: -1, Lifetime: time.Hour, MaxKeys: 4 * keys},
		},
		Servers: 1, Seed: 1, Shards: 1,
		NextSeq: func() uint64 { seq++; return seq },
	})
	if err != nil {
		t.Fatal(err)
	}
	short, long := e.Limit("short"), e.Limit("long")
	buf := bytes.Repeat([]byte{'k'}, keyLen)
	key := func(i int) string { // a new megabyte each call
		copy(buf, fmt.Sprintf("%08d", i))
		return string(buf)
	}
	e.Tick(t0)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)

	// The requests' callers give up before their refill is answered (denied: a grant
	// pays for what the policy admitted, not for these), so the grants stay on hand: the
	// short limit's expire into the refund queue at the Tick (after five lifetimes: the
	// grants leave the bucket roomy), the long limit's stay in the expiry heap.
	for i := range keys / 2 {
		lm := short
		if i%2 == 1 {
			lm = long
		}
		if _, w := decide(e, t0, lm, key(i), 1); w != nil {
			e.GiveUp(t0, w, ReasonCanceled)
		}
	}
	sendAll(e, t0)
	e.Tick(t0.Add(6 * time.Second))
	// Refills queued and not sent, with their requests waiting.
	var waiters []*Waiter
	for i := keys / 2; i < keys; i++ {
		if _, w := decide(e, t0.Add(6*time.Second), long, key(i), 1); w != nil {
			waiters = append(waiters, w)
		}
	}
	e.mu.Lock()
	held := fmt.Sprintf("%d refunds queued, %d expiries, %d refills pending", len(e.refunds), len(e.expiries), len(e.pending))
	if len(e.refunds) == 0 || len(e.expiries) == 0 || len(e.pending) == 0 {
		t.Errorf("the engine holds %s: the test covers less than it says", held)
	}
	e.mu.Unlock()

	runtime.GC()
	runtime.ReadMemStats(&after)
	retained := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d keys of %d bytes (%s, %d waiting): %d bytes retained, %d per key",
		keys, keyLen, held, len(waiters), retained, retained/keys)
	if retained > keys*perKey {
		t.Errorf("%d bytes retained for %d keys (%d per key), want at most %d per key", retained, keys, retained/keys, perKey)
	}
	runtime.KeepAlive(e)
	runtime.KeepAlive(waiters)
	runtime.KeepAlive(buf)
}
