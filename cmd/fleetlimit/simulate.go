package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/sim/plot/render"
)

// rootModule is the module whose simulator simulate runs.
const rootModule = "github.com/fleetlimit/fleetlimit"

// simulate runs a scenario file through the fleet simulator and writes the page of its
// tables and plots: `fleetlimit simulate FILE -out DIR [-src DIR]`.
//
// The simulator is package sim's test TestFleet, which nothing imports (it drives the
// engine hybrid.Limiter drives, with a virtual clock and a modelled Redis); simulate runs
// it as `go test ./sim -args -scenario FILE -report DIR/report.jsonl` in fleetlimit's
// source, so it needs the Go toolchain, which building the command took. The source is -src,
// else the checkout the working directory is in, else the module this command was built
// with, from the module cache.
func simulate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "the directory the page (index.html), its plots and the report are written to (required)")
	src := fs.String("src", "", "fleetlimit's source directory (default: the checkout the working directory is in, else the module cache)")
	timeout := fs.Duration("timeout", 30*time.Minute, "how long the simulation may take")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fleetlimit simulate FILE -out DIR [-src DIR] [-timeout D]\n\nFILE is a scenario: a JSON object of sim.Scenario's fields (docs/simulation.md, \"Modelling your own fleet\").")
		fs.PrintDefaults()
	}
	// FILE may come before the flags or after them.
	var files []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		files, rest = append(files, fs.Arg(0)), fs.Args()[1:]
	}
	if len(files) != 1 || *out == "" {
		fs.Usage()
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "fleetlimit simulate: -timeout %v: want a positive duration\n", *timeout)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := runSimulation(ctx, files[0], *out, *src, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "fleetlimit simulate:", err)
		return 1
	}
	return 0
}

// runSimulation checks that file holds a JSON object, runs it through the simulator of
// the source at src (found when empty) and writes out/report.jsonl, the plots and
// out/index.html, whose path it prints.
func runSimulation(ctx context.Context, file, out, src string, stdout, stderr io.Writer) error {
	file, err := filepath.Abs(file)
	if err != nil {
		return err
	}
	if out, err = filepath.Abs(out); err != nil {
		return err
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return fmt.Errorf("%s is not a scenario (a JSON object of sim.Scenario's fields, as sim/testdata/example.json): %w", file, err)
	}
	if src, err = source(ctx, src); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	report := filepath.Join(out, "report.jsonl")
	fmt.Fprintf(stderr, "running the simulator (go test ./sim in %s) on %s\n", src, file)
	logs, err := runSim(ctx, src, file, report)
	if err != nil {
		return err
	}
	files, err := render.HTML(report, out, render.Page{Title: "fleetlimit simulation: " + filepath.Base(file), Text: logs})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, files[len(files)-1])
	return nil
}

// simulatorGrace is how long past -timeout the simulator's process may live when it
// was not killed with go test, and how long the command waits for go test's output once
// it is killed.
const simulatorGrace = 10 * time.Second

// runSim runs TestFleet on the scenario file in the source at src, writing the report,
// and returns what the simulator logged per scenario: its table, after the notes it
// logged for the run as a whole. A scenario the simulator refuses, or any other failure,
// is an error holding what the test printed.
func runSim(ctx context.Context, src, file, report string) (map[string]string, error) {
	var stdout, stderr bytes.Buffer
	limit := "0" // none
	if d, ok := ctx.Deadline(); ok {
		// The simulator's own bound, a little past ctx's: a simulator that outlived its
		// go test (ownGroup does not reach it everywhere) ends by itself.
		limit = max(time.Until(d)+simulatorGrace, time.Second).Round(time.Second).String()
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-json", "-count=1", "-timeout="+limit, "-run=^TestFleet$", "./sim",
		"-args", "-scenario", file, "-report", report)
	cmd.Dir = src
	ownGroup(cmd)
	cmd.WaitDelay = simulatorGrace // Wait returns, pipes held open or not
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	if errors.Is(runErr, exec.ErrNotFound) {
		return nil, fmt.Errorf("the simulator runs with the Go toolchain (go test), and go is not on PATH: %w", runErr)
	}
	logs, failed := testLogs(&stdout)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("the simulation did not end within -timeout: %w", ctx.Err())
	}
	if runErr != nil {
		msg := strings.TrimSpace(failed + "\n" + stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		return nil, fmt.Errorf("the simulator refused %s or failed (%w):\n%s", file, runErr, msg)
	}
	return logs, nil
}

