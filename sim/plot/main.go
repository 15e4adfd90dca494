// Command plot draws the fleet simulator's report, the JSON-lines file that
// `go test ./sim -args -report FILE` (or `-plots DIR`, as DIR/report.jsonl) writes: SVG
// plots, and with -html one page that holds the tables and the plots.
//
// It is a module of its own so that the plotting library and its fonts, PDF and image
// modules stay out of the module graph of services that import fleetlimit; the drawing is
// package render, which `fleetlimit simulate` uses too. Run it from the repository root
// with absolute paths (go -C changes the directory the program runs in to sim/plot):
//
//	go -C sim/plot run . -report "$PWD/report.jsonl" -out "$PWD/docs/sim"
//
// For every scenario of the report it writes <out>/<scenario>.svg, admitted requests per
// second over virtual time for each run against the limit and the demand; for a scenario
// with a Redis outage and hybrid runs, also <out>/<scenario>-breakers.svg, the servers
// whose breaker is not closed and the share of decisions the failure policy made. With
// -html it writes <out>/index.html as well, the page that shows them beside each
// scenario's table.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/fleetlimit/fleetlimit/sim/plot/render"
)

func main() {
	report := flag.String("report", "", "the simulator's JSON-lines report (required)")
	out := flag.String("out", "", "the directory the SVG files are written to (required)")
	html := flag.Bool("html", false, "also write <out>/index.html: each scenario's table and plots on one page")
	flag.Parse()
	if *report == "" || *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: plot -report FILE -out DIR [-html]")
		os.Exit(2)
	}
	draw := render.SVG
	if *html {
		draw = func(report, out string) ([]string, error) { return render.HTML(report, out, render.Page{}) }
	}
	files, err := draw(*report, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
	for _, f := range files {
		fmt.Println(f)
	}
}
