package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// procScenario is the per-client shape TestAsyncProcesses and TestWindowProcesses run as
// separate processes and in the simulator: burst/servers ≤ 1 at 8 and 16 servers, Zipf
// keys of which the hottest are far over their limit, a limit that charges later
// (HybridAsync) or a windowed one (HybridWindow).
func procScenario(servers int, st Strategy) Scenario {
	sc := Scenario{Name: fmt.Sprintf("procs-%d", servers), Servers: servers, Duration: 10 * time.Second, Seed: 1,
		Rate: 5, Burst: 5, Demand: 1600, Keys: 1000, ZipfS: 1.1, GoModel: true, Policy: FailClosed}
	if st == HybridWindow {
		// 20 s: over 10 s the windowed kind's calls per request at 8 servers varied by
		// about 1.5% from run to run on a 2-core host, a few percent off the simulator's
		// first-seconds figure, and one run in sixteen fell past the 5% the check allows;
		// over 20 s three runs read 1.018-1.025 of the simulator's at 8 and 0.994-1.008
		// at 16.
		sc.Duration = 20 * time.Second
		sc.Windowed = DefaultWindowed
	} else {
		sc.Async = 100 * time.Millisecond
	}
	return sc
}

// procResult is what one limiter process counted.
type procResult struct {
	Requests, Admitted, Waited int64
	Calls, Trips               int64
	KeyReq, KeyAdm             []int64
}

const procEnv = "FLEETLIMIT_PROC" // set in a child: "strategy index servers addr prefix start-unix-nano out-file"

// TestAsyncProcesses runs procScenario as N separate processes (N = 8 and 16), each one
// server with its own hybrid.Limiter (Async 100ms) on a redis-server of the test's own,
// each sending Demand/N Poisson requests a second over Zipf keys for 10 s (20 s for
// TestWindowProcesses), and compares
// the fleet's Redis calls per request and admitted share with the simulator's prediction
// for the same parameters: each within 5%. It needs redis-server (skipped without, failed
// under CI without), and runs only with -long (not under -short): two fleets of
// processes for 10 or 20 s of real time each, which the package's parallel tests wait for, so
// that nothing else loads the machine meanwhile.
func TestAsyncProcesses(t *testing.T) { testProcesses(t, HybridAsync) }

// TestWindowProcesses is TestAsyncProcesses with a windowed limit (Windowed 120ms).
func TestWindowProcesses(t *testing.T) { testProcesses(t, HybridWindow) }

func testProcesses(t *testing.T, st Strategy) {
	if os.Getenv(procEnv) != "" {
		procChild(t)
		return
	}
	if testing.Short() || !*longFlag {
		t.Skip("two fleets of processes, 10 or 20 s of real time each: run with -args -long")
	}
	srv := redistest.StartServer(t)
	for _, n := range []int{8, 16} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			sc := procScenario(n, st)
			real := runProcs(t, srv.Addr, sc, st)
			sim, err := Run(t, sc, st)
			if err != nil {
				t.Fatal(err)
			}
			realCalls := float64(real.Calls) / float64(real.Requests)
			realAdm := float64(real.Admitted) / float64(real.Requests)
			simAdm := float64(sim.Admitted+sim.AdmittedLate) / float64(sim.Requests)
			within := func(k []int64, a []int64) float64 {
				var req, adm float64
				for i := range k {
					if float64(k[i]) <= float64(sc.Burst)+sc.Rate*sc.Duration.Seconds() {
						req, adm = req+float64(k[i]), adm+float64(a[i])
					}
				}
				return adm / req
			}
			t.Logf("%d processes: %d requests, %.4f calls and %.4f round trips per request, %.4f admitted, within-limit keys %.2f%% admitted, %.2f%% of requests waited",
				n, real.Requests, realCalls, float64(real.Trips)/float64(real.Requests), realAdm, 100*within(real.KeyReq, real.KeyAdm), 100*float64(real.Waited)/float64(real.Requests))
			t.Logf("simulator:   %d requests, %.4f calls and %.4f round trips per request, %.4f admitted, within-limit keys %.2f%% admitted",
				sim.Requests, sim.RedisCallsPerRequest, sim.RedisRoundTripsPerRequest, simAdm, 100*sim.UnderLimitAdmitted)
			if r := realCalls / sim.RedisCallsPerRequest; math.Abs(r-1) > 0.05 {
				t.Errorf("calls per request: processes %.4f, simulator %.4f (%.3f×): more than 5%% apart", realCalls, sim.RedisCallsPerRequest, r)
			}
			if r := realAdm / simAdm; math.Abs(r-1) > 0.05 {
				t.Errorf("admitted share: processes %.4f, simulator %.4f (%.3f×): more than 5%% apart", realAdm, simAdm, r)
			}
		})
	}
}

