package sim

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var (
	reportFile   = flag.String("report", "", "write one JSON object per (scenario, strategy) to this file")
	plotsDir     = flag.String("plots", "", "write the report to DIR/report.jsonl and log the command that draws its SVG plots into DIR")
	seedFlag     = flag.Uint64("seed", 1, "seed of every built-in scenario")
	onlyFlag     = flag.String("only", "", "run only these built-in scenarios (comma-separated names)")
	scenarioFile = flag.String("scenario", "", "run only the scenario in this JSON file (sim.Scenario's field names) under every strategy, instead of the built-ins")
	longFlag     = flag.Bool("long", false, "also run the long suites: the real processes beside the simulator (TestAsyncProcesses, TestWindowProcesses), and the built-in suites' hybrid runs on the real scripts on miniredis instead of the Go model")
)

// selected filters the suites by -only, which names suites or their groups; without
// it, every suite but the opt-in ones.
func selected(ss []suite) []suite {
	var out []suite
	for _, s := range ss {
		if *onlyFlag == "" {
			if !s.optIn {
				out = append(out, s)
			}
			continue
		}
		for _, n := range strings.Split(*onlyFlag, ",") {
			if n = strings.TrimSpace(n); s.name == n || s.group != "" && s.group == n {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// outcome is one finished run of a suite.
type outcome struct {
	run
	res Result
	err error
}

// runSuites runs every run of every suite as parallel subtests of t (so GOMAXPROCS of them
// at once) and returns the outcomes by suite, in the suites' order. Hybrid runs go first:
// they are the longest.
func runSuites(t *testing.T, ss []suite) [][]outcome {
	out := make([][]outcome, len(ss))
	for i, s := range ss {
		out[i] = make([]outcome, len(s.runs))
	}
	t.Run("runs", func(t *testing.T) {
		for _, hybridFirst := range []bool{true, false} {
			for i, s := range ss {
				for j, r := range s.runs {
					if (r.st == Hybrid || r.st == HybridAsync || r.st == HybridWindow) != hybridFirst {
						continue
					}
					t.Run(s.name+"/"+r.name(), func(t *testing.T) {
						t.Parallel()
						res, err := Run(t, r.sc, r.st)
						out[i][j] = outcome{run: r, res: res, err: err}
					})
				}
			}
		}
	})
	return out
}

// TestFleet runs the built-in scenarios at 200 servers (20 under -short), prints a table
// per scenario, checks the claims docs/simulation.md makes of them, and writes the report (for
// -plots, into the plots directory) when asked. With -scenario FILE it runs the file's
// scenario instead, as written (-short, -seed and -only do not apply), under every
// strategy, and checks no claim: the claims are about the built-ins.
func TestFleet(t *testing.T) {
	t.Parallel() // beside the other long tests of the package: two cores stay busy
	var ss []suite
	builtin := *scenarioFile == ""
	if builtin {
		sc := fullScale()
		if testing.Short() {
			sc = shortScale()
		}
		ss = selected(suites(sc, *seedFlag))
	} else {
		if *onlyFlag != "" {
			t.Fatal("-only selects built-in scenarios; -scenario runs the file's scenario alone")
		}
		sc, err := readScenario(*scenarioFile)
		if err != nil {
			t.Fatal(err)
		}
		s, note := userSuite(sc)
		if note != "" {
			t.Log(note)
		}
		ss = []suite{s}
	}
	all := runFleet(t, ss, builtin)
	if *reportFile != "" {
		if err := writeReport(*reportFile, ss, all); err != nil {
			t.Fatal(err)
		}
	}
	if *plotsDir != "" {
		cmd, err := writePlotReport(*plotsDir, ss, all)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("plots: draw them from the report with\n\t%s", cmd)
	}
}

// runFleet runs the suites, fails t on a run's error, and logs a table per suite; with
// checked, it also checks the built-in suites' claims.
func runFleet(t *testing.T, ss []suite, checked bool) [][]outcome {
	start := time.Now()
	all := runSuites(t, ss)
	t.Logf("%d runs in %v of wall time", countRuns(ss), time.Since(start).Round(time.Millisecond))
	for i, s := range ss {
		for _, o := range all[i] {
			if o.err != nil {
				t.Fatalf("%s / %s: %v", s.name, o.name(), o.err)
			}
		}
	}
	for i, s := range ss {
		t.Run(s.name, func(t *testing.T) {
			t.Log("\n" + table(s.name, all[i]))
			if check := checks[s.name]; checked && check != nil {
				check(t, all[i])
			}
		})
	}
	return all
}

// writePlotReport writes the report into dir as report.jsonl and returns the command,
// to run from anywhere, that draws the plots from it into dir: the renderer is the
// nested module sim/plot, which keeps the plotting library out of the root module.
func writePlotReport(dir string, ss []suite, all [][]outcome) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", err
	}
	report := filepath.Join(abs, "report.jsonl")
	if err := writeReport(report, ss, all); err != nil {
		return "", err
	}
	module, err := filepath.Abs("plot") // tests run in the package's directory, sim/
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("go -C %s run . -report %s -out %s", shellQuote(module), shellQuote(report), shellQuote(abs)), nil
}

// shellQuote quotes s for a POSIX shell when it holds anything but plain path characters.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:,@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func countRuns(ss []suite) int {
	n := 0
	for _, s := range ss {
		n += len(s.runs)
	}
	return n
}

func writeReport(path string, ss []suite, all [][]outcome) error {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for i := range ss {
		for _, o := range all[i] {
			r := o.res
			r.Scenario = ss[i].name
			r.Strategy = o.name()
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// header states a suite's fixed parameters (taken from its first run).
func header(name string, o outcome) string {
	sc, _ := o.sc.withDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d servers, limit %s/s burst %s per key, demand %s/s %s",
		name, sc.Servers, num(sc.Rate), num(float64(sc.Burst)), num(sc.Demand), sc.Pattern)
	if sc.Keys > 1 {
		fmt.Fprintf(&b, " over %d keys (Zipf s=%.1f)", sc.Keys, sc.ZipfS)
	}
	lb := "uniform LB"
	switch sc.Balancer {
	case Skewed:
		lb = "skewed LB (half the requests to 10% of the servers)"
	case Sticky:
		lb = "sticky LB (every request to one server)"
	}
	fmt.Fprintf(&b, ", %s, RTT %v±%v, Redis %v per script call, T %v",
		lb, sc.RTT, sc.Jitter, sc.ScriptTime, sc.Duration)
	if w := sc.Outage; w.End > w.Start {
		fmt.Fprintf(&b, ", Redis down %v-%v, call deadline %v, max wait %v", w.Start, w.End, sc.Breaker.Timeout, sc.MaxWait)
	}
	if w := sc.Partition; w.End > w.Start {
		fmt.Fprintf(&b, ", %d servers cut off from Redis %v-%v, call deadline %v, max wait %v", sc.PartitionServers, w.Start, w.End, sc.Breaker.Timeout, sc.MaxWait)
	}
	if sc.Masters > 1 {
		fmt.Fprintf(&b, ", %d Redis masters", sc.Masters)
	}
	if w := sc.MasterDown; w.End > w.Start {
		fmt.Fprintf(&b, ", master %d down %v-%v, call deadline %v, max wait %v", sc.DownMaster, w.Start, w.End, sc.Breaker.Timeout, sc.MaxWait)
	}
	if w := sc.Starve; w.End > w.Start {
		fmt.Fprintf(&b, ", %d servers scheduled %v in every %v from %v to %v, call deadline %v, max wait %v",
			sc.StarvedServers, sc.StarveRun, sc.StarvePeriod, w.Start, w.End, sc.Breaker.Timeout, sc.MaxWait)
	}
	for _, c := range sc.Churn {
		fmt.Fprintf(&b, ", %d servers at %v", c.Servers, c.At)
	}
	if sc.Heartbeat > 0 {
		fmt.Fprintf(&b, ", heartbeats every %v", sc.Heartbeat)
	}
	fmt.Fprintf(&b, "\nbound burst+rate·T = %s per key, floor 90%% of rate·T = %s\n",
		num(sc.bound()), num(0.9*sc.Rate*sc.Duration.Seconds()))
	return b.String()
}

// num prints a count compactly: 150000 -> 150,000.
func num(x float64) string {
	if x != float64(int64(x)) {
		return fmt.Sprintf("%.3g", x)
	}
	s := fmt.Sprintf("%d", int64(x))
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// table prints a suite as one readable table.
func table(name string, runs []outcome) string {
	var b strings.Builder
	b.WriteString(header(name, runs[0]))
	fmt.Fprintf(&b, "%-26s %11s %9s %9s %10s %10s %6s %9s %9s %9s %8s\n",
		"strategy", "admitted/s", "adm/limit", "adm/bound", "calls/req", "trips/req", "busy", "p50 µs", "p99 µs", "max µs", "wall s")
	for _, o := range runs {
		r := o.res
		fmt.Fprintf(&b, "%-26s %11s %9.4f %9.4f %10.4f %10.4f %5.1f%% %9.0f %9.0f %9.0f %8.1f\n",
			o.name(), num(float64(int64(r.AdmittedPerS))), r.AdmittedOverLimit, maxKey(r), r.RedisCallsPerRequest,
			r.RedisRoundTripsPerRequest, 100*r.RedisBusy, r.P50DecisionUS, r.P99DecisionUS, r.MaxDecisionUS, r.WallMS/1000)
	}
	if runs[0].res.Keys > 1 {
		b.WriteString("adm/limit is admitted / Σ min(requests, bound) over keys; adm/bound is the hottest key's\n")
		for _, o := range runs {
			fmt.Fprintf(&b, "  %-26s keys within their limit got %.2f%% of their requests through\n", o.name()+":", 100*o.res.UnderLimitAdmitted)
		}
	}
	for _, o := range runs {
		if r := o.res; r.Masters > 1 {
			fmt.Fprintf(&b, "  %-30s masters busy", o.name()+":")
			for _, x := range r.MasterBusy {
				fmt.Fprintf(&b, " %.1f%%", 100*x)
			}
			fmt.Fprintf(&b, ", busiest/mean %.2f, round trips", busiestOverMean(r.MasterBusy))
			for _, x := range r.MasterRoundTrips {
				fmt.Fprintf(&b, " %s", num(float64(x)))
			}
			fmt.Fprintf(&b, ", policy %.2f%%\n", 100*r.PolicyShare)
		}
	}
	for _, o := range runs {
		r := o.res
		if u, during := r.fault(); u != nil {
			ratio := "" // one key's limit says nothing of the admissions of many
			if r.Keys == 1 {
				ratio = fmt.Sprintf(" (%.3f× limit)", u.OverLimit)
			}
			fmt.Fprintf(&b, "  during %s, %-26s admitted %s/s of %s/s demand%s, p99 %.0f µs, max %.0f µs, %d Redis calls",
				during, o.name()+":", num(float64(int64(u.AdmittedPerS))), num(float64(int64(u.DemandPerS))), ratio,
				u.P99DecisionUS, u.MaxDecisionUS, u.CallsDuring)
			if u.BreakerOpenS >= 0 && r.BreakerTransitions > 0 {
				fmt.Fprintf(&b, ", first breaker open after %.0f ms, last closed %.2f s after", 1000*u.BreakerOpenS, u.BreakerClosedS)
			}
			if r.Policy != "" { // a hybrid run: the others have no policy and no breaker
				fmt.Fprintf(&b, "\n    policy decided %.2f%%; the servers it acts on: breakers opened %d times, %d timeouts of which %d starved (not counted), %s granted tokens unread (%s read late)",
					100*u.PolicyShare, u.BreakerOpens, u.Timeouts, u.StarvedTimeouts, num(float64(u.GrantsUnread)), num(float64(u.GrantsReadLate)))
				if len(u.MasterPolicyShare) > 0 {
					b.WriteString("; policy share by master's keys:")
					for _, x := range u.MasterPolicyShare {
						fmt.Fprintf(&b, " %.2f%%", 100*x)
					}
				}
			}
			fmt.Fprintf(&b, "\n    decisions: %v\n", u.Sources)
		}
	}
	return b.String()
}

// maxKey is the hottest key's admissions over burst + rate·T.
func maxKey(r Result) float64 { return r.HottestKeyOverBound }