// testEvent is a line of `go test -json`.
type testEvent struct {
	Action string
	Test   string
	Output string
}

// logPrefix is how the testing package starts a logged message: its file and line.
var logPrefix = regexp.MustCompile(`^\s+\w+\.go:\d+: `)

// testLogs reads `go test -json` output: what each subtest TestFleet/<scenario> logged,
// prefixed by what TestFleet itself logged, and every logged line of the run (the
// failures' messages among them) for an error.
func testLogs(r io.Reader) (logs map[string]string, all string) {
	var top strings.Builder
	var every strings.Builder
	per := map[string]*strings.Builder{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var e testEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			every.WriteString(sc.Text() + "\n")
			continue
		}
		if e.Action != "output" && e.Action != "build-output" {
			continue
		}
		line := e.Output
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") ||
			t == "PASS" || t == "FAIL" || strings.HasPrefix(t, "exit status ") || strings.HasPrefix(t, "ok ") || strings.HasPrefix(t, "FAIL\t") {
			continue
		}
		every.WriteString(line)
		line = logPrefix.ReplaceAllString(line, "")
		line = strings.TrimPrefix(line, "        ") // a logged message's next lines
		switch name, ok := strings.CutPrefix(e.Test, "TestFleet/"); {
		case e.Test == "TestFleet":
			if !strings.Contains(line, " runs in ") { // the wall time: not the scenario's
				top.WriteString(line)
			}
		case ok && !strings.Contains(name, "/"):
			if per[name] == nil {
				per[name] = &strings.Builder{}
			}
			per[name].WriteString(line)
		}
	}
	logs = map[string]string{}
	for name, b := range per {
		logs[name] = strings.TrimLeft(top.String()+b.String(), "\n")
	}
	return logs, every.String()
}

// source returns the directory of fleetlimit's source whose simulator simulate runs: dir
// if set, else the checkout the working directory is in, else the version of the module
// this command was built with, downloaded into the module cache.
func source(ctx context.Context, dir string) (string, error) {
	if dir != "" {
		d, err := filepath.Abs(dir)
		if err == nil {
			err = isSource(d)
		}
		return d, err
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if isSource(d) == nil {
				return d, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path != rootModule {
				continue
			}
			if dep.Replace != nil {
				dep = dep.Replace
			}
			if dep.Version == "" { // replaced by a directory
				if filepath.IsAbs(dep.Path) && isSource(dep.Path) == nil {
					return dep.Path, nil
				}
				break
			}
			return download(ctx, dep.Path+"@"+dep.Version)
		}
	}
	return "", errors.New("cannot find fleetlimit's source to run its simulator: run in a checkout of " + rootModule + " or pass -src DIR")
}

// isSource reports why dir is not the root of fleetlimit's source with its simulator.
func isSource(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return fmt.Errorf("%s is not fleetlimit's source: %w", dir, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if path, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			if strings.Trim(strings.TrimSpace(path), `"`) != rootModule {
				return fmt.Errorf("%s holds module %s, not %s", dir, path, rootModule)
			}
			if st, err := os.Stat(filepath.Join(dir, "sim")); err != nil || !st.IsDir() {
				return fmt.Errorf("%s holds no simulator (sim/)", dir)
			}
			return nil
		}
	}
	return fmt.Errorf("%s/go.mod names no module", dir)
}

// download fetches module@version into the module cache and returns its directory.
func download(ctx context.Context, mv string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", mv)
	cmd.Dir = os.TempDir() // outside any module
	b, err := cmd.Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(b, &m); jerr == nil && m.Error != "" {
		return "", fmt.Errorf("go mod download %s: %s", mv, m.Error)
	}
	if err != nil {
		return "", fmt.Errorf("go mod download %s (the simulator's source): %w", mv, err)
	}
	if err := isSource(m.Dir); err != nil {
		return "", err
	}
	return m.Dir, nil
}
