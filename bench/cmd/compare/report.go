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
	"time"
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
	CmdsDec    float64 // commands sent per decision (client side, each of a pipeline)
	ScriptsDec float64 // script runs per decision (client side: EVAL, EVALSHA, ...)
	CallsDec   float64 // Redis commands executed per decision (INFO commandstats)
	TripsDec   float64 // round trips per decision (client side)
	CPUDec     float64 // Redis CPU per decision, µs
	// CloseCmdsDec and CloseCPUDec are the part of CmdsDec and CPUDec the limiter's
	// Close made.
	CloseCmdsDec float64
	CloseCPUDec  float64
	AdmReq       float64 // admitted / requested, median
	AdmBound     float64 // admitted / (burst + rate·T), worst repeat; NaN when the rival limits nothing
	AdmHeld      float64 // admitted / what the rival is held to (rival.held), worst repeat; NaN likewise
	FailShare    float64 // (failed + fell back) / requested, worst repeat
	FirstError   string
	// Opened and Timeouts are the worst repeat's (Run.BreakerOpened, Run.Timeouts).
	Opened, Timeouts int64
	// Steady is how many repeats failed or fell back at most maxFallback, and
	// SteadyCPUDec, SteadyCmdsDec and SteadyScriptsDec the medians of CPUDec, CmdsDec and
	// ScriptsDec over those alone (NaN for none): the figures the choice of a kind for
	// per-client keys is made on.
	Steady                                        int
	SteadyCPUDec, SteadyCmdsDec, SteadyScriptsDec float64
}

