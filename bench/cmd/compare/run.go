package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// scenario is a load: its keys, the limit each key has, and how keys are drawn.
type scenario struct {
	Name string
	// Keys is the number of distinct keys; 1 is a hot key.
	Keys int
	// ZipfS is the Zipf exponent keys are drawn with (ignored for one key).
	ZipfS float64
	Limit spec
	// Warmup is how long the same load runs, unmeasured, before the measured run.
	Warmup time.Duration
	// Describe says what the scenario is, for the report.
	Describe string
}

// scenarios are the loads every rival runs.
var scenarios = []scenario{
	{
		Name: "hot key", Keys: 1, Limit: spec{Rate: 2000, Burst: 2000},
		Describe: "one key, limit 2,000/s burst 2,000, demand as fast as the goroutines can ask (far over the limit); " +
			"each row starts cold, from an empty Redis and new limiters, so that no limiter holds tokens at the start and burst + rate·T bounds what it may admit",
	},
	{
		Name: "zipf 10k", Keys: 10000, ZipfS: 1.1, Limit: spec{Rate: 1_000_000, Burst: 1_000_000},
		Warmup: 10 * time.Second,
		Describe: "10,000 keys drawn Zipf (s = 1.1), each limited to 1,000,000/s burst 1,000,000, so every request is within its limit; " +
			"each row first runs the same load for 10 s unmeasured, so the figures are of limiters in the state a service runs them in: connections open, and most keys known to most servers, " +
			"a key a server sees less than about once in 10 s excepted. A fleet's first second costs its leased kinds more, a take at most requests of a key new to a server: " +
			"docs/cold-keys.md measures the bucket kind after 1 s and after 10 s",
	},
}

// Run is the measurement of one rival under one scenario and goroutine count, one
// repeat: the raw numbers every figure of the report is computed from.
type Run struct {
	Rival      string `json:"rival"`
	Scenario   string `json:"scenario"`
	Goroutines int    `json:"goroutines"`
	Repeat     int    `json:"repeat"`
	Rate       int    `json:"rate"`
	Burst      int    `json:"burst"`
	Keys       int    `json:"keys"`
	// WarmupS is how long the load ran, unmeasured, before the measured ElapsedS.
	WarmupS  float64 `json:"warmup_s,omitempty"`
	ElapsedS float64 `json:"elapsed_s"`
	Admitted int64   `json:"admitted"`
	Denied   int64   `json:"denied"`
	// Failed counts calls that returned an error; FellBack decisions made by
	// fleetlimit's failure policy (FailClosed: denied) because Redis did not answer in time.
	Failed   int64 `json:"failed"`
	FellBack int64 `json:"fell_back"`
	// FirstError is the first error a call returned, if any.
	FirstError string `json:"first_error,omitempty"`
	Mallocs    uint64 `json:"mallocs"`
	P50Ns      int64  `json:"p50_ns"`
	P99Ns      int64  `json:"p99_ns"`
	// RoundTrips, CommandsSent and ScriptRuns are counted by a go-redis hook on every
	// client of the row: round trips (one per command, one per pipeline), commands (each
	// command of a pipeline too) and script runs (EVAL, EVALSHA and their kin, less
	// those answered NOSCRIPT). They, RedisCalls and RedisCPUS are counted from before
	// the first call of the measured load (before the limiter is built when the scenario
	// has no warm-up, after the warm-up when it has one) to the end of the limiter's
	// Close, its refunds and last reports included.
	RoundTrips   int64 `json:"round_trips"`
	CommandsSent int64 `json:"commands_sent"`
	ScriptRuns   int64 `json:"script_runs"`
	// RedisCalls is INFO commandstats' calls summed over every command, those run
	// inside scripts included, less this command's own INFO and CONFIG RESETSTAT.
	RedisCalls int64            `json:"redis_calls"`
	Commands   map[string]int64 `json:"commandstats"`
	// RedisCPUS is the delta of INFO cpu's used_cpu_user + used_cpu_sys, in seconds.
	RedisCPUS float64 `json:"redis_cpu_s"`
	// CloseS is how long the limiter's Close took; CloseCommands, CloseScripts and
	// CloseCPUS the part of CommandsSent, ScriptRuns and RedisCPUS that fell in it.
	CloseS        float64 `json:"close_s"`
	CloseCommands int64   `json:"close_commands"`
	CloseScripts  int64   `json:"close_scripts"`
	CloseCPUS     float64 `json:"close_redis_cpu_s"`
	// BreakerOpened and Timeouts are, for fleetlimit, how often its servers' breakers
	// opened during the measured load and how many of their Redis calls timed out: a
	// breaker opens after 5 timeouts in a row, and the failure policy decides while it
	// is open.
	BreakerOpened int64 `json:"breaker_opened,omitempty"`
	Timeouts      int64 `json:"timeouts,omitempty"`
}

