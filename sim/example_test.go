package sim_test

import (
	"fmt"

	"github.com/fleetlimit/fleetlimit/sim"
)

// The source article's abusive client, 100× over a limit of 100/s on a 200-server fleet:
// the naive read-modify-write lets it through six times over, the seed script holds it to
// burst + rate·T. (Hybrid runs need the *testing.T of a test: see TestFleet.)
func ExampleRun() {
	sc := sim.Scenario{Name: "abusive", Servers: 200, Rate: 100, Burst: 100, Demand: 10000, Policy: sim.FailLocal}
	naive, err := sim.Run(nil, sc, sim.Naive)
	if err != nil {
		panic(err)
	}
	script, err := sim.Run(nil, sc, sim.Script)
	if err != nil {
		panic(err)
	}
	fmt.Printf("naive:  %.0f admitted/s, %.1f× the limit\n", naive.AdmittedPerS, naive.AdmittedOverLimit)
	fmt.Printf("script: %.0f admitted/s, within burst + rate·T: %v\n", script.AdmittedPerS, float64(script.Admitted) <= script.Bound)
	// Output:
	// naive:  627 admitted/s, 6.3× the limit
	// script: 110 admitted/s, within burst + rate·T: true
}
