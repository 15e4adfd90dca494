package sysclock

import (
	"strings"
	"testing"
	"time"
)

// TestNowMixesWithTimeNow holds Now to what its callers rely on: its instants order and
// subtract with time.Now's on the monotonic clock, carry a monotonic reading (a deadline
// made from one is one), and read as the wall clock did at start plus the time since.
func TestNowMixesWithTimeNow(t *testing.T) {
	var c Clock
	a := c.Now()
	b := time.Now()
	d := c.Now()
	if b.Before(a) || d.Before(b) {
		t.Fatalf("out of order: Now %v, time.Now %v, Now %v", a, b, d)
	}
	if got := d.Sub(a); got < 0 || got > time.Second {
		t.Fatalf("two reads %v apart", got)
	}
	if !strings.Contains(a.String(), " m=") {
		t.Fatal("Now carries no monotonic reading")
	}
	if skew := b.Sub(a.Round(0)); skew < -time.Second || skew > time.Second {
		t.Fatalf("Now's wall reading is %v from time.Now's", skew)
	}
	if got := time.Until(c.Now().Add(time.Hour)); got < 59*time.Minute || got > time.Hour {
		t.Fatalf("an hour from Now is %v from time.Now", got)
	}
}

// TestUnixNanoIsNows: UnixNano reads what Now's instant reads as Unix nanoseconds, between
// the two reads around it (a start of another scale, or a sum off by a second's carry,
// falls outside).
func TestUnixNanoIsNows(t *testing.T) {
	var c Clock
	for range 1000 {
		a := c.Now().UnixNano()
		u := UnixNano()
		b := c.Now().UnixNano()
		if u < a || u > b {
			t.Fatalf("UnixNano %d, outside the Now reads around it, %d and %d", u, a, b)
		}
	}
}