// Decisions is the number of requests the limiter decided (admitted, denied, or by its
// failure policy); calls that failed are not decisions.
func (r Run) Decisions() int64 { return r.Admitted + r.Denied + r.FellBack }

// Requested is every call made.
func (r Run) Requested() int64 { return r.Decisions() + r.Failed }

// FailShare is the share of the calls made that failed or that the failure policy
// decided.
func (r Run) FailShare() float64 { return ratio(float64(r.Failed+r.FellBack), float64(r.Requested())) }

// Bound is the most a token bucket of the run's limit may admit on one key over the
// run, burst + rate·T.
func (r Run) Bound() float64 { return float64(r.Burst) + float64(r.Rate)*r.ElapsedS }

// runOne measures rival rv under sc with g goroutines for d on the Redis at env.addr.
func runOne(ctx context.Context, ctl *redis.Client, env *redisEnv, rv rival, sc scenario, g int, d time.Duration, repeat int) (Run, error) {
	out := Run{Rival: rv.Name, Scenario: sc.Name, Goroutines: g, Repeat: repeat, Rate: sc.Limit.Rate, Burst: sc.Limit.Burst, Keys: sc.Keys, WarmupS: sc.Warmup.Seconds()}
	if err := ctl.FlushAll(ctx).Err(); err != nil {
		return out, fmt.Errorf("FLUSHALL: %w", err)
	}
	// Counters open before the first call of the measured load: here when the scenario
	// has no warm-up, so that they count the limiter's set-up too; after the warm-up
	// otherwise.
	var open counters
	var err error
	if sc.Warmup == 0 {
		if open, err = openCounters(ctx, ctl, env); err != nil {
			return out, err
		}
	}
	dec, err := rv.build(ctx, env, sc.Limit)
	if err != nil {
		_ = env.closeClients()
		return out, err
	}
	defer func() { _ = env.closeClients() }()
	closed := false
	defer func() {
		if !closed {
			_ = dec.close(context.Background())
		}
	}()

	keys := make([]string, sc.Keys)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	type worker struct {
		hist                               histogram
		admitted, denied, failed, fellBack int64
		firstErr                           error
	}
	workers := make([]*worker, g)
	// pass runs the load for d and returns when every goroutine has made its last call.
	pass := func(d time.Duration, stream uint64) time.Duration {
		for i := range workers {
			workers[i] = &worker{}
		}
		start := make(chan struct{})
		var deadline time.Time
		var wg sync.WaitGroup
		for i, w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var zipf *rand.Zipf
				if sc.Keys > 1 {
					zipf = rand.NewZipf(rand.New(rand.NewPCG(uint64(repeat)<<8|stream, uint64(i))), sc.ZipfS, 1, uint64(sc.Keys-1))
				}
				<-start
				for seq := uint64(i); ; seq += uint64(g) {
					key := keys[0]
					if zipf != nil {
						key = keys[zipf.Uint64()]
					}
					t0 := time.Now()
					v, err := dec.decide(ctx, seq, key)
					t1 := time.Now()
					w.hist.record(t1.Sub(t0))
					switch v {
					case admitted:
						w.admitted++
					case denied:
						w.denied++
					case fellBack:
						w.fellBack++
					case failed:
						w.failed++
						if w.firstErr == nil {
							w.firstErr = err
						}
					}
					if t1.After(deadline) || ctx.Err() != nil {
						return
					}
				}
			}()
		}
		t0 := time.Now()
		deadline = t0.Add(d)
		close(start)
		wg.Wait()
		return time.Since(t0)
	}
	bc, _ := dec.(breakerCounter)
	var opened0, timeouts0 int64
	if sc.Warmup > 0 {
		pass(sc.Warmup, 1)
		if bc != nil {
			opened0, timeouts0 = bc.breakerCounts()
		}
		if open, err = openCounters(ctx, ctl, env); err != nil {
			return out, err
		}
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	elapsed := pass(d, 2)
	out.ElapsedS = elapsed.Seconds()
	runtime.ReadMemStats(&m1)
	out.Mallocs = m1.Mallocs - m0.Mallocs
	if bc != nil {
		opened, timeouts := bc.breakerCounts()
		out.BreakerOpened, out.Timeouts = opened-opened0, timeouts-timeouts0
	}

	// Close is inside the counters: its refunds and last reports are Redis work the
	// decisions cost.
	atClose, err := redisCPU(ctx, ctl)
	if err != nil {
		return out, err
	}
	callsAtClose := env.calls.snapshot()
	closed = true
	t0 := time.Now()
	// A deadline: a fleetlimit Limiter whose breaker a passing stall opened waits for its
	// probe, within half of it, before the refunds (hybrid.Limiter.Close).
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := dec.close(cctx); err != nil {
		return out, fmt.Errorf("%s: close: %w", rv.Name, err)
	}
	out.CloseS = time.Since(t0).Seconds()
	if err := ctx.Err(); err != nil {
		return out, err
	}
	cpu1, err := redisCPU(ctx, ctl)
	if err != nil {
		return out, err
	}
	calls := env.calls.snapshot()
	out.RedisCPUS, out.CloseCPUS = cpu1-open.cpu, cpu1-atClose
	sent, inClose := calls.sub(open.calls), calls.sub(callsAtClose)
	out.RoundTrips, out.CommandsSent, out.ScriptRuns = sent.trips, sent.commands, sent.scripts
	out.CloseCommands, out.CloseScripts = inClose.commands, inClose.scripts
	if out.Commands, err = commandStats(ctx, ctl); err != nil {
		return out, err
	}
	for _, calls := range out.Commands {
		out.RedisCalls += calls
	}

	var h histogram
	for _, w := range workers {
		h.merge(&w.hist)
		out.Admitted += w.admitted
		out.Denied += w.denied
		out.Failed += w.failed
		out.FellBack += w.fellBack
		if w.firstErr != nil && out.FirstError == "" {
			out.FirstError = w.firstErr.Error()
		}
	}
	out.P50Ns = int64(h.quantile(0.50))
	out.P99Ns = int64(h.quantile(0.99))
	return out, nil
}

