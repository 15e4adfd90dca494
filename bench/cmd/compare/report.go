package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
)

// rawLine is one line of the raw JSON-lines output: the environment first, then one
// run per line.
type rawLine struct {
	Env *Env `json:"env,omitempty"`
	Run *Run `json:"run,omitempty"`
}

// writeRaw writes env and runs as JSON lines.
func writeRaw(w io.Writer, env Env, runs []Run) error {
	enc := json.NewEncoder(w)
	if err := enc.Encode(rawLine{Env: &env}); err != nil {
		return fmt.Errorf("write raw: %w", err)
	}
	for i := range runs {
		if err := enc.Encode(rawLine{Run: &runs[i]}); err != nil {
			return fmt.Errorf("write raw: %w", err)
		}
	}
	return nil
}

// readRaw reads what writeRaw wrote.
func readRaw(r io.Reader) (Env, []Run, error) {
	var env Env
	var runs []Run
	seenEnv := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var l rawLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return env, nil, fmt.Errorf("raw line %d: %w", n, err)
		}
		switch {
		case l.Env != nil:
			env, seenEnv = *l.Env, true
		case l.Run != nil:
			runs = append(runs, *l.Run)
		}
	}
	if err := sc.Err(); err != nil {
		return env, nil, fmt.Errorf("read raw: %w", err)
	}
	if !seenEnv {
		return env, nil, errors.New("read raw: no environment line")
	}
	return env, runs, nil
}

// Row is the figures of one rival, scenario and goroutine count over its repeats: the
// median of each figure, except the worst (largest) admitted/bound and failure share.
type Row struct {
	Rival      string
	Scenario   string
	Goroutines int
	Repeats    int
	DecPerS    float64
	AllocsDec  float64
	P50, P99   float64 // µs
	CallsDec   float64 // Redis commands executed per decision (INFO commandstats)
	TripsDec   float64 // round trips per decision (client side)
	CPUDec     float64 // Redis CPU per decision, µs
	AdmReq     float64 // admitted / requested, median
	AdmBound   float64 // admitted / bound, worst repeat; NaN when the rival limits nothing
	FailShare  float64 // (failed + fell back) / requested, worst repeat
	FirstError string
}

// rows groups runs into rows, in the order of rivals, then scenarios, then goroutines.
func rows(runs []Run, bounded map[string]bool) []Row {
	type id struct {
		rival, scenario string
		g               int
	}
	var order []id
	groups := make(map[id][]Run)
	for _, r := range runs {
		k := id{r.Rival, r.Scenario, r.Goroutines}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	out := make([]Row, 0, len(order))
	for _, k := range order {
		g := groups[k]
		row := Row{Rival: k.rival, Scenario: k.scenario, Goroutines: k.g, Repeats: len(g), AdmBound: math.NaN()}
		per := func(f func(Run) float64) float64 {
			v := make([]float64, len(g))
			for i, r := range g {
				v[i] = f(r)
			}
			return median(v)
		}
		perDec := func(f func(Run) float64) float64 {
			return per(func(r Run) float64 { return ratio(f(r), float64(r.Decisions())) })
		}
		row.DecPerS = per(func(r Run) float64 { return ratio(float64(r.Decisions()), r.ElapsedS) })
		row.AllocsDec = perDec(func(r Run) float64 { return float64(r.Mallocs) })
		row.P50 = per(func(r Run) float64 { return float64(r.P50Ns) / 1e3 })
		row.P99 = per(func(r Run) float64 { return float64(r.P99Ns) / 1e3 })
		row.CallsDec = perDec(func(r Run) float64 { return float64(r.RedisCalls) })
		row.TripsDec = perDec(func(r Run) float64 { return float64(r.RoundTrips) })
		row.CPUDec = perDec(func(r Run) float64 { return r.RedisCPUS * 1e6 })
		row.AdmReq = per(func(r Run) float64 { return ratio(float64(r.Admitted), float64(r.Requested())) })
		for _, r := range g {
			if bounded[r.Rival] && r.Keys == 1 {
				row.AdmBound = nanMax(row.AdmBound, float64(r.Admitted)/r.Bound())
			}
			row.FailShare = max(row.FailShare, ratio(float64(r.Failed+r.FellBack), float64(r.Requested())))
			if row.FirstError == "" {
				row.FirstError = r.FirstError
			}
		}
		out = append(out, row)
	}
	return out
}

// median returns the median of v (the mean of the middle two for an even count), NaN
// for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

func nanMax(a, b float64) float64 {
	if math.IsNaN(a) {
		return b
	}
	return max(a, b)
}

// num formats v with thousands separators and the given decimals; "–" for NaN.
func num(v float64, decimals int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	s := fmt.Sprintf("%.*f", decimals, math.Abs(v))
	whole, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	if v < 0 && strings.Trim(s, "0.") != "" {
		b.WriteByte('-')
	}
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if frac != "" {
		b.WriteString("." + frac)
	}
	return b.String()
}

// sig formats a small positive figure with about three significant digits.
func sig(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v == 0:
		return "0"
	case v >= 100:
		return num(v, 0)
	case v >= 10:
		return num(v, 1)
	case v >= 1:
		return num(v, 2)
	case v >= 0.01:
		return num(v, 3)
	default:
		return fmt.Sprintf("%.2g", v)
	}
}

