// Command compare measures fleetlimit against other Redis rate limiters and writes the
// report: docs/benchmarks.md, with its raw output, log and plot in docs/benchmarks/.
//
//	cd bench && go run ./cmd/compare -out ../docs
//
// It starts a private redis-server (from PATH, or -redis-server) on a spare loopback
// port, with no persistence and its files in a temporary directory, and stops it when it
// ends, on an error or a signal too. It never talks to a Redis it did not start.
//
// Every limiter runs every scenario (a hot key far over its limit; 10,000 Zipf keys
// within theirs) with 1 and with 32 goroutines, for -duration each, -repeats times,
// the rows interleaved; Redis is flushed and its statistics reset before each.
// fleetlimit runs each kind of limit (bucket, charge-later, windowed) on 1 and on 8
// servers. The report gives per row the medians of decisions per second, allocations
// per decision, p50 and p99 latency, commands, script runs, round trips, Redis
// commands and Redis CPU per decision (counted up to the end of the limiter's Close),
// and admitted against the limit's bound; and which kind of fleetlimit limit suits
// per-client keys, from the rows.
//
// With -render it only rewrites the report and the plot from <out>/benchmarks/raw.jsonl.
// With -only it runs the rows whose "<limiter>, <scenario>, <goroutines>" matches a
// regular expression and prints them, writing no report: a probe of one change, e.g.
//
//	go run ./cmd/compare -only 'redis_rate, zipf|bucket, 8 servers, zipf 10k, 32'
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// goroutineCounts are the client goroutine counts every scenario runs with.
var goroutineCounts = []int{1, 32}