// counters are the figures a row's Redis counts start from.
type counters struct {
	cpu   float64
	calls callSnapshot
}

// openCounters resets Redis's command statistics and reads its CPU time and the
// clients' counts: what a row's figures are counted from.
func openCounters(ctx context.Context, ctl *redis.Client, env *redisEnv) (counters, error) {
	if err := ctl.ConfigResetStat(ctx).Err(); err != nil {
		return counters{}, fmt.Errorf("CONFIG RESETSTAT: %w", err)
	}
	cpu, err := redisCPU(ctx, ctl)
	if err != nil {
		return counters{}, err
	}
	return counters{cpu: cpu, calls: env.calls.snapshot()}, nil
}

// redisCPU returns the CPU time the Redis process has used, user and system, in seconds.
func redisCPU(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	f := infoFields(info)
	var sum float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(f[k], 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %s: %w", k, err)
		}
		sum += v
	}
	return sum, nil
}

// commandStats returns INFO commandstats' calls per command since CONFIG RESETSTAT,
// leaving out the commands this program sends to measure (INFO, CONFIG RESETSTAT).
func commandStats(ctx context.Context, c *redis.Client) (map[string]int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	calls := make(map[string]int64)
	for k, v := range infoFields(info) {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok || name == "info" || name == "config|resetstat" {
			continue
		}
		field, _, _ := strings.Cut(v, ",")
		n, err := strconv.ParseInt(strings.TrimPrefix(field, "calls="), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("INFO commandstats: %s: %q: %w", k, v, err)
		}
		calls[name] = n
	}
	return calls, nil
}
