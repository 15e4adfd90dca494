package hybrid

import (
	"context"
	"testing"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestRefundAfterCloseIsCounted: a refund queued after Close sent its last ones (a
// request that raced Close found expired tokens) is reported in RefundsLost, not left
// in a queue nobody sends.
func TestRefundAfterCloseIsCounted(t *testing.T) {
	_, c := redistest.Mini(t)
	s, err := global.New(c) // a miniredis of its own
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(s, Config{FleetSize: 1, Limits: []Limit{{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailClosed}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.queueRefund(l.lookup("api"), "k", 3)
	if st := l.Stats(); st.RefundsLost != 3 {
		t.Fatalf("RefundsLost %d after a refund queued past Close, want 3", st.RefundsLost)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.refunds) != 0 {
		t.Fatalf("%d refunds left in the queue after Close", len(l.refunds))
	}
}