// percent formats a share as a percentage, "0" for none.
func percent(v float64) string {
	if v == 0 {
		return "0"
	}
	if v < 0.001 {
		return fmt.Sprintf("%.2g%%", v*100)
	}
	return fmt.Sprintf("%.1f%%", v*100)
}

// table writes the markdown table of the rows of one scenario.
func table(w io.Writer, rs []Row, scenario string, hot bool) {
	last := "admitted / requested"
	if hot {
		last = "admitted / bound (worst)"
	}
	fmt.Fprintf(w, "| limiter | goroutines | decisions/s | allocs/decision | p50 µs | p99 µs | Redis commands/decision | round trips/decision | Redis CPU µs/decision | %s | failed or fell back |\n", last)
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range rs {
		if r.Scenario != scenario {
			continue
		}
		adm := num(r.AdmReq, 4)
		if hot {
			adm = num(r.AdmBound, 3)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Rival, r.Goroutines, num(r.DecPerS, 0), sig(r.AllocsDec), sig(r.P50), sig(r.P99),
			sig(r.CallsDec), sig(r.TripsDec), sig(r.CPUDec), adm, percent(r.FailShare))
	}
}

// writeMarkdown writes docs/benchmarks.md from the environment, the rivals and runs.
func writeMarkdown(w io.Writer, env Env, rvs []rival, runs []Run, plotFile string) error {
	bounded := make(map[string]bool)
	for _, rv := range rvs {
		bounded[rv.Name] = rv.hasBound
	}
	rs := rows(runs, bounded)
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("# Benchmarks: fleetlimit and other Redis rate limiters\n\n")
	p("Generated by the command below from the raw output beside it ([benchmarks/raw.jsonl](benchmarks/raw.jsonl), ")
	p("with the run's log in [benchmarks/log.txt](benchmarks/log.txt)); do not edit it by hand. ")
	p("`go run ./cmd/compare -render -out ../docs` rewrites this page and the plot from the raw output alone.\n\n")
	p("```sh\n%s\n```\n\n", env.Command)
	p("The command starts a private `redis-server` (from PATH) on a spare loopback port with `--save \"\" --appendonly no` ")
	p("in a temporary directory, and stops it when it ends. It needs Go and redis-server; it never talks to a Redis it did not start. ")
	p("The limiters are modules of `bench/go.mod`, a module of its own, so none of them enters the module graph of a service that imports fleetlimit.\n\n")

	p("## Where\n\n")
	p("| | |\n|---|---|\n")
	p("| date | %s |\n", env.Date)
	p("| machine | %d CPUs (`nproc`)%s |\n", env.CPUs, ifSet(", "+env.CPUModel, env.CPUModel))
	p("| `uname -a` | `%s` |\n", env.Uname)
	p("| Go | %s |\n", env.GoVersion)
	p("| `redis-server --version` | `%s` |\n", env.RedisServer)
	if env.FleetlimitRev != "" {
		p("| fleetlimit | this repository at %s |\n", env.FleetlimitRev)
	}
	p("| runs | every row %g s, %d repeat(s), rows interleaved; the tables give medians |\n\n", env.DurationS, env.Repeats)
	p("The load generator, the limiters and Redis share these CPUs, as a limiter and a local Redis would on one host; ")
	p("a decision's latency includes waiting for a CPU. The machine is shared: repeats of one row differ, so compare ratios, not the last digit.\n\n")

	p("## The limiters\n\n")
	p("| limiter | module, version pinned in bench/go.mod | per decision | admitted is compared with |\n|---|---|---|---|\n")
	for _, rv := range rvs {
		ver := env.Modules[rv.Module]
		if rv.Module == "github.com/fleetlimit/fleetlimit" {
			ver = "this repository"
		}
		bound := rv.Bound
		if bound == "" {
			bound = "nothing: it limits nothing"
		}
		p("| %s | `%s` %s | %s | %s |\n", rv.Name, rv.Module, ver, rv.Algorithm, bound)
	}
	p("\nEvery rival but fleetlimit gets a go-redis client with go-redis's defaults (pool of 10 per CPU), as its README builds one; ")
	p("fleetlimit and the article script need the client `global.Configure` sets up (no retry of a timed-out script, 100 ms read timeout), ")
	p("with the same pool. go-redis is `%s` for all.\n", env.Modules["github.com/redis/go-redis/v9"])
	p("`mennanov/limiters` and `go-chi/httprate-redis` were to be compared too, but the Go module proxy serves no version of either.\n\n")

	for i, sc := range scenarios {
		p("## %s\n\n%s.\n\n", titles[i], upper(sc.Describe))
		table(w, rs, sc.Name, sc.Keys == 1)
		p("\n")
	}
	if plotFile != "" {
		p("![decisions per second and Redis CPU per decision](%s)\n\n", plotFile)
	}

	p("## Reading the figures\n\n")
	p("- **decisions/s**: requests decided (admitted, denied, or by fleetlimit's failure policy) per second of the run, all goroutines together.\n")
	p("- **allocs/decision**: `runtime.MemStats.Mallocs` over the run, divided by the decisions; it includes the limiter's background goroutines and the Redis client.\n")
	p("- **p50, p99**: of each decision's wall time, timed around the call (a histogram with 1%% buckets).\n")
	p("- **Redis commands/decision**: `INFO commandstats` calls after `CONFIG RESETSTAT`, summed over every command, the ones a script runs included (an EVALSHA of the article script counts 5: EVALSHA, TIME, HMGET, HSET, PEXPIRE).\n")
	p("- **round trips/decision**: commands and pipelines the go-redis clients sent, counted by a hook.\n")
	p("- **Redis CPU µs/decision**: the change of `INFO cpu` `used_cpu_user + used_cpu_sys`, divided by the decisions.\n")
	p("- **admitted / bound**: hot key only, the worst repeat. The bound is the limit's `burst + rate·T`, T the run's wall time, the most a token bucket that starts full may admit; ")
	p("the table of limiters says what each is held to. Above 1 means the limiter let through more than its limit allows.\n")
	p("- **admitted / requested**: many keys, every request within its key's limit: below 1 means requests were denied that the limit allows.\n")
	p("- **failed or fell back**: the worst repeat's share of calls that returned an error, or that fleetlimit's failure policy decided (FailClosed: denied) because a refill did not answer within its 10 ms.\n\n")

	p("## Rows to look at\n\n")
	notes := 0
	for _, r := range rs {
		switch {
		case !math.IsNaN(r.AdmBound) && r.AdmBound > 1:
			p("- %s, %s, %s: admitted %s × the bound in its worst repeat.\n", r.Rival, r.Scenario, goroutines(r.Goroutines), num(r.AdmBound, 3))
			notes++
		case !math.IsNaN(r.AdmBound) && r.AdmBound < 0.9:
			p("- %s, %s, %s: admitted at most %s × the bound in any repeat.\n", r.Rival, r.Scenario, goroutines(r.Goroutines), num(r.AdmBound, 3))
			notes++
		}
		if r.FailShare > 0 {
			p("- %s, %s, %s: %s of the calls failed or fell back (worst repeat)%s.\n", r.Rival, r.Scenario, goroutines(r.Goroutines), percent(r.FailShare), ifSet("; first error: `"+r.FirstError+"`", r.FirstError))
			notes++
		}
		if math.IsNaN(r.AdmBound) && r.AdmReq < 0.999 && bounded[r.Rival] {
			p("- %s, %s, %s: admitted %s of the requests, all within their limits.\n", r.Rival, r.Scenario, goroutines(r.Goroutines), num(r.AdmReq, 4))
			notes++
		}
	}
	if notes == 0 {
		p("None: no limiter admitted more than its bound or less than 90%% of it on the hot key, none denied a request within its limit, and no call failed.\n")
	}
	return nil
}

// titles are the section titles of the scenarios, in their order.
var titles = []string{"Hot key", "10,000 Zipf keys"}

// goroutines says "1 goroutine" or "n goroutines".
func goroutines(n int) string {
	if n == 1 {
		return "1 goroutine"
	}
	return fmt.Sprintf("%d goroutines", n)
}

func ifSet(s, cond string) string {
	if cond == "" {
		return ""
	}
	return s
}

func upper(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// writeFile creates path and writes to it with fn.
func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	bw := bufio.NewWriter(f)
	err = fn(bw)
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