// rows groups runs into rows, in the order of rivals, then scenarios, then goroutines.
// held maps a rival to what it may admit of one key over a run (rival.held); a rival
// not in it limits nothing.
func rows(runs []Run, held map[string]func(Run) float64) []Row {
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
		row := Row{Rival: k.rival, Scenario: k.scenario, Goroutines: k.g, Repeats: len(g), AdmBound: math.NaN(), AdmHeld: math.NaN()}
		per := func(f func(Run) float64) float64 { return medianOf(g, f) }
		perDec := func(f func(Run) float64) float64 { return medianOf(g, perDecision(f)) }
		row.DecPerS = per(func(r Run) float64 { return ratio(float64(r.Decisions()), r.ElapsedS) })
		row.AllocsDec = perDec(func(r Run) float64 { return float64(r.Mallocs) })
		row.P50 = per(func(r Run) float64 { return float64(r.P50Ns) / 1e3 })
		row.P99 = per(func(r Run) float64 { return float64(r.P99Ns) / 1e3 })
		row.CmdsDec = perDec(func(r Run) float64 { return float64(r.CommandsSent) })
		row.ScriptsDec = perDec(func(r Run) float64 { return float64(r.ScriptRuns) })
		row.CallsDec = perDec(func(r Run) float64 { return float64(r.RedisCalls) })
		row.TripsDec = perDec(func(r Run) float64 { return float64(r.RoundTrips) })
		row.CPUDec = perDec(func(r Run) float64 { return r.RedisCPUS * 1e6 })
		row.CloseCmdsDec = perDec(func(r Run) float64 { return float64(r.CloseCommands) })
		row.CloseCPUDec = perDec(func(r Run) float64 { return r.CloseCPUS * 1e6 })
		row.AdmReq = per(func(r Run) float64 { return ratio(float64(r.Admitted), float64(r.Requested())) })
		var steady []Run
		for _, r := range g {
			if r.FailShare() <= maxFallback {
				steady = append(steady, r)
			}
		}
		row.Steady = len(steady)
		steadyDec := func(f func(Run) float64) float64 { return medianOf(steady, perDecision(f)) }
		row.SteadyCPUDec = steadyDec(func(r Run) float64 { return r.RedisCPUS * 1e6 })
		row.SteadyCmdsDec = steadyDec(func(r Run) float64 { return float64(r.CommandsSent) })
		row.SteadyScriptsDec = steadyDec(func(r Run) float64 { return float64(r.ScriptRuns) })
		for _, r := range g {
			if h := held[r.Rival]; h != nil && r.Keys == 1 {
				row.AdmBound = nanMax(row.AdmBound, float64(r.Admitted)/r.Bound())
				row.AdmHeld = nanMax(row.AdmHeld, float64(r.Admitted)/h(r))
			}
			if share := r.FailShare(); share > row.FailShare {
				row.FailShare, row.Opened, row.Timeouts = share, r.BreakerOpened, r.Timeouts
			}
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

// medianOf is the median of f over runs (NaN for none).
func medianOf(runs []Run, f func(Run) float64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	return median(v)
}

// perDecision is f of a run over its decisions.
func perDecision(f func(Run) float64) func(Run) float64 {
	return func(r Run) float64 { return ratio(f(r), float64(r.Decisions())) }
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
	fmt.Fprintf(w, "| limiter | goroutines | decisions/s | allocs/decision | p50 µs | p99 µs | commands/decision | script runs/decision | round trips/decision | commands Redis ran/decision | Redis CPU µs/decision | %s | failed or fell back |\n", last)
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range rs {
		if r.Scenario != scenario {
			continue
		}
		adm := num(r.AdmReq, 4)
		if hot {
			adm = num(r.AdmBound, 3)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Rival, r.Goroutines, num(r.DecPerS, 0), sig(r.AllocsDec), sig(r.P50), sig(r.P99),
			sig(r.CmdsDec), sig(r.ScriptsDec), sig(r.TripsDec), sig(r.CallsDec), sig(r.CPUDec), adm, percent(r.FailShare))
	}
}

// writeMarkdown writes docs/benchmarks.md from the environment, the rivals and runs.
func writeMarkdown(w io.Writer, env Env, rvs []rival, runs []Run, plotFile string) error {
	held := make(map[string]func(Run) float64)
	for _, rv := range rvs {
		if h := rv.held(); h != nil {
			held[rv.Name] = h
		}
	}
	rs := rows(runs, held)
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("# Benchmarks: fleetlimit and other Redis rate limiters\n\n")
	p("Generated by the command below from the raw output beside it ([benchmarks/raw.jsonl](benchmarks/raw.jsonl), ")
	p("with the run's log in [benchmarks/log.txt](benchmarks/log.txt)); do not edit it by hand. ")
	p("`go run ./cmd/compare -render -out ../docs` rewrites this page and the plot from the raw output alone.\n\n")
	p("```sh\n%s\n```\n\n", env.Command)
	p("The command starts a private `redis-server` (from PATH) on a spare loopback port with `--save \"\" --appendonly no` ")
	p("in a temporary directory, and stops it when it ends. It needs Go and redis-server; it never talks to a Redis it did not start. ")
	p("The limiters are modules of `bench/go.mod`, a module of its own, so none of them enters the module graph of a service that imports fleetlimit.\n\n")
	p("This page measures what each limiter costs Redis, and the decisions it makes, over one Redis. What a fleetlimit decision costs in process, ")
	p("where a lease serves it without a Redis call (against a bare x/time/rate `Allow`, interleaved in one run, with the profile that explains it), ")
	p("is measured in [hot-path.md](hot-path.md); CI's guard fails when one of its ratios to the bare `Allow` passes 1.4 times its ceiling there.\n\n")

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
	p("| runs | every row %g s, %d repeat(s), rows interleaved; the tables give medians |\n", env.DurationS, env.Repeats)
	if env.LoadStart != "" {
		end := env.LoadEnd
		if end == "" {
			end = "unknown"
		}
		p("| load average (1, 5, 15 min) | %s at the start, %s at the end |\n", env.LoadStart, end)
	}
	p("\nThe load generator, the limiters and Redis share these CPUs, as a limiter and a local Redis would on one host; ")
	p("a decision's latency includes waiting for a CPU. The machine is shared: repeats of one row differ, so compare ratios, not the last digit. ")
	p("Other work on the machine (its load average above) moves decisions/s and the latencies most. ")
	p("Commands, script runs and round trips per decision are counts: they move with the load only as far as it changes how requests batch. ")
	p("Redis CPU per decision is Redis's own CPU time, but it moves with the load too (a busier machine makes each system call dearer, and a limiter ")
	p("that runs slower batches less): repeats of one row differ by up to 2×.\n\n")

	p("## The limiters\n\n")
	p("| limiter | module, version pinned in bench/go.mod | per decision | held to, over a run of T on one key |\n|---|---|---|---|\n")
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
	kindsNote(p, rvs)

	for i, sc := range scenarios {
		p("## %s\n\n%s.\n\n", titles[i], upper(sc.Describe))
		for _, rv := range rvs {
			if why := rv.whyUnfit(sc.Limit); why != "" {
				p("%s does not run this scenario as specified, so it has no row: %s.\n\n", rv.Name, why)
			}
		}
		table(w, rs, sc.Name, sc.Keys == 1)
		p("\n")
	}
	if plotFile != "" {
		p("![decisions per second and Redis CPU per decision](%s)\n\n", plotFile)
	}
	perClient(p, rs, rvs)

	p("## Reading the figures\n\n")
	p("- **decisions/s**: requests decided (admitted, denied, or by fleetlimit's failure policy) per second of the run, all goroutines together.\n")
	p("- **allocs/decision**: `runtime.MemStats.Mallocs` over the run, divided by the decisions; it includes the limiter's background goroutines and the Redis client.\n")
	p("- **p50, p99**: of each decision's wall time, timed around the call (a histogram with 1%% buckets).\n")
	p("- The Redis figures below count from before the first call of the measured load (before the limiter is built on the hot key; after the unmeasured warm-up on the Zipf keys) ")
	p("to the end of the limiter's `Close`: fleetlimit's refunds of leased tokens, its last charges and its last window reports at `Close` are in them, ")
	p("though `Close` comes after the last decision. They are divided by the decisions of the measured run.\n")
	p("- **commands/decision**: commands the limiter's go-redis clients sent, counted by a hook: each command of a pipeline counts, and so do the commands that open a connection (HELLO, CLIENT SETINFO).\n")
	p("- **script runs/decision**: of those, the ones that run a Lua script (EVAL, EVALSHA and their `_RO` forms, FCALL), less any EVALSHA that Redis answered NOSCRIPT (it ran nothing; the client then sends EVAL). One run may act on several keys: fleetlimit refunds up to 32 keys a call.\n")
	p("- **round trips/decision**: commands and pipelines the clients sent, a pipeline counting one.\n")
	p("- **commands Redis ran/decision**: `INFO commandstats` calls after `CONFIG RESETSTAT`, summed over every command, the ones a script runs included (an EVALSHA of the article script counts 5: EVALSHA, TIME, HMGET, HSET, PEXPIRE).\n")
	p("- **Redis CPU µs/decision**: the change of `INFO cpu` `used_cpu_user + used_cpu_sys`, divided by the decisions.\n")
	p("- **admitted / bound**: hot key only, the worst repeat. The bound is the limit's `burst + rate·T`, T the run's wall time, the most a token bucket that starts full may admit; ")
	p("the table of limiters says what each is held to, which for some kinds of fleetlimit limit is more (Rows to look at compares those). Above 1 means the limiter let through more than a token bucket would.\n")
	p("- **admitted / requested**: many keys, every request within its key's limit: below 1 means requests were denied that the limit allows.\n")
	p("- **failed or fell back**: the worst repeat's share of calls that returned an error, or that fleetlimit's failure policy decided (FailClosed: denied) because Redis did not answer within the limit's MaxWait, 10 ms, or because a server's breaker was open: it opens after 5 calls in a row time out (10 ms each) and lets a probe through a second later. The load generator, the limiters and Redis share 2 CPUs here, so a limiter that decides faster leaves Redis less CPU: its calls time out more often. The policy decides at once, so the goroutines make many more decisions while a breaker is open than while it is closed: one opening, a second long, can make most of a 2 s row's decisions.\n\n")

	p("## Rows to look at\n\n")
	notes := 0
	for _, r := range rs {
		switch {
		case !math.IsNaN(r.AdmHeld) && r.AdmHeld > 1:
			p("- %s, %s, %s: admitted %s × what it is held to in its worst repeat (%s × burst + rate·T).\n", r.Rival, r.Scenario, goroutines(r.Goroutines), num(r.AdmHeld, 3), num(r.AdmBound, 3))
			notes++
		case !math.IsNaN(r.AdmBound) && r.AdmBound > 1:
			p("- %s, %s, %s: admitted %s × burst + rate·T in its worst repeat, %s × what its kind is held to (the table of limiters).\n", r.Rival, r.Scenario, goroutines(r.Goroutines), num(r.AdmBound, 3), num(r.AdmHeld, 3))
			notes++
		case !math.IsNaN(r.AdmBound) && r.AdmBound < 0.9:
			p("- %s, %s, %s: admitted at most %s × the bound in any repeat.\n", r.Rival, r.Scenario, goroutines(r.Goroutines), num(r.AdmBound, 3))
			notes++
		}
		if r.FailShare > 0 {
			p("- %s, %s, %s: %s of the calls failed or fell back (worst repeat)%s%s.\n", r.Rival, r.Scenario, goroutines(r.Goroutines), percent(r.FailShare),
				timedOut(r),
				ifSet("; first error: `"+r.FirstError+"`", r.FirstError))
			notes++
		}
		if math.IsNaN(r.AdmBound) && r.AdmReq < 0.999 && held[r.Rival] != nil {
			p("- %s, %s, %s: admitted %s of the requests, all within their limits.\n", r.Rival, r.Scenario, goroutines(r.Goroutines), num(r.AdmReq, 4))
			notes++
		}
	}
	if notes == 0 {
		p("None: no limiter admitted more than its bound or less than 90%% of it on the hot key, none denied a request within its limit, and no call failed.\n")
	}
	return nil
}

// kindsNote says how the comparison sets up each kind of fleetlimit limit, and that
// every kind gets each scenario's rate and burst as they are (or why it cannot).
func kindsNote(p func(string, ...any), rvs []rival) {
	p("fleetlimit runs each kind of limit, on 1 server and on %d, with each scenario's rate and burst as they are, so every kind has the same rate per key: ", fleetServers)
	p("the bucket is `hybrid.Exact()` (the default), charge-later `hybrid.ChargeLater(%v)`, windowed `hybrid.Windowed(%v)` (the values docs/limits.md gives as its examples). ", chargeWithin, windowedReport)
	p("A windowed limit needs a burst of at most 2^30, a window (burst/rate) from %v to %v, and a report interval of at most half the window: ", minWindow, maxWindow)
	var parts []string
	for _, sc := range scenarios {
		w := time.Duration(float64(sc.Limit.Burst) / float64(sc.Limit.Rate) * float64(time.Second))
		parts = append(parts, fmt.Sprintf("the %s's window is %v at burst %s", sc.Name, w, num(float64(sc.Limit.Burst), 0)))
	}
	p("%s", strings.Join(parts, ", "))
	var unfit []string
	for _, sc := range scenarios {
		for _, rv := range rvs {
			if why := rv.whyUnfit(sc.Limit); why != "" && rv.Kind != "" {
				unfit = append(unfit, fmt.Sprintf("%s cannot run the %s (%s)", rv.Name, sc.Name, why))
			}
		}
	}
	if len(unfit) == 0 {
		p(", so every kind runs both scenarios as specified.\n\n")
	} else {
		p("; %s.\n\n", strings.Join(unfit, "; "))
	}
}

// maxFallback is the most a row's worst repeat may have failed or fallen back for its
// Redis CPU per decision to be compared: a decision of the failure policy costs Redis
// nothing, so a row with many of them looks cheaper than it is.
const maxFallback = 0.01

// steadyOf notes, for a row of perClient's choice, over how many of its repeats its
// figures are, in format ("" when over all of them).
func steadyOf(r Row, format string) string {
	if r.Steady == r.Repeats {
		return ""
	}
	return fmt.Sprintf(format, fmt.Sprintf("over %d of its %d repeats", r.Steady, r.Repeats))
}

// perClient writes which kind of fleetlimit limit to choose for per-client keys, from the
// rows of the scenario of many keys.
func perClient(p func(string, ...any), rs []Row, rvs []rival) {
	var many *scenario
	for i := range scenarios {
		if scenarios[i].Keys > 1 {
			many = &scenarios[i]
			break
		}
	}
	if many == nil {
		return
	}
	find := func(name string, g int) (Row, bool) {
		for _, r := range rs {
			if r.Rival == name && r.Scenario == many.Name && r.Goroutines == g {
				return r, true
			}
		}
		return Row{}, false
	}
	const ref = "redis_rate"
	var fleet []rival
	for _, rv := range rvs {
		if rv.Kind != "" {
			fleet = append(fleet, rv)
		}
	}
	p("## Per-client keys: which kind of fleetlimit limit\n\n")
	p("Per-client keys (an API key, a tenant, an IP) are the %s scenario: many keys, each seen seldom, each within its limit. ", many.Name)
	p("Its rows for %s and every kind of fleetlimit limit, with %s's Redis CPU per decision as the yardstick ", ref, ref)
	p("(\"of %s's\": this row's Redis CPU per decision over %s's at the same goroutines; \"at Close\": the part of it that `Close` spent):\n\n", ref, ref)
	p("| limiter | goroutines | decisions/s | Redis CPU µs/decision | of %s's | at Close | commands/decision | script runs/decision | round trips/decision | failed or fell back |\n", ref)
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, g := range goroutineCounts {
		base, hasBase := find(ref, g)
		for _, name := range append([]string{ref}, names(fleet)...) {
			r, ok := find(name, g)
			if !ok {
				continue
			}
			of := "–"
			if hasBase {
				of = fraction(r.CPUDec / base.CPUDec)
			}
			p("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Rival, r.Goroutines, num(r.DecPerS, 0), sig(r.CPUDec), of,
				sig(r.CloseCPUDec), sig(r.CmdsDec), sig(r.ScriptsDec), sig(r.TripsDec), percent(r.FailShare))
		}
	}
	p("\n")

	// The choice is made on the fleet's rows at the most goroutines: many servers, busy.
	g := goroutineCounts[len(goroutineCounts)-1]
	base, hasBase := find(ref, g)
	pick := func(n int) (best Row, all map[string]Row) {
		all = make(map[string]Row)
		best.SteadyCPUDec = math.Inf(1)
		for _, rv := range fleet {
			if rv.Servers != n {
				continue
			}
			if r, ok := find(rv.Name, g); ok && !math.IsNaN(r.CPUDec) {
				all[rv.Kind] = r
				if r.Steady > 0 && r.SteadyCPUDec < best.SteadyCPUDec {
					best = r
				}
			}
		}
		return best, all
	}
	best, all := pick(fleetServers)
	if len(all) == 0 || !hasBase || math.IsInf(best.SteadyCPUDec, 1) {
		p("The run has no rows of fleetlimit on %d servers, or of %s, at %s to choose from.\n\n", fleetServers, ref, goroutines(g))
		return
	}
	kindOf := func(r Row) string {
		for _, rv := range fleet {
			if rv.Name == r.Rival {
				return rv.Kind
			}
		}
		return ""
	}
	bk := kindOf(best)
	p("**For per-client keys, choose the %s kind.** ", bk)
	p("The choice is made on Redis CPU per decision at %d servers and %s, the figure that decides how many requests a Redis serves, ", fleetServers, goroutines(g))
	p("the median over the repeats in which at most %s of the decisions failed or fell back (a decision of the failure policy costs Redis nothing): ", percent(maxFallback))
	p("there the %s kind spends %s µs a decision, %s (%s µs), with %s commands and %s script runs a decision%s", bk, sig(best.SteadyCPUDec), share(best.SteadyCPUDec/base.CPUDec, ref+"'s"), sig(base.CPUDec), sig(best.SteadyCmdsDec), sig(best.SteadyScriptsDec), steadyOf(best, " (%s)"))
	var others []string
	for _, k := range kinds {
		if r, ok := all[k.Name]; ok && k.Name != bk {
			if r.Steady == 0 {
				others = append(others, fmt.Sprintf("the %s kind not compared (every repeat failed or fell back more: Rows to look at)", k.Name))
				continue
			}
			others = append(others, fmt.Sprintf("the %s kind %s µs (%s; %s commands, %s script runs%s)", k.Name, sig(r.SteadyCPUDec), share(r.SteadyCPUDec/base.CPUDec, ref+"'s"), sig(r.SteadyCmdsDec), sig(r.SteadyScriptsDec), steadyOf(r, "; %s")))
		}
	}
	if len(others) > 0 {
		p("; %s", strings.Join(others, ", "))
	}
	p(".")
	if one, oneAll := pick(1); len(oneAll) > 0 && !math.IsInf(one.SteadyCPUDec, 1) {
		if k1 := kindOf(one); k1 == bk {
			p(" On one server too the %s kind spends least: %s µs a decision, %s.", bk, sig(one.SteadyCPUDec), share(one.SteadyCPUDec/base.CPUDec, ref+"'s"))
		} else {
			p(" On one server the %s kind spends least (%s µs a decision, %s; the %s kind %s µs).", k1, sig(one.SteadyCPUDec), share(one.SteadyCPUDec/base.CPUDec, ref+"'s"), bk, sig(oneAll[bk].SteadyCPUDec))
		}
	}
	p("\n\n")
	lo, hi := math.Inf(1), 0.0
	for _, r := range all {
		lo, hi = min(lo, r.DecPerS), max(hi, r.DecPerS)
	}
	p("The rows are closed loops: each limiter decides as fast as its decisions come back, so each row's Redis CPU per decision is read at a rate of its own, ")
	p("%s to %s decisions a second for fleetlimit's %d-server rows at %s against %s's %s. ", num(lo, 0), num(hi, 0), fleetServers, goroutines(g), ref, num(base.DecPerS, 0))
	p("A fleetlimit kind's Redis work per decision falls as a key gets more requests per lease, so a ratio here is what each spends at its own rate, not at %s's: ", ref)
	p("the rows at %s, whose rates are closer, show what a fleet at a rate like %s's would see", goroutines(goroutineCounts[0]), ref)
	var slow Row // the kind that spends least at the fewest goroutines
	slow.CPUDec = math.Inf(1)
	for _, rv := range fleet {
		if r, ok := find(rv.Name, goroutineCounts[0]); ok && rv.Servers == fleetServers && r.CPUDec < slow.CPUDec {
			slow = r
		}
	}
	switch k := kindOf(slow); {
	case math.IsInf(slow.CPUDec, 1):
		p(".\n\n")
	case k == bk:
		p(", where the %s kind spends least too.\n\n", bk)
	default:
		p(", where the %s kind spends least.\n\n", k)
	}
	switch bk {
	case "windowed":
		p("What the windowed kind gives up (docs/limits.md, \"Windowed limits\"): a key's burst is per fixed window of burst/rate, ")
		p("so a client may spend a burst at a window's end and another at the next one's start (its bound is `2·burst + rate·W + S·c` over any window W); ")
		p("keys over their limit get about 95%% of it rather than all; its Rate, Burst and report interval cannot change at run time; ")
		p("and Redis holds a counter array per limit and window (1.5 MB for a burst up to 16,384, 3 MB above). ")
		p("Keep the bucket where a key's admissions must follow a refill exactly, or where keys over their limit must get all of it.\n\n")
	case "charge-later":
		p("What the charge-later kind gives up (docs/limits.md, \"Charge later\"): a key that turns hot across the fleet at once may be admitted `S·c` beyond the bucket's bound before the charges land.\n\n")
	default:
		p("The bucket admits exactly as its token bucket allows (`2·burst + rate·W` over any window W).\n\n")
	}
	if b, ok := all["bucket"]; ok {
		if c, ok := all["charge-later"]; ok {
			ratio := c.SteadyCPUDec / b.SteadyCPUDec
			switch {
			case b.Steady == 0 || c.Steady == 0:
				p("The charge-later kind and the bucket are not compared here: in every repeat of one of them more than %s of the decisions were the failure policy's, which cost Redis nothing (Rows to look at).\n\n", percent(maxFallback))
			case ratio > 0.8 && ratio < 1.25:
				p("The charge-later kind spends about what the bucket does (%s Redis CPU per decision, %s against %s script runs a decision): ", share(ratio, "the bucket's"), sig(c.SteadyScriptsDec), sig(b.SteadyScriptsDec))
				p("every admission is still a bucket update by script, a charge instead of a take. What it removes is waiting: ")
				p("choose it over the bucket where a key's requests, spread over more servers than its burst, must not wait for Redis.\n\n")
			default:
				p("The charge-later kind spends %s Redis CPU per decision here (%s against %s script runs a decision).\n\n", share(ratio, "the bucket's"), sig(c.SteadyScriptsDec), sig(b.SteadyScriptsDec))
			}
		}
	}
	p("Each key's limit here (%s/s, burst %s) is far above what it asks, so nothing is denied: the rows measure the Redis work of keys within their limits, the common case of per-client keys. ",
		num(float64(many.Limit.Rate), 0), num(float64(many.Limit.Burst), 0))
	p("A bucket's leases are sized by what each server sees of a key, not by its burst, so a key seen seldom per server gets leases of one token whatever its limit; ")
	p("docs/limits.md measures the kinds on modest limits (50/s, burst 50) over 200 simulated servers.\n\n")
}

// names returns the rivals' names.
func names(rvs []rival) []string {
	out := make([]string, len(rvs))
	for i, rv := range rvs {
		out[i] = rv.Name
	}
	return out
}

// share says what a ratio v of something of whose is: "1/N of whose" below 1, "N× whose"
// from 1.
func share(v float64, whose string) string {
	f := fraction(v)
	switch {
	case f == "–":
		return f
	case v < 1:
		return f + " of " + whose
	}
	return f + " " + whose
}

// fraction formats a ratio below 1 as "1/N" and one from 1 as "N×".
func fraction(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0) || v <= 0:
		return "–"
	case v < 1:
		return "1/" + sig(1/v)
	}
	return sig(v) + "×"
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

// timedOut says, for a row of fleetlimit's whose worst repeat saw Redis calls time out,
// how many did and how often its breakers opened ("" for none).
func timedOut(r Row) string {
	if r.Timeouts+r.Opened == 0 {
		return ""
	}
	return fmt.Sprintf("; %d Redis calls timed out and breakers opened %d times", r.Timeouts, r.Opened)
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
