package luascript_test

import (
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestTakeFloor: a take with a floor may leave the bucket below zero, down to -floor, and
// answers how long until it is back at zero; the next takes wait for that; the TTL lasts
// until the bucket is full again.
func TestTakeFloor(t *testing.T) {
	m, c := redistest.Mini(t)
	m.SetTime(t0)
	key := "floor"
	steps := []struct {
		at               time.Duration
		want, min, floor int
		granted          int64
		left             float64
		waitMS           int64
		ttl              time.Duration
	}{
		{0, 8, 8, 0, 8, 2, 0, 11 * time.Second},                   // 10 at 1/s: 2 left
		{0, 5, 5, 0, 0, 2, 3000, 11 * time.Second},                // not without a floor
		{0, 5, 5, 10, 5, -3, 3000, 14 * time.Second},              // with one: 3 s below zero
		{0, 8, 8, 10, 0, -3, 1000, 14 * time.Second},              // -3 - 8 is below -10: wait until -2
		{2 * time.Second, 1, 1, 0, 0, -1, 2000, 12 * time.Second}, // refilled to -1: nothing without a floor
	}
	for i, s := range steps {
		m.SetTime(t0.Add(s.at))
		got := run(t, c, luascript.Take, key, 10, 1, s.want, s.min, "s", i+1, 0, s.floor)
		if got[0] != s.granted || num(t, got[1]) != s.left || got[2] != s.waitMS {
			t.Fatalf("step %d: %v, want granted %d, left %v, wait %d ms", i, got, s.granted, s.left, s.waitMS)
		}
		if ttl := m.TTL(key); ttl != s.ttl {
			t.Errorf("step %d: TTL %v, want %v", i, ttl, s.ttl)
		}
	}
}

// TestRefundDebt: a negative refund charges the bucket, below zero if need be, never
// below -floor. The refill the bucket lost to its cap since the debtor's reference (the
// credit its take saw) is forgiven first: a bucket that sat full through an outage paid
// for what the servers admitted meanwhile; one kept drained did not. Forgiven refill is
// spent: it pays no second debt.
func TestRefundDebt(t *testing.T) {
	for _, tt := range []struct {
		name  string
		idle  time.Duration // between the take that drained the bucket and the debts
		ref   bool          // the debts carry the take's credit as their reference
		debts []int
		left  []float64 // after each debt
	}{
		// Drained at t0, charged at once: below zero.
		{"drained", 0, true, []int{-4, -4}, []float64{-4, -8}},
		// Never below -floor (the burst by default).
		{"capped", 0, true, []int{-8, -8}, []float64{-8, -10}},
		// Idle 30 s at 1/s: 30 tokens of refill, 10 kept by the cap, 20 lost; debts of 25
		// in all are forgiven 20, the last 10 take the bucket to 5 - 10 = -5.
		{"idle", 30 * time.Second, true, []int{-10, -10, -5, -10}, []float64{10, 10, 5, -5}},
		// The same without a reference: nothing is forgiven.
		{"idle, no reference", 30 * time.Second, false, []int{-10, -10}, []float64{0, -10}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, c := redistest.Mini(t)
			m.SetTime(t0)
			key := "debt"
			drained := run(t, c, luascript.Take, key, 10, 1, 10, 10, "s", 1, 0)
			m.SetTime(t0.Add(tt.idle))
			for i, d := range tt.debts {
				args := []any{10, 1, d, "s", i + 1, 0, 10}
				if tt.ref {
					args = append(args, drained[6])
				}
				got := run(t, c, luascript.Refund, key, args...)
				if num(t, got[0]) != tt.left[i] {
					t.Fatalf("debt %d of %d: %v left, want %v", i, d, got[0], tt.left[i])
				}
			}
			// Then it refills from there at 1/s.
			m.SetTime(t0.Add(tt.idle + 2*time.Second))
			want := min(10, tt.left[len(tt.left)-1]+2)
			if got := run(t, c, luascript.Take, key, 10, 1, 1, 1, "s", 99, 0, 10); num(t, got[1]) != want-1 {
				t.Fatalf("2 s later a take of 1 left %v, want %v", got[1], want-1)
			}
		})
	}
}
