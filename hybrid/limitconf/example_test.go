package limitconf_test

import (
	"fmt"

	"github.com/fleetlimit/fleetlimit/hybrid/limitconf"
)

// Limits from a JSON document, for hybrid.New's Config.Limits or Limiter.Reconfigure
// (Load reads a file, LoadEnv an environment variable).
func Example() {
	limits, err := limitconf.Parse([]byte(`{"limits": [
		{"name": "api", "rate": "100/s", "burst": 200, "policy": "local"},
		{"name": "signup", "rate": "5/h", "burst": 5, "policy": "closed", "dry_run": true}
	]}`))
	if err != nil {
		panic(err)
	}
	for _, l := range limits {
		fmt.Printf("%s: %.4g/s, burst %d, %v, dry run %v\n", l.Name, l.Rate, l.Burst, l.Policy, l.DryRun)
	}
	_, err = limitconf.Parse([]byte("{\"limits\": [\n  {\"name\": \"api\", \"rate\": \"100/y\", \"burst\": 1, \"policy\": \"open\"}]}"))
	fmt.Println(err)
	// Output:
	// api: 100/s, burst 200, fail-local, dry run false
	// signup: 0.001389/s, burst 5, fail-closed, dry run true
	// limitconf: invalid configuration: line 2: limit "api": rate "100/y": unknown period "y" (s, m, h, d, or a duration such as 10m)
}