func main() {
	out := flag.String("out", "../docs", "the directory benchmarks.md is written to (raw output, log and plot go to its benchmarks/)")
	duration := flag.Duration("duration", 2*time.Second, "how long each row runs")
	repeats := flag.Int("repeats", 3, "how many times each row runs; the report gives medians")
	redisBin := flag.String("redis-server", "redis-server", "the redis-server binary to start")
	render := flag.Bool("render", false, "measure nothing: rewrite the report and plot from <out>/benchmarks/raw.jsonl")
	only := flag.String("only", "", "run only the rows whose `<limiter>, <scenario>, <goroutines>` matches this regular expression, print them and their medians, and write no report")
	flag.Parse()
	if flag.NArg() > 0 || *repeats < 1 || *duration <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	var sel *regexp.Regexp
	if *only != "" {
		if sel, err = regexp.Compile(*only); err != nil {
			fmt.Fprintln(os.Stderr, "compare: -only:", err)
			os.Exit(2)
		}
	}
	switch {
	case *render:
		err = rerender(*out)
	case sel != nil:
		err = probe(ctx, *redisBin, *duration, *repeats, sel)
	default:
		err = measure(ctx, *out, *redisBin, *duration, *repeats, os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		stop()
		os.Exit(1)
	}
}

// paths are the files of a report under out.
func paths(out string) (md, raw, log, png string) {
	dir := filepath.Join(out, "benchmarks")
	return filepath.Join(out, "benchmarks.md"), filepath.Join(dir, "raw.jsonl"), filepath.Join(dir, "log.txt"), filepath.Join(dir, "compare.png")
}

// measure runs every row against a private Redis and writes the report.
func measure(ctx context.Context, out, redisBin string, d time.Duration, repeats int, args []string) error {
	mdPath, rawPath, logPath, pngPath := paths(out)
	if err := os.MkdirAll(filepath.Dir(rawPath), 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	srv, err := startRedis(ctx, redisBin)
	if err != nil {
		return err
	}
	defer srv.stop()
	var logBuf bytes.Buffer
	logw := io.MultiWriter(os.Stdout, &logBuf)

	env := environment(ctx, redisBin, srv.Version, args)
	env.DurationS, env.Repeats = d.Seconds(), repeats
	fmt.Fprintf(logw, "compare: %s; private redis-server at %s\n", env, srv.Addr)

	ctl := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer func() { _ = ctl.Close() }()
	renv := &redisEnv{addr: srv.Addr}
	rvs := rivals()
	total := 0
	for _, sc := range scenarios {
		for _, rv := range rvs {
			if why := rv.whyUnfit(sc.Limit); why != "" {
				fmt.Fprintf(logw, "compare: %s does not run %s: %s\n", rv.Name, sc.Name, why)
				continue
			}
			total += repeats * len(goroutineCounts)
		}
	}
	runs, err := runRows(ctx, ctl, renv, rvs, d, repeats, func(string) bool { return true }, func(n int, r Run) {
		fmt.Fprintf(logw, "[%3d/%d] %s\n", n, total, logLine(r))
	})
	if err != nil {
		return err
	}
	env.LoadEnd = loadAvg()
	fmt.Fprintf(logw, "compare: load average at the end %s\n", env.LoadEnd)
	if err := writeFile(rawPath, func(w io.Writer) error { return writeRaw(w, env, runs) }); err != nil {
		return err
	}
	if err := os.WriteFile(logPath, logBuf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write log: %w", err)
	}
	if err := report(mdPath, pngPath, env, runs); err != nil {
		return err
	}
	fmt.Println("wrote", mdPath, rawPath, logPath, pngPath)
	return nil
}

// probe runs the rows sel matches against a private Redis and prints each run and,
// per row, the medians of Redis CPU, script runs and round trips per decision (Close
// included), writing no report.
func probe(ctx context.Context, redisBin string, d time.Duration, repeats int, sel *regexp.Regexp) error {
	srv, err := startRedis(ctx, redisBin)
	if err != nil {
		return err
	}
	defer srv.stop()
	ctl := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer func() { _ = ctl.Close() }()
	runs, err := runRows(ctx, ctl, &redisEnv{addr: srv.Addr}, rivals(), d, repeats, sel.MatchString, func(_ int, r Run) {
		fmt.Println(logLine(r))
	})
	if err != nil {
		return err
	}
	if len(runs) == 0 {
		return errors.New("-only matches no row")
	}
	for _, r := range rows(runs, nil) {
		fmt.Printf("%-60s Redis CPU %.3g µs, %.3g script runs, %.3g round trips a decision (medians of %d)\n",
			rowName(r.Rival, r.Scenario, r.Goroutines), r.CPUDec, r.ScriptsDec, r.TripsDec, r.Repeats)
	}
	return nil
}

// runRows runs, repeats times and interleaved, every row of rvs that can run its
// scenario and whose name (rowName) keep accepts, against the Redis at renv; it calls
// each with every run as it ends, numbered from 1, and returns the runs.
func runRows(ctx context.Context, ctl *redis.Client, renv *redisEnv, rvs []rival, d time.Duration, repeats int,
	keep func(name string) bool, each func(n int, r Run)) ([]Run, error) {
	var runs []Run
	for rep := 1; rep <= repeats; rep++ {
		for _, sc := range scenarios {
			for _, g := range goroutineCounts {
				for _, rv := range rvs {
					name := rowName(rv.Name, sc.Name, g)
					if rv.whyUnfit(sc.Limit) != "" || !keep(name) {
						continue
					}
					r, err := runOne(ctx, ctl, renv, rv, sc, g, d, rep)
					if err != nil {
						return runs, fmt.Errorf("%s: %w", name, err)
					}
					runs = append(runs, r)
					each(len(runs), r)
				}
			}
		}
	}
	return runs, nil
}

// rowName names a row as -only matches it: "<limiter>, <scenario>, <goroutines>".
func rowName(rival, scenario string, g int) string {
	return fmt.Sprintf("%s, %s, %s", rival, scenario, goroutines(g))
}

// rerender rewrites the report and plot from the raw output under out.
func rerender(out string) error {
	mdPath, rawPath, _, pngPath := paths(out)
	f, err := os.Open(rawPath)
	if err != nil {
		return fmt.Errorf("raw output: %w", err)
	}
	defer func() { _ = f.Close() }()
	env, runs, err := readRaw(f)
	if err != nil {
		return err
	}
	if err := report(mdPath, pngPath, env, runs); err != nil {
		return err
	}
	fmt.Println("wrote", mdPath, pngPath)
	return nil
}

// report writes the markdown page and the plot.
func report(mdPath, pngPath string, env Env, runs []Run) error {
	rvs := rivals()
	if len(runs) == 0 {
		return errors.New("no runs to report")
	}
	if err := writeFile(pngPath, func(w io.Writer) error { return writePlot(w, rvs, runs) }); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(mdPath), pngPath)
	if err != nil {
		return fmt.Errorf("plot path: %w", err)
	}
	return writeFile(mdPath, func(w io.Writer) error {
		return writeMarkdown(w, env, rvs, runs, filepath.ToSlash(rel))
	})
}

// logLine is one run in the log.
func logLine(r Run) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-22s %-8s g=%-2d rep=%d: %9.0f dec/s admitted %d denied %d", r.Rival, r.Scenario, r.Goroutines, r.Repeat,
		float64(r.Decisions())/r.ElapsedS, r.Admitted, r.Denied)
	if r.Keys == 1 {
		fmt.Fprintf(&b, " (bound %.0f)", r.Bound())
	}
	fmt.Fprintf(&b, " p50 %.1fµs p99 %.1fµs, %d commands, %d script runs, %d round trips, %d Redis calls, Redis CPU %.3fs; Close %.1fms: %d commands, %d script runs, Redis CPU %.3fs",
		float64(r.P50Ns)/1e3, float64(r.P99Ns)/1e3, r.CommandsSent, r.ScriptRuns, r.RoundTrips, r.RedisCalls, r.RedisCPUS,
		r.CloseS*1e3, r.CloseCommands, r.CloseScripts, r.CloseCPUS)
	if r.Failed+r.FellBack > 0 {
		fmt.Fprintf(&b, ", failed %d, fell back %d", r.Failed, r.FellBack)
	}
	if r.FirstError != "" {
		fmt.Fprintf(&b, " (first error: %s)", r.FirstError)
	}
	return b.String()
}
