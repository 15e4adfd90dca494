package sim

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestMain lets the heap grow four times before collecting: a 200-server run allocates
// millions of short-lived events, and the default spends a third of the CPU in the
// collector. A full run stays under a few hundred MB.
func TestMain(m *testing.M) {
	debug.SetGCPercent(400)
	os.Exit(m.Run())
}
