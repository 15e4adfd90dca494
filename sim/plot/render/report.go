// Package render draws the fleet simulator's JSON-lines report (what
// `go test ./sim -args -report FILE` writes) as SVG plots and as one HTML page that holds
// the tables and the plots.
//
// It reads the report into its own types, holding only the fields it shows, and never
// imports package sim: the simulator and the plotting library stay out of each other's
// module graphs.
package render

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// run is one line of the report: one scenario under one strategy, with the fields the
// plots use. Its JSON names are those of sim.Result.
type run struct {
	Scenario  string  `json:"scenario"`
	Strategy  string  `json:"strategy"`
	Policy    string  `json:"policy"` // set for hybrid runs only
	Servers   int     `json:"servers"`
	LimitPerS float64 `json:"limit_per_s"`
	Burst     int     `json:"burst"`
	Keys      int     `json:"keys"`
	DurationS float64 `json:"duration_s"`
	BinS      float64 `json:"bin_s"`
	Timeline  []bin   `json:"timeline"`

	// The figures of the scenario's table.
	DemandPerS                float64 `json:"demand_per_s"`
	AdmittedPerS              float64 `json:"admitted_per_s"`
	AdmittedOverLimit         float64 `json:"admitted_over_limit"`
	HottestKeyOverBound       float64 `json:"hottest_key_over_bound"`
	RedisCallsPerRequest      float64 `json:"redis_calls_per_request"`
	RedisRoundTripsPerRequest float64 `json:"redis_round_trips_per_request"`
	RedisBusy                 float64 `json:"redis_busy"`
	P50DecisionUS             float64 `json:"p50_decision_us"`
	P99DecisionUS             float64 `json:"p99_decision_us"`
	MaxDecisionUS             float64 `json:"max_decision_us"`
	Outage                    *struct {
		StartS float64 `json:"start_s"`
		EndS   float64 `json:"end_s"`
	} `json:"outage"`
}

// bin is one slice of a run's timeline.
type bin struct {
	AtS           float64 `json:"at_s"`
	AdmittedPerS  float64 `json:"admitted_per_s"`
	DemandPerS    float64 `json:"demand_per_s"`
	FallbackShare float64 `json:"fallback_share"`
	BreakersOpen  int     `json:"breakers_open"`
}

// scenario is the runs of one scenario, in the report's order.
type scenario struct {
	name string
	runs []run
}

// readReport reads a JSON-lines report and groups its runs by scenario, in the order the
// scenarios first appear.
func readReport(r io.Reader) ([]scenario, error) {
	var out []scenario
	index := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 64<<20)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var ru run
		if err := json.Unmarshal(sc.Bytes(), &ru); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if err := ru.check(); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		i, ok := index[ru.Scenario]
		if !ok {
			i = len(out)
			index[ru.Scenario] = i
			out = append(out, scenario{name: ru.Scenario})
		}
		out[i].runs = append(out[i].runs, ru)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("the report holds no runs")
	}
	return out, nil
}

// check rejects a line that is not a simulator run, and a scenario name that would not
// make a file name inside the output directory.
func (r *run) check() error {
	switch {
	case r.Scenario == "" || r.Scenario == "." || r.Scenario == ".." || strings.ContainsAny(r.Scenario, `/\`):
		return fmt.Errorf("scenario name %q cannot name a file", r.Scenario)
	case len(r.Timeline) == 0:
		return fmt.Errorf("%s / %s: no timeline", r.Scenario, r.Strategy)
	case !(r.BinS > 0) || !(r.DurationS > 0):
		return fmt.Errorf("%s / %s: bin_s %v and duration_s %v must be positive", r.Scenario, r.Strategy, r.BinS, r.DurationS)
	}
	return nil
}

// SVG reads the report at path and writes every scenario's plots into dir, returning the
// files it wrote: <dir>/<scenario>.svg, admitted requests per second over virtual time for
// each run against the limit and the demand; for a scenario with a Redis outage and
// hybrid runs, also <dir>/<scenario>-breakers.svg, the servers whose breaker is not
// closed and the share of decisions the failure policy made.
func SVG(path, dir string) ([]string, error) {
	scs, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return render(dir, scs)
}

// readFile reads the report at path.
func readFile(path string) ([]scenario, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	scs, err := readReport(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return scs, nil
}
