// Command plot draws the fleet simulator's SVG plots from the JSON-lines report that
// `go test ./sim -args -report FILE` (or `-plots DIR`, as DIR/report.jsonl) writes.
//
// It is a module of its own so that the plotting library and its fonts, PDF and image
// modules stay out of the module graph of services that import fleetlimit. It reads the
// report into its own types, holding only the fields it draws, and never imports package
// sim. Run it from the repository root with absolute paths (go -C changes the directory
// the program runs in to sim/plot):
//
//	go -C sim/plot run . -report "$PWD/report.jsonl" -out "$PWD/docs/sim"
//
// For every scenario of the report it writes <out>/<scenario>.svg, admitted requests per
// second over virtual time for each run against the limit and the demand; for a scenario
// with a Redis outage and hybrid runs, also <out>/<scenario>-breakers.svg, the servers
// whose breaker is not closed and the share of decisions the failure policy made.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	report := flag.String("report", "", "the simulator's JSON-lines report (required)")
	out := flag.String("out", "", "the directory the SVG files are written to (required)")
	flag.Parse()
	if *report == "" || *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: plot -report FILE -out DIR")
		os.Exit(2)
	}
	files, err := renderFile(*report, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
	for _, f := range files {
		fmt.Println(f)
	}
}

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
	Outage    *struct {
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

// renderFile reads the report at path and writes every scenario's plots into dir,
// returning the files it wrote.
func renderFile(path, dir string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	scs, err := readReport(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return render(dir, scs)
}
