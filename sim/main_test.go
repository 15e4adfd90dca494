package sim

import (
	"flag"
	"os"
	"runtime/debug"
	"testing"
)

// TestMain lets the heap grow four times before collecting: a 200-server run allocates
// millions of short-lived events, and the default spends a third of the CPU in the
// collector. A full run stays under a few hundred MB.
//
// With -scenario FILE and no -run, only TestFleet runs: the user's scenario, not the
// package's other tests.
func TestMain(m *testing.M) {
	debug.SetGCPercent(400)
	flag.Parse()
	if run := flag.Lookup("test.run"); *scenarioFile != "" && run.Value.String() == "" {
		if err := run.Value.Set("^TestFleet$"); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
