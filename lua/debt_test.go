package lua_test

import (
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/lua"
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
		got := run(t, c, lua.Take, key, 10, 1, s.want, s.min, "s", i+1, 0, s.floor)
		if got[0] != s.granted || num(t, got[1]) != s.left || got[2] != s.waitMS {
			t.Fatalf("step %d: %v, want granted %d, left %v, wait %d ms", i, got, s.granted, s.left, s.waitMS)
		}
		if ttl := m.TTL(key); ttl != s.ttl {
			t.Errorf("step %d: TTL %v, want %v", i, ttl, s.ttl)
		}
	}
}

// TestRefundDebt: a negative refund charges the bucket against its refill since its last
// use before the cap. A bucket idle through an outage has the refill to pay for what
// the servers admitted meanwhile; one kept drained goes below zero, never below
// -capacity; ts stays, so a second debt charges the same refill, not a new one.
func TestRefundDebt(t *testing.T) {
	for _, tt := range []struct {
		name  string
		idle  time.Duration // between the last take and the debts
		debts []int
		left  []float64 // after each debt
	}{
		// Drained at t0, charged at once: below zero.
		{"drained", 0, []int{-4, -4}, []float64{-4, -8}},
		// Never below -capacity.
		{"capped", 0, []int{-8, -8}, []float64{-8, -10}},
		// Idle 30 s at 1/s: 30 tokens of refill, 10 kept by the cap; debts of 25 in all
		// are paid by it, the next 10 take it to 5 - 10 = -5.
		{"idle", 30 * time.Second, []int{-10, -10, -5, -10}, []float64{10, 10, 5, -5}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, c := redistest.Mini(t)
			m.SetTime(t0)
			key := "debt"
			run(t, c, lua.Take, key, 10, 1, 10, 10, "s", 1, 0) // drained
			m.SetTime(t0.Add(tt.idle))
			for i, d := range tt.debts {
				got := run(t, c, lua.Refund, key, 10, 1, d, "s", i+1, 0)
				if num(t, got[0]) != tt.left[i] {
					t.Fatalf("debt %d of %d: %v left, want %v", i, d, got[0], tt.left[i])
				}
			}
			// Then it refills from there at 1/s.
			m.SetTime(t0.Add(tt.idle + 2*time.Second))
			want := min(10, tt.left[len(tt.left)-1]+2)
			if got := run(t, c, lua.Take, key, 10, 1, 1, 1, "s", 99, 0, 10); num(t, got[1]) != want-1 {
				t.Fatalf("2 s later a take of 1 left %v, want %v", got[1], want-1)
			}
		})
	}
}