// runProcs starts sc.Servers children of this test binary against the Redis at addr,
// each one server, and sums what they counted.
func runProcs(t *testing.T, addr string, sc Scenario, st Strategy) procResult {
	t.Helper()
	dir := t.TempDir()
	prefix := "procs" + strconv.Itoa(sc.Servers) + ":"
	start := time.Now().Add(2 * time.Second) // every child set up by then
	var cmds []*exec.Cmd
	for i := range sc.Servers {
		out := fmt.Sprintf("%s/%d.json", dir, i)
		cmd := exec.Command(os.Args[0], "-test.run=^TestAsyncProcesses$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %s %s %d %s", procEnv, st, i, sc.Servers, addr, prefix, start.UnixNano(), out))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	sum := procResult{KeyReq: make([]int64, sc.Keys), KeyAdm: make([]int64, sc.Keys)}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
		b, err := os.ReadFile(fmt.Sprintf("%s/%d.json", dir, i))
		if err != nil {
			t.Fatal(err)
		}
		var r procResult
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		sum.Requests += r.Requests
		sum.Admitted += r.Admitted
		sum.Waited += r.Waited
		sum.Calls += r.Calls
		sum.Trips += r.Trips
		for k := range r.KeyReq {
			sum.KeyReq[k] += r.KeyReq[k]
			sum.KeyAdm[k] += r.KeyAdm[k]
		}
	}
	return sum
}

// procChild is one server of testProcesses: a Limiter of procScenario's limit, and its
// share of the demand, counted.
func procChild(t *testing.T) {
	var idx, servers int
	var st, addr, prefix, out string
	var startNS int64
	if _, err := fmt.Sscan(os.Getenv(procEnv), &st, &idx, &servers, &addr, &prefix, &startNS, &out); err != nil {
		t.Fatalf("%s: %v", procEnv, err)
	}
	sc := procScenario(servers, Strategy(st))
	var counter redistest.Counter
	c := redis.NewClient(redistest.Options(addr))
	c.AddHook(&counter)
	defer c.Close()
	store, err := global.New(c, global.Prefix(prefix), global.ServerID(fmt.Sprintf("p%d", idx)))
	if err != nil {
		t.Fatal(err)
	}
	brk, err := breaker.New(breaker.Settings{Timeout: 100 * time.Millisecond, IsFailure: global.IsUnavailable})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(idx), 7))
	zipf := rand.NewZipf(rng, sc.ZipfS, 1, uint64(sc.Keys-1))
	r := procResult{KeyReq: make([]int64, sc.Keys), KeyAdm: make([]int64, sc.Keys)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil { // dialled before the start
		t.Fatal(err)
	}
	// The Limiter starts with the demand, as the simulator's servers do (a windowed
	// limit counts its keys' rates from its start).
	start := time.Unix(0, startNS)
	time.Sleep(time.Until(start))
	mode := hybrid.ChargeLater(sc.Async) // Exact when the scenario sets no Async
	if sc.Windowed > 0 {
		mode = hybrid.Windowed(sc.Windowed)
	}
	lim, err := hybrid.New(store, hybrid.Config{FleetSize: servers, Breaker: brk, Limits: []hybrid.Limit{{
		Name: limitName, Rate: sc.Rate, Burst: sc.Burst, Policy: breaker.FailClosed, Mode: mode}}})
	if err != nil {
		t.Fatal(err)
	}

	perS := sc.Demand / float64(servers)
	at := time.Duration(0)
	for {
		at += time.Duration(rng.ExpFloat64() / perS * float64(time.Second))
		if at >= sc.Duration {
			break
		}
		if d := time.Until(start.Add(at)); d > 0 {
			time.Sleep(d)
		}
		k := int(zipf.Uint64())
		wg.Go(func() {
			d, err := lim.Allow(ctx, limitName, "k"+strconv.Itoa(k))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			r.Requests++
			r.KeyReq[k]++
			if d.Allowed {
				r.Admitted++
				r.KeyAdm[k]++
			}
			if d.Source == hybrid.SourceGlobal || d.Reason == hybrid.ReasonTimeout {
				r.Waited++
			}
		})
	}
	wg.Wait()
	if err := lim.Close(ctx); err != nil {
		t.Fatal(err)
	}
	r.Calls, r.Trips = counter.Cmds.Load(), counter.Trips.Load()
	b, _ := json.Marshal(r)
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
