package e2e_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/goleak"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

var fullFaults = flag.Bool("faults", false, "run the whole fault matrix, every fault under every policy, and every Cluster failover, with longer phases (docs/operations.md)")

// fault is one thing Redis does to its clients, done by a client of the test's own.
type fault struct {
	name string
	// loses reports that the fault loses buckets (they come back empty, window arrays
	// are counted again), and the loss must be detected.
	loses bool
	// long: the fault runs with -faults only.
	long   bool
	inject func(t *testing.T, env faultEnv)
}

var faults = []fault{
	{name: "script-flush", inject: func(t *testing.T, env faultEnv) {
		admin := env.admin
		if err := admin.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "client-kill", inject: func(t *testing.T, env faultEnv) {
		admin := env.admin
		// Every normal connection, the limiters' and this one's: go-redis dials again.
		_ = admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err()
	}},
	{name: "flushall", loses: true, inject: func(t *testing.T, env faultEnv) {
		admin := env.admin
		if err := admin.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "evict", loses: true, inject: func(t *testing.T, env faultEnv) {
		admin := env.admin
		defer watchEvictions(t, admin, env.evicted)()
		// A memory limit just above what Redis holds, with a policy that evicts any
		// key, and 4 MB of other data: the buckets go, and no write fails while Redis
		// has keys to evict.
		ctx := context.Background()
		info, err := admin.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		var mem int64
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				mem, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if mem == 0 {
			t.Fatalf("no used_memory in INFO memory: %q", info)
		}
		for _, kv := range [][2]string{{"maxmemory-policy", "allkeys-lru"}, {"maxmemory", strconv.FormatInt(mem+256<<10, 10)}} {
			if err := admin.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
		junk := strings.Repeat("x", 1024)
		for i := range 4096 {
			err := admin.Set(ctx, fmt.Sprint("junk:", i), junk, 0).Err()
			if err != nil && strings.HasPrefix(err.Error(), "OOM ") {
				// Nothing left to evict: what Redis cannot evict (its clients' buffers,
				// which a loaded machine's slow clients grow past the 256 KB margin)
				// fills the limit by itself. The buckets have gone; the fleet's writes
				// get this error too until the limit is lifted, as from any Redis
				// that refuses them.
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "partition-half-600ms", inject: func(t *testing.T, env faultEnv) {
		// Half the servers lose Redis (their packets go nowhere); the others do not.
		env.cut.set(true)
		time.Sleep(600 * time.Millisecond)
		env.cut.set(false)
	}},
	{name: "stall-300ms", inject: func(t *testing.T, env faultEnv) {
		srv := env.srv
		srv.Stop() // SIGSTOP: connections stay open, nothing answers
		time.Sleep(300 * time.Millisecond)
		srv.Cont()
	}},
	{name: "kill-restart", loses: true, inject: func(t *testing.T, env faultEnv) {
		srv := env.srv
		srv.Kill()
		time.Sleep(300 * time.Millisecond)
		srv.Restart() // empty data, empty script cache
	}},
	// The outage docs/failure-policies.md measures FailLocal's debts and recovery on:
	// Redis gone for 10 s, back empty; the buckets would have expired by then anyway,
	// so it loses nothing. With -faults only.
	{name: "outage-10s", long: true, inject: func(t *testing.T, env faultEnv) {
		srv := env.srv
		srv.Kill()
		time.Sleep(10 * time.Second)
		srv.Restart()
	}},
}

// faultEnv is what a fault acts on: the test's redis-server, a client of its own, and
// the link of the servers behind the test's proxy (the first half of the fleet).
type faultEnv struct {
	srv     *redistest.Server
	admin   *redis.Client
	cut     *proxy
	evicted *[]string // the keys Redis evicted, if the fault evicts
}

// watchEvictions records into evicted every key Redis evicts from now until the
// function it returns is called (which waits for the last of them to arrive).
func watchEvictions(t *testing.T, admin *redis.Client, evicted *[]string) (stop func()) {
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "notify-keyspace-events", "Ee").Err(); err != nil {
		t.Fatal(err)
	}
	const done = "fleetlimit-test:evictions-done"
	ps := admin.Subscribe(ctx, "__keyevent@0__:evicted", done)
	if _, err := ps.Receive(ctx); err != nil { // the first subscription's confirmation
		t.Fatal(err)
	}
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for m := range ps.Channel() {
			if m.Channel == done {
				return
			}
			*evicted = append(*evicted, m.Payload)
		}
	}()
	return func() {
		// Published after the last eviction, the marker arrives after its event.
		if err := admin.Publish(ctx, done, "").Err(); err != nil {
			t.Error(err)
			_ = ps.Close() // ends the reader: no marker will come
		}
		<-finished
		_ = ps.Close()
		if err := admin.ConfigSet(ctx, "notify-keyspace-events", "").Err(); err != nil {
			t.Error(err)
		}
	}
}

// inUse reports whether Redis key k, evicted at about at, held what the fleet was
// using: a bucket (each key is in use throughout the run), or a window array of a
// window not ended at least a window before at. A loss of one is detected when the
// fleet next uses it; a loss of an ended window's array changes nothing.
func inUse(k, prefix string, at time.Time) bool {
	rest, ok := strings.CutPrefix(k, prefix)
	switch {
	case !ok:
		return false
	case strings.HasPrefix(rest, "{"):
		return true
	case strings.HasPrefix(rest, "win:"):
		f := strings.Split(rest[strings.LastIndexByte(rest, '}')+1:], ":") // "", w, win
		if len(f) != 3 {
			return false
		}
		w, err1 := strconv.ParseInt(f[1], 10, 64)
		win, err2 := strconv.ParseInt(f[2], 10, 64)
		return err1 == nil && err2 == nil && time.UnixMicro((win+2)*w).After(at)
	}
	return false
}

var faultPolicies = []struct {
	name   string
	policy breaker.Policy
}{
	{"fail-closed", breaker.FailClosed},
	{"fail-local", breaker.FailLocal()},
	{"fail-open", breaker.FailOpen},
}

// faultKind is a kind of limit the fault matrix runs: the hot key's and the cold keys'
// limits are of that kind.
type faultKind struct {
	name string
	mode hybrid.Mode
}

var faultKinds = []faultKind{
	{"bucket", hybrid.Exact()},
	{"charge-later", hybrid.ChargeLater(100 * time.Millisecond)},
	// The hot key's window is burst/rate = 100 ms; a report is at most half of it.
	{"windowed", hybrid.Windowed(50 * time.Millisecond)},
}

// bound is the hot key's stated bound over a window of length w while Redis answers
// (docs/limits.md): 2·burst + rate·w, and S·c for the kinds that admit without asking,
// c = max(1, ceil(burst/S)).
func (k faultKind) bound(w time.Duration) float64 {
	b := 2*hotBurst + hotRate*w.Seconds()
	if k.mode != hybrid.Exact() {
		b += cellServers * max(1, math.Ceil(float64(hotBurst)/cellServers))
	}
	return b
}

// localShares is what FailLocal's shares may admit beyond the bound before their debts
// are charged: each server's burst, ceil(burst/S).
const localShares = cellServers * (hotBurst + cellServers - 1) / cellServers

// TestFaultMatrix runs 4 limiters (4 servers; the first two reach Redis through a TCP
// proxy the test can cut) on a redis-server of the test's own, with a hot key far over
// its limit and 100 cold keys within theirs, through a healthy phase, a fault, and a
// phase after it, for each kind of limit, fault and failure policy (with -faults;
// otherwise each fault under each kind with one policy, -short one kind, with shorter
// phases, every kind, fault and policy still run). Each cell asserts (checkCell): no
// error from the Limiter; decisions within the limit's MaxWait plus a stated scheduling
// slack at the 99.9th percentile; the hot key's admissions within the kind's bound over
// the whole run (fail-local: plus the servers' local bursts; fail-open: what the
// servers' own pre-checks allow), and within the kind's bound from recovery on, under
// every policy; the buckets a fault loses detected and not refilled; the breakers
// closed, and the fallback done deciding for them, within the breaker's open time plus
// 200 ms of the fault's end, and at most 1% of the decisions after that out of MaxWait;
// no goroutine left once the limiters are closed; and every key the fleet wrote left
// with a TTL. Each cell logs its figures (docs/failure-policies.md, "The fault
// matrix").
func TestFaultMatrix(t *testing.T) {
	processes(t)
	healthy, after := 400*time.Millisecond, shortAfter
	if *fullFaults {
		healthy, after = time.Second, 2*time.Second
	}
	// Without -faults, fault i runs under each kind k with policy (i+k) mod 3, so that
	// every fault meets every policy and every kind; with -short, under kind i mod 3
	// alone, with policy (i + i/3) mod 3.
	runs := func(i, k, j int) bool {
		switch {
		case faults[i].long:
			return *fullFaults
		case *fullFaults:
			return true
		case testing.Short():
			return k == i%len(faultKinds) && j == (i+i/len(faultKinds))%len(faultPolicies)
		}
		return j == (i+k)%len(faultPolicies)
	}
	for i, f := range faults {
		for k, kind := range faultKinds {
			for j, p := range faultPolicies {
				if !runs(i, k, j) {
					continue
				}
				t.Run(kind.name+"/"+f.name+"/"+p.name, func(t *testing.T) {
					runFaultCell(t, kind, f, p.policy, healthy, after)
				})
			}
		}
	}
}

// The load of every fault cell: 4 servers, each with two callers on a hot key (together
// about 3 × its limit) and one cycling through the cold keys within their limits.
const (
	cellServers = 4
	hotRate     = 400.0
	hotBurst    = 40
	hotWindow   = hotBurst * time.Second / hotRate // a windowed limit's window
	coldKeys    = 100
	cellWait    = 10 * time.Millisecond // each limit's MaxWait
	cellSlack   = 90 * time.Millisecond // scheduling on a shared 2-core machine, -race
	quietAfter  = 300 * time.Millisecond
	// shortAfter is how long a cell runs after its fault without -faults: recovery must
	// be done by shortAfter - quietAfter (the last quietAfter is checked). Measured under
	// CI's load (this package's -race tests beside the other packages' -race tests on 2
	// cores), the fallback still made 8.7% of the decisions 600-900 ms after a
	// kill-restart in 1 run of 10 (TestFaultMatrix, 70 cells), and 7.4% 600-900 ms after
	// a Cluster promotion in a CI run; on a quiet machine, or with 4 busy loops beside a
	// plain run, at most 0.6% did in 140 cells. 1.5 s leaves 1.2 s.
	shortAfter = 1500 * time.Millisecond
)

// cellConfig is a fleet member's configuration in a fault cell: the hot key's and the
// cold keys' limits, of kind mode.
func cellConfig(mode hybrid.Mode, policy breaker.Policy) hybrid.Config {
	return hybrid.Config{
		FleetSize: cellServers,
		Limits: []hybrid.Limit{
			{Name: "hot", Rate: hotRate, Burst: hotBurst, Policy: policy, MaxWait: cellWait, Mode: mode},
			{Name: "cold", Rate: 20, Burst: 20, Policy: policy, MaxWait: cellWait, Mode: mode},
		},
	}
}

// cellBreaker is a fleet member's breaker in a fault cell: it probes every 200 ms.
var cellBreaker = breaker.Settings{OpenTimeout: 200 * time.Millisecond}

// fleetLoad runs the callers of a fault cell and records what it asserts on.
type fleetLoad struct {
	start    time.Time
	wg       sync.WaitGroup
	errs     atomic.Int64
	firstErr atomic.Value
	lat      latencies
	// phase is the window (0, 1, 2: the cell says which is which) that hot-key
	// admissions and cold-key decisions are counted in.
	phase    atomic.Int64
	admitted [3]atomic.Int64
	// cold and coldFallback count each cold key's decisions per phase, and those the
	// failure policy made.
	cold, coldFallback [3][coldKeys]atomic.Int64
	// win and winFallback are the same for the windowed limit "cold-win"
	// (TestClusterFailover's).
	win, winFallback [3][coldKeys]atomic.Int64
	stopAt           atomic.Int64 // UnixNano at which the callers stop
	quietFrom        atomic.Int64 // UnixNano from which fallback decisions are counted as late
	// quiet are the decisions asked for from quietFrom on: when, and whether the
	// fallback made them (late), guarded by quietMu.
	quietMu      sync.Mutex
	quiet        []quietDecision
	lastFallback atomic.Int64 // UnixNano of the latest fallback decision asked for
	// downAt are when the decisions that an open breaker or a failed call sent to the
	// fallback (not a MaxWait that ran out) were asked for; lastReason says what a
	// latest one was.
	downMu     sync.Mutex
	downAt     []time.Time
	lastReason atomic.Value
	// recoveredFrom is the UnixNano from which the fleet must be recovered: from it,
	// afterRecovery counts the decisions and timeoutsAfter those of a MaxWait that ran out.
	recoveredFrom                atomic.Int64
	afterRecovery, timeoutsAfter atomic.Int64
	lastOpen                     atomic.Int64 // the same, of an open breaker, for a key on onShard
	onShard                      *[coldKeys]bool
	// hotMu guards hotAt, the hot key's admissions: when each was asked for, since start.
	hotMu sync.Mutex
	hotAt []time.Duration
	// worstWait is the longest a decision took, in ns.
	worstWait atomic.Int64
	// redisAgain is the UnixNano at which the first hot-key decision of phase 2 that
	// Redis served (from a lease or the bucket) was asked for: the end of a fault.
	redisAgain atomic.Int64
}

// startLoad starts the callers on every server of fleet. onShard, if not nil, are the cold
// keys whose bucket the master that fails holds, with the hot key's (openAfter), and the
// fleet's servers have a windowed limit "cold-win" the cold keys' caller asks too.
func startLoad(fleet []*server, onShard *[coldKeys]bool) *fleetLoad {
	l := &fleetLoad{start: time.Now(), onShard: onShard}
	l.stopAt.Store(l.start.Add(time.Hour).UnixNano())
	for i, s := range fleet {
		for range 2 { // two callers on the hot key per server
			l.wg.Go(func() {
				for time.Now().UnixNano() < l.stopAt.Load() {
					l.decide(s.limiter, "hot", -1)
					time.Sleep(200 * time.Microsecond)
				}
			})
		}
		l.wg.Go(func() { // one caller cycling through the cold keys, well within their limits
			for n := i; time.Now().UnixNano() < l.stopAt.Load(); n++ {
				l.decide(s.limiter, "cold", n%coldKeys)
				if onShard != nil { // TestClusterFailover's fleet has a windowed limit too
					l.decide(s.limiter, "cold-win", n%coldKeys)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	return l
}

// coldKey is the name of cold key n.
func coldKey(n int) string { return fmt.Sprint("client-", n) }

// decide asks lim for the hot key (n < 0) or cold key n.
func (l *fleetLoad) decide(lim *hybrid.Limiter, limit string, n int) {
	key := "hot-client"
	if n >= 0 {
		key = coldKey(n)
	}
	t0 := time.Now()
	d, err := lim.Allow(context.Background(), limit, key)
	took := time.Since(t0)
	l.lat.add(took)
	if v := int64(took); v > l.worstWait.Load() {
		latest(&l.worstWait, time.Unix(0, v))
	}
	if err != nil {
		if l.errs.Add(1) == 1 {
			l.firstErr.Store(err)
		}
		return
	}
	phase := l.phase.Load()
	if limit == "hot" && d.Allowed {
		l.admitted[phase].Add(1)
		l.hotMu.Lock()
		l.hotAt = append(l.hotAt, t0.Sub(l.start))
		l.hotMu.Unlock()
	}
	if limit == "cold" {
		l.cold[phase][n].Add(1)
		if d.Source == hybrid.SourceFallback {
			l.coldFallback[phase][n].Add(1)
		}
	}
	if limit == "cold-win" {
		l.win[phase][n].Add(1)
		if d.Source == hybrid.SourceFallback {
			l.winFallback[phase][n].Add(1)
		}
	}
	if n < 0 && phase == 2 && (d.Source == hybrid.SourceLease || d.Source == hybrid.SourceGlobal) {
		l.redisAgain.CompareAndSwap(0, t0.UnixNano())
	}
	if d.Source == hybrid.SourceFallback {
		latest(&l.lastFallback, t0)
		if d.Reason != hybrid.ReasonTimeout {
			l.downMu.Lock()
			l.downAt = append(l.downAt, t0)
			l.downMu.Unlock()
			l.lastReason.Store(fmt.Sprintf("%s %s: %v", limit, key, d.Reason))
		}
	}
	if r := l.recoveredFrom.Load(); r != 0 && t0.UnixNano() >= r {
		l.afterRecovery.Add(1)
		if d.Reason == hybrid.ReasonTimeout {
			l.timeoutsAfter.Add(1)
		}
	}
	if d.Reason == hybrid.ReasonBreakerOpen && l.onShard != nil && (limit == "hot" || limit == "cold" && l.onShard[n]) {
		latest(&l.lastOpen, t0)
	}
	if q := l.quietFrom.Load(); q != 0 && t0.UnixNano() >= q {
		l.quietMu.Lock()
		l.quiet = append(l.quiet, quietDecision{at: t0, late: d.Source == hybrid.SourceFallback})
		l.quietMu.Unlock()
	}
}

// quietDecision is a decision asked for at at, from quietFrom on; late: the fallback
// made it.
type quietDecision struct {
	at   time.Time
	late bool
}

// lateBefore returns how many decisions from quietFrom on, asked for before until (the
// zero time: all of them), the fallback made, of how many.
func (l *fleetLoad) lateBefore(until time.Time) (late, of int) {
	l.quietMu.Lock()
	defer l.quietMu.Unlock()
	for _, q := range l.quiet {
		if until.IsZero() || q.at.Before(until) {
			of++
			if q.late {
				late++
			}
		}
	}
	return late, of
}

// lastDownBefore returns the latest of downAt before t, the zero time if none.
func (l *fleetLoad) lastDownBefore(t time.Time) time.Time {
	l.downMu.Lock()
	defer l.downMu.Unlock()
	var last time.Time
	for _, at := range l.downAt {
		if at.Before(t) && at.After(last) {
			last = at
		}
	}
	return last
}

// latest moves v up to t, if t is later.
func latest(v *atomic.Int64, t time.Time) {
	for at := v.Load(); at < t.UnixNano() && !v.CompareAndSwap(at, t.UnixNano()); at = v.Load() {
	}
}

// openAfter is how long after end the last decision of a key on the failed master that
// its open breaker sent to the policy was asked for: 0 if none was after end.
func (l *fleetLoad) openAfter(end time.Time) time.Duration {
	return max(time.Duration(l.lastOpen.Load()-end.UnixNano()), 0)
}

// stop stops the callers, waits for them, and returns how long they ran.
func (l *fleetLoad) stop() time.Duration {
	l.stopAt.Store(0)
	l.wg.Wait()
	return time.Since(l.start)
}

// recovery is how long after end (the fault's end, a replica's promotion) the last
// decision the fallback made was asked for: 0 if none was after end.
func (l *fleetLoad) recovery(end time.Time) time.Duration {
	return max(time.Duration(l.lastFallback.Load()-end.UnixNano()), 0)
}

// hotAdmitted returns the hot key's admissions over every phase.
func (l *fleetLoad) hotAdmitted() int64 {
	return l.admitted[0].Load() + l.admitted[1].Load() + l.admitted[2].Load()
}

// check asserts what every cell asserts of its decisions: no error from the Limiter,
// the 99.9th percentile of latency within the limit's wait plus scheduling slack, and
// the fallback no longer deciding in the last quietAfter, up to reopenAt if a breaker
// opened again after recovery (the zero time if none did: a breaker that opens again on
// a healthy Redis is the shared machine stalling Redis or the client, and the policy
// decides then, as the cell's other checks after recovery also take it). It returns the
// percentile.
func (l *fleetLoad) check(t *testing.T, reopenAt time.Time) time.Duration {
	t.Helper()
	if n := l.errs.Load(); n > 0 {
		t.Errorf("%d errors from the Limiter, the first: %v", n, l.firstErr.Load())
	}
	p999 := l.lat.quantile(0.999)
	if p999 > cellWait+cellSlack {
		t.Errorf("decision latency p99.9 %v, want at most the limit's wait %v plus %v of scheduling", p999, cellWait, cellSlack)
	}
	n, of := l.lateBefore(reopenAt)
	switch {
	case of == 0 && !reopenAt.IsZero() && reopenAt.UnixNano() <= l.quietFrom.Load():
		t.Logf("a breaker opened again %v before the last %v, after recovery: no decision of those to check", time.Duration(l.quietFrom.Load()-reopenAt.UnixNano()).Round(time.Millisecond), quietAfter)
	case of == 0 || float64(n) > 0.05*float64(of):
		t.Errorf("%d of %d decisions in the last %v were still the fallback's: not recovered", n, of, quietAfter)
	case !reopenAt.IsZero():
		t.Logf("a breaker opened again after recovery: %d of %d decisions in the last %v before that were the fallback's", n, of, quietAfter)
	}
	return p999
}

// lostBuckets returns the buckets the fleet's servers counted lost: of every limit, and
// of the hot one.
func lostBuckets(fleet []*server) (all, hot int64) {
	for _, s := range fleet {
		for _, ls := range s.limiter.Stats().Limits {
			all += ls.LostBuckets
			if ls.Name == "hot" {
				hot += ls.LostBuckets
			}
		}
	}
	return all, hot
}

// checkPreChecks asserts the bound every policy keeps: each server's own pre-check (the
// fleet's rate and burst) caps what the fallback can add, so the hot key admits at most
// servers × (burst + rate·T) in all.
func checkPreChecks(t *testing.T, admitted int64, elapsed time.Duration) {
	t.Helper()
	if bound := cellServers * (hotBurst + hotRate*elapsed.Seconds()); float64(admitted) > bound {
		t.Errorf("hot key: %d admitted in %v, more than %d servers' pre-checks allow (%.0f)", admitted, elapsed.Round(time.Millisecond), cellServers, bound)
	}
}

// recoverySlack is how long after the breaker's open time past a fault's end the
// fallback may still decide: one probe's round trip and the scheduling of a shared
// 2-core machine.
const recoverySlack = 200 * time.Millisecond

// breakerLog records the breakers' changes of a fault cell's servers.
type breakerLog struct {
	mu        sync.Mutex
	notClosed int         // breakers not closed now
	opened    []time.Time // when the first breaker left closed, every time one did
	closed    []time.Time // when the last breaker closed again, every time one did
	changes   []string    // every change, when and what, for the log
	failures  []failure   // every call the breakers counted as a failure
}

// failure is a call a breaker counted as a store failure: when, and its error.
type failure struct {
	at  time.Time
	err string
}

// settings returns cellBreaker with OnStateChange recording into b.
func (b *breakerLog) settings() breaker.Settings {
	st := cellBreaker
	st.IsFailure = func(err error) bool {
		if !global.IsUnavailable(err) {
			return false
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		b.failures = append(b.failures, failure{time.Now(), err.Error()})
		return true
	}
	st.OnStateChange = func(from, to breaker.State) {
		now := time.Now()
		b.mu.Lock()
		defer b.mu.Unlock()
		b.changes = append(b.changes, fmt.Sprintf("%s %v>%v", now.Format("05.000"), from, to))
		if from == breaker.StateClosed {
			if b.notClosed++; b.notClosed == 1 {
				b.opened = append(b.opened, now)
			}
		}
		if to == breaker.StateClosed {
			if b.notClosed--; b.notClosed == 0 {
				b.closed = append(b.closed, now)
			}
		}
	}
	return st
}

// failuresAfter lists the failures counted after end, when and what.
func (b *breakerLog) failuresAfter(end time.Time) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, f := range b.failures {
		if f.at.After(end) {
			out = append(out, f.at.Format("05.000")+" "+f.err)
		}
	}
	return out
}

// recovered returns when every breaker was closed again after end (end itself if they
// all were closed at end), when one first left closed after that (zero: never) and how
// many times one did, and how many are not closed now.
func (b *breakerLog) recovered(end time.Time) (at, reopenAt time.Time, reopened, open int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	at = end
	// Not closed at end: some left closed at or before end and did not all close again
	// before it.
	i, _ := slices.BinarySearchFunc(b.opened, end, time.Time.Compare)
	j, _ := slices.BinarySearchFunc(b.closed, end, time.Time.Compare)
	if i > j && j < len(b.closed) {
		at = b.closed[j]
	} else if i > j {
		at = time.Time{} // never
	}
	if !at.IsZero() {
		k, _ := slices.BinarySearchFunc(b.opened, at, time.Time.Compare)
		if reopened = len(b.opened) - k; reopened > 0 {
			reopenAt = b.opened[k]
		}
	}
	return at, reopenAt, reopened, b.notClosed
}

// cellResult is what a fault cell measured, for its log line and docs/failure-policies.md.
type cellResult struct {
	admitted          int64
	rateT             float64       // rate·T over the run
	excess            float64       // admitted - rate·T
	during            float64       // admissions from the fault's start to its end, less rate·that
	worstAfter        float64       // the worst window from recovery on, as a share of its bound
	recovery          time.Duration // the last fallback decision after the fault's end
	breakerRecovery   time.Duration // the last breaker change after the fault's end
	p999, worstWait   time.Duration
	timeouts, ofAfter int64 // decisions whose MaxWait ran out after recovery, of all after it
	reopened          int   // times a breaker left closed after recovery
	open              int   // breakers not closed at the end
	lost, ttlLess     int64
	keys, windowKeys  int
}

func runFaultCell(t *testing.T, kind faultKind, f fault, policy breaker.Policy, healthy, after time.Duration) {
	ignore := goleak.IgnoreCurrent()
	srv := redistest.StartServer(t)
	admin := redis.NewClient(redistest.Options(srv.Addr))
	cut := newProxy(t, srv.Addr)
	prefix := randomPrefix()
	var (
		fleet []*server
		brks  breakerLog
	)
	for i := range cellServers {
		addr := srv.Addr
		if i < cellServers/2 {
			addr = cut.addr
		}
		// Each server's client as docs/operations.md has one built: global.Configure's
		// timeouts, and its dialler, which keeps dialling after an outage.
		o := redistest.Options(addr)
		global.Configure(o)
		c := redis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		fleet = append(fleet, newServerOn(t, c, prefix, brks.settings(), cellConfig(kind.mode, policy)))
	}

	load := startLoad(fleet, nil)
	time.Sleep(healthy)
	faultStart := time.Now()
	load.phase.Store(1)
	var evicted []string
	f.inject(t, faultEnv{srv: srv, admin: admin, cut: cut, evicted: &evicted})
	faultEnd := time.Now()
	load.phase.Store(2)
	load.quietFrom.Store(faultEnd.Add(after - quietAfter).UnixNano())
	load.recoveredFrom.Store(faultEnd.Add(cellBreaker.OpenTimeout + recoverySlack).UnixNano())
	time.Sleep(after)
	elapsed := load.stop()

	var r cellResult
	closedAt, reopenAt, reopened, open := brks.recovered(faultEnd)
	r.p999 = load.check(t, reopenAt)
	r.worstWait = time.Duration(load.worstWait.Load())
	r.lost, _ = lostBuckets(fleet)
	r.admitted = load.hotAdmitted()
	r.rateT = hotRate * elapsed.Seconds()
	r.excess = float64(r.admitted) - r.rateT
	faultFor := faultEnd.Sub(faultStart)
	r.during = float64(load.admitted[1].Load()) - hotRate*faultFor.Seconds()
	slices.Sort(load.hotAt)

	// The whole run: the kind's bound; fail-local adds the servers' local bursts, which
	// its debts repay; fail-open, what each server's pre-check allows.
	switch policy {
	case breaker.FailOpen:
		checkPreChecks(t, r.admitted, elapsed)
	default:
		bound := kind.bound(elapsed)
		if policy != breaker.FailClosed {
			bound += localShares
		}
		if float64(r.admitted) > bound {
			t.Errorf("hot key: %d admitted in %v, bound %.0f", r.admitted, elapsed.Round(time.Millisecond), bound)
		}
	}
	used := 0
	for _, k := range evicted {
		if inUse(k, prefix, faultStart) {
			used++
		}
	}
	switch {
	case !f.loses || r.lost > 0:
	case f.name == "evict" && used == 0:
		// Redis's LRU chose other keys (the test's own data, ended windows' arrays)
		t.Logf("%s: none of the %d keys Redis evicted was in use", f.name, len(evicted))
	case f.name == "evict" && kind.name == "windowed":
		// A server knows a window's array was lost only from a count below what it
		// added there itself (docs/failure-policies.md): an array evicted once the key's
		// servers had stopped adding to it, or one another server refills, goes unseen.
		// The kind's bound, checked above, is what holds.
		t.Logf("%s: %d arrays in use evicted, no loss seen by a server that had added to one", f.name, used)
	case f.name == "kill-restart" && kind.name == "windowed" && faultFor >= 3*hotWindow:
		// A server writes a key's current window and, ahead, the next one, and reads the
		// current and the one before: three windows after the kill, every array read was
		// created after the restart, and the lost ones had ended. A server may still see
		// the loss in a report for an ended window sent after the restart, or may not;
		// the kind's bound, checked above, is what holds.
		t.Logf("%s: the fault lasted %v, %d windows: no array in use was lost (%d losses seen)",
			f.name, faultFor.Round(time.Millisecond), faultFor/hotWindow, r.lost)
	default:
		t.Errorf("%s lost buckets (%d keys in use evicted), but no server counted a lost bucket", f.name, used)
	}
	// Recovery: within the open time plus one probe of the fault's end every breaker is
	// closed, and no decision went to the fallback for an open breaker or a failed call
	// after that. A breaker that opens again later, on a healthy Redis, is the shared
	// machine stalling Redis or the client (the late check above bounds it), and a MaxWait
	// that runs out after it the same: at most 1% of the decisions after recovery.
	limit := cellBreaker.OpenTimeout + recoverySlack
	if closedAt.IsZero() {
		t.Errorf("the breakers did not close after the fault's end")
		closedAt = time.Now()
	}
	r.breakerRecovery = closedAt.Sub(faultEnd)
	r.recovery = max(load.lastDownBefore(closedAt.Add(recoverySlack/4)).Sub(faultEnd), r.breakerRecovery, 0)
	switch {
	case r.recovery <= limit:
	default:
		t.Errorf("recovered %v after the fault's end (breakers closed after %v; %v), want at most %v",
			r.recovery.Round(time.Millisecond), r.breakerRecovery.Round(time.Millisecond), load.lastReason.Load(), limit)
	}
	r.reopened = reopened
	r.timeouts, r.ofAfter = load.timeoutsAfter.Load(), load.afterRecovery.Load()
	if float64(r.timeouts) > 0.01*float64(r.ofAfter) {
		t.Errorf("%d of %d decisions from %v after the fault's end ran out of MaxWait", r.timeouts, r.ofAfter, limit)
	}
	r.open = open
	// From recovery on, under every policy, while Redis answers (until a breaker opens
	// again, if one does: the machine stalled Redis or the client, and the policy
	// decides): every window of 250 ms, 500 ms, 1 s and the whole rest within the
	// kind's bound.
	from, to := faultEnd.Add(limit).Sub(load.start), elapsed
	if !reopenAt.IsZero() {
		to = min(to, reopenAt.Sub(load.start))
	}
	for _, w := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, to - from} {
		if got, n := worstWindow(load.hotAt, from, to, w), kind.bound(w); got > 0 {
			r.worstAfter = max(r.worstAfter, float64(got)/n)
			if float64(got) > n {
				t.Errorf("hot key: %d admitted in a window of %v after recovery, bound %.0f", got, w.Round(time.Millisecond), n)
			}
		}
	}

	for _, s := range fleet {
		_ = s.limiter.Close(context.Background())
		_ = s.client.Close()
	}
	r.keys, r.windowKeys, r.ttlLess = checkExpiries(t, admin, prefix)
	t.Logf("fault from %s to %s; breakers: %v; failures after the fault: %v", faultStart.Format("05.000"), faultEnd.Format("05.000"), brks.changes, brks.failuresAfter(faultEnd))
	t.Logf("%v, fault %v: hot key admitted %d (rate·T %.0f, excess %+.0f; during the fault %+.0f over rate·T; worst window after recovery %.2f of its bound); "+
		"recovered %v after the fault (breakers closed after %v, opened again %d times, %d not closed at the end), timeouts after that %d of %d; decisions p99.9 %v, longest %v (MaxWait %v); lost buckets %d; keys left %d (window arrays %d), without a TTL %d",
		elapsed.Round(time.Millisecond), faultFor.Round(time.Millisecond), r.admitted, r.rateT, r.excess, r.during, r.worstAfter,
		r.recovery.Round(time.Millisecond), r.breakerRecovery.Round(time.Millisecond), r.reopened, r.open, r.timeouts, r.ofAfter, r.p999, r.worstWait.Round(time.Microsecond), cellWait,
		r.lost, r.keys, r.windowKeys, r.ttlLess)
	_ = admin.Close()
	cut.close()
	srv.Kill() // its process's waiter is the test's own goroutine
	goleak.VerifyNone(t, ignore)
}

// worstWindow returns the most of the instants at (sorted) in a window of length w
// within [from, end].
func worstWindow(at []time.Duration, from, end, w time.Duration) int {
	if w <= 0 || from+w > end {
		return 0
	}
	worst, j := 0, 0
	i0, _ := slices.BinarySearch(at, from)
	for i := i0; i < len(at) && at[i]+w <= end; i++ {
		for j < len(at) && at[j] < at[i]+w {
			j++
		}
		worst = max(worst, j-i)
	}
	return worst
}

// checkExpiries asserts that every key under prefix expires: buckets, window arrays, the
// marks, whatever a fault did to them. It returns the keys, the window arrays among them,
// and the keys without a TTL.
func checkExpiries(t *testing.T, admin *redis.Client, prefix string) (keys, wins int, ttlLess int64) {
	t.Helper()
	ctx := context.Background()
	all, err := admin.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Errorf("listing the keys: %v", err)
		return 0, 0, 0
	}
	for _, k := range all {
		if strings.Contains(k, ":win:") {
			wins++
		}
		if d, err := admin.PTTL(ctx, k).Result(); err == nil && d == -1 {
			t.Errorf("%s has no TTL", k)
			ttlLess++
		}
	}
	return len(all), wins, ttlLess
}

// proxy forwards TCP connections to a Redis; while cut, it forwards nothing in either
// direction and holds new connections without answering: a partition, as a client sees
// one (its calls time out), not a refused connection.
type proxy struct {
	addr string
	ln   net.Listener
	mu   sync.Mutex
	down bool
	heal chan struct{} // closed when the cut ends
	wg   sync.WaitGroup
	conn []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), ln: ln, heal: make(chan struct{})}
	close(p.heal)
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.serve(c, target) })
		}
	})
	return p
}

// set cuts the link (true) or heals it (false). A cut closes every connection it
// carries: their calls see nothing more, as across a partition.
func (p *proxy) set(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if down == p.down {
		return
	}
	p.down = down
	if down {
		p.heal = make(chan struct{})
		for _, c := range p.conn {
			_ = c.(interface{ SetDeadline(time.Time) error }).SetDeadline(time.Now()) // stop forwarding now
		}
		return
	}
	close(p.heal)
}

func (p *proxy) serve(c net.Conn, target string) {
	defer c.Close()
	p.mu.Lock()
	heal := p.heal
	p.conn = append(p.conn, c)
	p.mu.Unlock()
	<-heal // a connection made during a cut hangs until it ends
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	p.mu.Lock()
	p.conn = append(p.conn, up)
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.set(false)
	p.mu.Lock()
	for _, c := range p.conn {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// clusterFault fails over the master that holds the hot key's slot, in a cluster of
// the test's own.
type clusterFault struct {
	name string
	// inject starts the fault on the master of shard i.
	inject func(c *redistest.OwnCluster, i int)
	// promoted, if set, runs once the replica of shard i has taken over.
	promoted func(c *redistest.OwnCluster, i int)
	// short: the cell runs, under every policy, without -faults.
	short bool
}

var clusterFaults = []clusterFault{
	// The master dies; its replica takes over after cluster-node-timeout.
	{name: "kill-master", short: true, inject: func(c *redistest.OwnCluster, i int) { c.Masters[i].Kill() }},
	// The master freezes (a paused VM, a long fork); its replica takes over; then the
	// old master runs again, still a master in its own eyes until it hears otherwise.
	{name: "stall-master", inject: func(c *redistest.OwnCluster, i int) { c.Masters[i].Stop() },
		promoted: func(c *redistest.OwnCluster, i int) { c.Masters[i].Cont() }},
}

// TestClusterFailover is the fault matrix's cell for a Redis Cluster: the same fleet and
// load as TestFaultMatrix (4 limiters, a hot key at about 3 × its limit, 100 cold keys),
// each limiter on a go-redis ClusterClient built with global.ConfigureCluster, on a
// cluster of the test's own (3 masters, a replica each, cluster-node-timeout 1 s). The
// master that holds the hot key's bucket is killed (or stalled, with -faults) until its
// replica takes over. Each cell asserts what the matrix asserts (no error, latency,
// the policy's bound, recovered by the end, no goroutine left) and:
//   - the tokens the old master granted that its replica never received (asynchronous
//     replication) are measured: the hot key's records on the replica, read once it has
//     applied all its master sent, against the take answers each server got from the
//     old master. Fail-closed's bound grows by them, and the tokens the cluster granted
//     stay within burst + rate·T plus them;
//   - Redis serves the hot key again within failoverRecovery of the promotion;
//   - the keys on the masters that kept answering are decided as if nothing happened:
//     at most 5% of their decisions in the outage go to the policy (each master has
//     its own breaker), the bucket limit's and the windowed limit's whose shards they
//     hold; the windowed keys of the failed master's shards go to the policy; and no
//     server keeps an open breaker, or one for the old master, once the failover is
//     over.
func TestClusterFailover(t *testing.T) {
	processes(t)
	healthy, after := 400*time.Millisecond, shortAfter
	if *fullFaults {
		healthy, after = time.Second, 2*time.Second
	}
	for _, f := range clusterFaults {
		if !*fullFaults && !f.short {
			continue
		}
		for _, p := range faultPolicies {
			t.Run(f.name+"/"+p.name, func(t *testing.T) {
				runFailoverCell(t, f, p.policy, healthy, after)
			})
		}
	}
}

// breakersSettle bounds how long after a failover cell's load stops its servers may
// keep a breaker for the old master or an open one. The servers recheck the slot map
// every 100 ms while a breaker is open, each load bounded by 50 ms, and on a quiet
// machine, or with three busy loops beside -race on 2 cores, they had settled 1-7 ms
// after the load stopped; a CI run on a loaded host once found two open breakers at
// that instant. A load that runs out of its time is tried again 100 ms later.
const breakersSettle = 5 * time.Second

// breakersSettled waits until no server of fleet keeps a breaker for oldMaster or an
// open one, at most breakersSettle, and returns how long it waited and, if it ran out
// of time, what each server still kept.
func breakersSettled(fleet []*server, oldMaster string) (time.Duration, []string) {
	start := time.Now()
	for {
		var stuck []string
		for i, s := range fleet {
			for _, nd := range s.limiter.Stats().Nodes {
				if nd.Addr == oldMaster || nd.Breaker == breaker.StateOpen {
					stuck = append(stuck, fmt.Sprintf("server %d: breaker of %s (%v)", i, nd.Addr, nd.Breaker))
				}
			}
		}
		waited := time.Since(start)
		if len(stuck) == 0 || waited > breakersSettle {
			return waited, stuck
		}
		time.Sleep(10 * time.Millisecond) // nothing to wait on: each server's goroutine rechecks on its own
	}
}

// failoverRecovery is how soon after its replica's promotion a killed master's keys are
// decided by Redis again: the breaker's next probe fails on the dead address and makes
// the client reload its slot map, and the probe after it reaches the new master (two
// open periods of 200 ms), plus scheduling.
const failoverRecovery = 600 * time.Millisecond

func runFailoverCell(t *testing.T, f clusterFault, policy breaker.Policy, healthy, after time.Duration) {
	ignore := goleak.IgnoreCurrent()
	c := redistest.StartCluster(t, redistest.ClusterConfig{NodeTimeout: time.Second})
	prefix := randomPrefix()
	var (
		fleet []*server
		takes takeLog
	)
	for range cellServers {
		o := &redis.ClusterOptions{
			Addrs:                    c.Addrs(),
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		}
		global.ConfigureCluster(o)
		cc := redis.NewClusterClient(o)
		t.Cleanup(func() { _ = cc.Close() })
		cc.OnNewNode(func(node *redis.Client) { node.AddHook(takes.hook(node.Options().Addr)) })
		cfg := cellConfig(hybrid.Exact(), policy)
		// A windowed limit beside the bucket ones: its arrays and marks on the cluster.
		cfg.Limits = append(cfg.Limits, hybrid.Limit{Name: "cold-win", Rate: 20, Burst: 20, Policy: policy, MaxWait: cellWait, Mode: hybrid.Windowed(50 * time.Millisecond)})
		fleet = append(fleet, newServerOn(t, cc, prefix, cellBreaker, cfg))
	}
	ctx := context.Background()
	shardOf := func(key string) int {
		slot, err := fleet[0].client.(*redis.ClusterClient).ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
		}
		return c.Shard(int(slot))
	}
	hotKey := fleet[0].store.Key("hot", "hot-client")
	takes.watch(hotKey)
	shard := shardOf(hotKey)
	oldMaster := c.Masters[shard].Addr
	var coldOnShard [coldKeys]bool // the cold keys whose bucket the failed master holds
	// The cold keys whose windowed counts or marks the failed master holds: the limit is
	// counted in wire.WindowShards shards on a Cluster, each under a tag of its own.
	var winOnShard [coldKeys]bool
	for n := range coldKeys {
		coldOnShard[n] = shardOf(fleet[0].store.Key("cold", coldKey(n))) == shard
		id := wire.KeyID(coldKey(n))
		counts := wire.MarksKey(prefix, "cold-win", wire.WindowShards, wire.WindowShard(id, wire.WindowShards))
		marks := wire.MarksKey(prefix, "cold-win", wire.WindowShards, wire.WindowMarksShard(id, wire.WindowShards))
		winOnShard[n] = shardOf(counts) == shard || shardOf(marks) == shard
	}

	const (
		phaseHealthy = iota
		phaseOutage  // from the fault to the replica's promotion
		phaseAfter
	)
	load := startLoad(fleet, &coldOnShard)
	time.Sleep(healthy)
	faultAt := time.Now()
	load.phase.Store(phaseOutage)
	f.inject(c, shard)

	// What the replica holds of the hot bucket once it has all its master sent: the
	// state it takes over with.
	settle, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Settled(settle, shard); err != nil {
		t.Fatalf("replica of shard %d: %v", shard, err)
	}
	onReplica, err := c.ReadOnly(c.Replicas[shard]).HGetAll(ctx, hotKey).Result()
	if err != nil {
		t.Fatalf("hot bucket on the replica: %v", err)
	}

	wait, cancelWait := context.WithTimeout(ctx, 15*time.Second)
	defer cancelWait()
	promotedAt, err := c.Promoted(wait, shard)
	if err != nil {
		t.Fatalf("replica of shard %d not promoted: %v", shard, err)
	}
	load.phase.Store(phaseAfter)
	if f.promoted != nil {
		f.promoted(c, shard)
	}
	load.quietFrom.Store(promotedAt.Add(after - quietAfter).UnixNano())
	time.Sleep(time.Until(promotedAt.Add(after)))
	elapsed := load.stop()

	p999 := load.check(t, time.Time{})
	recovery := "never"
	if at := load.redisAgain.Load(); at == 0 {
		t.Errorf("Redis served no hot-key decision in the %v after the promotion", after)
	} else if d := time.Duration(at - promotedAt.UnixNano()); d > failoverRecovery {
		t.Errorf("Redis served the hot key again %v after the promotion, want at most %v", d.Round(time.Millisecond), failoverRecovery)
	} else {
		recovery = d.Round(time.Millisecond).String()
	}
	lost, hotLost := lostBuckets(fleet)
	lostTokens, lostTakes, oldTakes := takes.lost(oldMaster, onReplica)
	if oldTakes == 0 {
		t.Errorf("no take answer from the old master %s was logged: the loss measured says nothing", oldMaster)
	}
	var granted, refunded int64
	for _, s := range fleet {
		for _, ls := range s.limiter.Stats().Limits {
			if ls.Name == "hot" {
				// A refund that timed out may have been applied: it counts as given back.
				granted, refunded = granted+ls.Granted, refunded+ls.Refunded+ls.RefundsLost
			}
		}
	}
	// The bucket hands out at most burst + rate·T and what it was given back; the old
	// master's grants the replica never saw come on top, and a burst for each bucket
	// counted lost (one the replica never had comes back empty: slack the bound keeps).
	extra := float64(lostTokens) + hotBurst*float64(hotLost)
	if bound := hotBurst + hotRate*elapsed.Seconds() + extra; float64(granted-refunded) > bound {
		t.Errorf("hot key: the cluster granted %d tokens net of refunds in %v, bound %.0f", granted-refunded, elapsed.Round(time.Millisecond), bound)
	}
	admitted := load.hotAdmitted()
	switch policy {
	case breaker.FailClosed:
		if bound := 2*hotBurst + hotRate*elapsed.Seconds() + extra; float64(admitted) > bound {
			t.Errorf("hot key: %d admitted in %v, bound %.0f", admitted, elapsed.Round(time.Millisecond), bound)
		}
	default:
		checkPreChecks(t, admitted, elapsed)
	}
	// The share of the cold keys' decisions in the outage that the policy made: of the
	// keys on the failed master, and of those on the masters that kept answering.
	share := func(on *[coldKeys]bool, onShard bool, decided, fellBack *[3][coldKeys]atomic.Int64) float64 {
		var all, fallback int64
		for n := range coldKeys {
			if on[n] == onShard {
				all += decided[phaseOutage][n].Load()
				fallback += fellBack[phaseOutage][n].Load()
			}
		}
		return 100 * float64(fallback) / float64(max(all, 1))
	}
	coldShare := func(onShard bool) float64 { return share(&coldOnShard, onShard, &load.cold, &load.coldFallback) }
	winShare := func(onShard bool) float64 { return share(&winOnShard, onShard, &load.win, &load.winFallback) }
	// Of all the cold keys' decisions in the outage, the policy makes about the failed
	// master's share: the share of its keys (onFailed of coldKeys: the keys' slots are
	// the same in every run, the prefix being outside their hash tags), plus at most 5%
	// of the others', which the next check bounds.
	var coldAll, coldFell int64
	onFailed := 0
	for n := range coldKeys {
		coldAll += load.cold[phaseOutage][n].Load()
		coldFell += load.coldFallback[phaseOutage][n].Load()
		if coldOnShard[n] {
			onFailed++
		}
	}
	allShare := 100 * float64(coldFell) / float64(max(coldAll, 1))
	// A failed master costs only its own keys: each master has its breaker, and the
	// others answer (cluster-require-full-coverage no). A windowed limit's keys whose
	// shards the other masters hold are counted there.
	if s := coldShare(false); s > 5 {
		t.Errorf("cold keys on the masters that kept answering: %.0f%% of their decisions in the outage went to the policy, want at most 5%%", s)
	}
	if s := winShare(false); s > 5 {
		t.Errorf("windowed keys whose shards the masters that kept answering hold: %.0f%% of their decisions in the outage went to the policy, want at most 5%%", s)
	}
	// And those whose shards the failed master holds follow their policy (about 70%;
	// the rest decided from fresh marks): the limit is counted in shards over every
	// master, not on one master for all its keys.
	if s := winShare(true); s < 30 {
		t.Errorf("windowed keys whose shards the failed master holds: %.0f%% of their decisions in the outage went to the policy, want at least 30%%", s)
	}
	// The failed master's breaker is gone with it once its slots moved: no breaker
	// stays open for an address that no longer serves a slot. Each server finds that
	// out on its own goroutine (recheck, every 100 ms while a breaker is open, a slot
	// map load of at most 50 ms each), so the check waits for it, up to breakersSettle
	// after the load stopped, and reports how long it took.
	settled, stuck := breakersSettled(fleet, oldMaster)
	for _, s := range stuck {
		t.Errorf("%s still kept %v after the load stopped", s, breakersSettle)
	}
	outage := promotedAt.Sub(faultAt)
	afterFor := elapsed - promotedAt.Sub(load.start)
	late, lateOf := load.lateBefore(time.Time{})
	t.Logf("%v: hot key on shard %d; promoted %v after the fault; Redis served the hot key again %v after that; hot key admitted %d (%.2f× rate·T): healthy %.2f×, outage %.2f×, after %.2f×; cold keys' decisions by the policy in the outage: %.0f%% (on the failed master, %d of %d keys, %.0f%%, on the others %.0f%%); windowed keys': %.0f%% and %.0f%%; p99.9 %v; old master's grants lost: %d tokens in %d of its %d takes; lost buckets %d (hot %d); granted net %d (%.2f× burst + rate·T); late fallback %d of %d; breakers settled %v after the load",
		elapsed.Round(time.Millisecond), shard, outage.Round(time.Millisecond), recovery,
		admitted, float64(admitted)/(hotRate*elapsed.Seconds()),
		float64(load.admitted[phaseHealthy].Load())/(hotRate*faultAt.Sub(load.start).Seconds()),
		float64(load.admitted[phaseOutage].Load())/(hotRate*outage.Seconds()),
		float64(load.admitted[phaseAfter].Load())/(hotRate*afterFor.Seconds()),
		allShare, onFailed, coldKeys, coldShare(true), coldShare(false), winShare(true), winShare(false),
		p999, lostTokens, lostTakes, oldTakes, lost, hotLost,
		granted-refunded, float64(granted-refunded)/(hotBurst+hotRate*elapsed.Seconds()),
		late, lateOf, settled.Round(time.Millisecond))
	// The failed master's keys leave its open breaker once the promotion shows in the
	// slot map (the Limiter rechecks it while a master's breaker is open): before a
	// second half-open probe, which would go to the old address and fail, opening the
	// breaker again for another open time.
	open := load.openAfter(promotedAt)
	t.Logf("last fallback decision %v after the promotion; the failed master's breaker's last %v after",
		load.recovery(promotedAt).Round(time.Millisecond), open.Round(time.Millisecond))
	if limit := 3*cellBreaker.OpenTimeout + cellSlack; open > limit {
		t.Errorf("the failed master's open breaker decided %v after the promotion, want at most %v", open.Round(time.Millisecond), limit)
	}

	for _, s := range fleet {
		_ = s.limiter.Close(context.Background())
		_ = s.client.Close()
	}
	for _, n := range append(c.Masters, c.Replicas...) {
		n.Kill() // their processes' waiters are the test's own goroutines
	}
	goleak.VerifyNone(t, ignore)
}

// takeLog records the answers to the take script for one bucket that arrived, with the
// node that answered, each server's id and sequence number: what a master granted, to
// compare with the records its replica holds.
type takeLog struct {
	mu    sync.Mutex
	key   string
	takes []takeAnswer
}

// watch sets the bucket whose takes l records.
func (l *takeLog) watch(key string) {
	l.mu.Lock()
	l.key = key
	l.mu.Unlock()
}

type takeAnswer struct {
	node, server string
	seq          uint64
	granted      int64
}

// hook returns a go-redis hook for the node client at addr.
func (l *takeLog) hook(addr string) redis.Hook { return takeHook{l, addr} }

// note records cmd if it is a take from l's bucket that spent tokens (a fresh answer).
// The script's arguments and reply are the wire format redisstore.TestWireFormat pins:
// EVALSHA sha 1 key capacity rate want min server seq ... -> {granted, tokens, wait,
// now, flag, ...}. Arguments and reply fields after these are not read.
func (l *takeLog) note(addr string, cmd redis.Cmder) {
	a := cmd.Args()
	if len(a) < 10 || cmd.Err() != nil {
		return
	}
	if name := strings.ToLower(fmt.Sprint(a[0])); (name != "evalsha" || a[1] != luascript.Take.Hash()) && (name != "eval" || a[1] != luascript.TakeSource) {
		return
	}
	seq, err := strconv.ParseUint(fmt.Sprint(a[9]), 10, 64)
	if err != nil {
		return
	}
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return
	}
	reply, err := c.Slice()
	if err != nil || len(reply) < 5 {
		return
	}
	granted, _ := reply[0].(int64)
	if flag, _ := reply[4].(int64); granted == 0 || (flag != luascript.Fresh && flag != luascript.First) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if fmt.Sprint(a[3]) == l.key {
		l.takes = append(l.takes, takeAnswer{node: addr, server: fmt.Sprint(a[8]), seq: seq, granted: granted})
	}
}

// lost returns the tokens (and takes) that node granted from l's bucket beyond what a
// copy of the bucket holds, and how many takes node answered in all: a server's take is
// in the copy when the copy's record of that server (field t:<server>, "<seq> ...")
// has that seq or a later one.
func (l *takeLog) lost(node string, copyOf map[string]string) (tokens, takes, of int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.takes {
		if a.node != node {
			continue
		}
		of++
		var have uint64
		if rec, ok := copyOf["t:"+a.server]; ok {
			seq, _, _ := strings.Cut(rec, " ")
			have, _ = strconv.ParseUint(seq, 10, 64)
		}
		if a.seq > have {
			tokens += a.granted
			takes++
		}
	}
	return tokens, takes, of
}

// TestTakeLogLost: the loss TestClusterFailover reports counts a node's grants the copy
// has no record of, by server and seq, and nothing else.
func TestTakeLogLost(t *testing.T) {
	l := takeLog{takes: []takeAnswer{
		{node: "m", server: "a", seq: 10, granted: 5},
		{node: "m", server: "a", seq: 11, granted: 3},
		{node: "m", server: "b", seq: 7, granted: 2},
		{node: "r", server: "a", seq: 12, granted: 9}, // answered by another node
	}}
	for _, tc := range []struct {
		name         string
		copyOf       map[string]string
		tokens, took int64
	}{
		{"copy has every take", map[string]string{"tokens": "1", "t:a": "11 3 0 0 1", "t:b": "7 2 0 0 1"}, 0, 0},
		{"copy lags a's last take", map[string]string{"t:a": "10 5 0 0 1", "t:b": "7 2 0 0 1"}, 3, 1},
		{"copy never saw b", map[string]string{"t:a": "11 3 0 0 1"}, 2, 1},
		{"empty copy", map[string]string{}, 10, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tokens, took, of := l.lost("m", tc.copyOf)
			if tokens != tc.tokens || took != tc.took || of != 3 {
				t.Errorf("lost = %d tokens in %d of %d takes, want %d in %d of 3", tokens, took, of, tc.tokens, tc.took)
			}
		})
	}
}

type takeHook struct {
	l    *takeLog
	addr string
}

func (h takeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h takeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.l.note(h.addr, cmd)
		return err
	}
}

func (h takeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.l.note(h.addr, cmd)
		}
		return err
	}
}

// TestPartitionDebtRepaid is the matrix's partition cell under fail-local at its full
// length: 4 servers, a hot key at 400/s with burst 80 and about 3 × that demand, the first
// two servers cut off from Redis for 3 s. While cut off they admit their local shares on
// top of what the other two lease; once they reach Redis again they charge those
// admissions to the bucket as debts. Every window of 1 to 6 s that ends 2.5 s or more
// after the partition admits at most 2·burst + servers·ceil(burst/servers) + rate·W.
func TestPartitionDebtRepaid(t *testing.T) {
	processes(t)
	if testing.Short() {
		t.Skip("runs 7.5 s of real time")
	}
	const rate, burst = 400.0, 80
	srv := redistest.StartServer(t)
	cut := newProxy(t, srv.Addr)
	defer cut.close()
	prefix := randomPrefix()
	cfg := hybrid.Config{FleetSize: cellServers, Limits: []hybrid.Limit{
		{Name: "hot", Rate: rate, Burst: burst, Policy: breaker.FailLocal(), MaxWait: cellWait}}}
	var fleet []*server
	for i := range cellServers {
		addr := srv.Addr
		if i < cellServers/2 {
			addr = cut.addr
		}
		fleet = append(fleet, newServer(t, addr, prefix, nil, cellBreaker, cfg))
	}
	var mu sync.Mutex
	var at []time.Duration // admissions, since start
	start := time.Now()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, s := range fleet {
		for range 2 {
			wg.Go(func() {
				for !stop.Load() {
					d, err := s.limiter.Allow(context.Background(), "hot", "k")
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mu.Lock()
						at = append(at, time.Since(start))
						mu.Unlock()
					}
					time.Sleep(1200 * time.Microsecond) // about 3 × the limit in all
				}
			})
		}
	}
	time.Sleep(time.Second)
	cut.set(true)
	time.Sleep(3 * time.Second)
	cut.set(false)
	healed := time.Since(start)
	time.Sleep(3500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	end := time.Since(start)
	var owed, charged int64
	for _, s := range fleet {
		st := s.limiter.Stats().Limits[0]
		owed, charged = owed+st.Owed, charged+st.Charged
		_ = s.limiter.Close(context.Background())
	}
	slices.Sort(at)
	slack := 2*burst + cellServers*math.Ceil(float64(burst)/cellServers)
	worst, worstW := 0.0, time.Duration(0)
	for w := time.Second; w <= 6*time.Second; w += time.Second {
		j := 0
		for k, s := range at {
			for j < len(at) && at[j] < s+w {
				j++
			}
			if e := s + w; e < healed+2500*time.Millisecond || e > end {
				continue
			}
			if v := float64(j-k) / (slack + rate*w.Seconds()); v > worst {
				worst, worstW = v, w
			}
		}
	}
	t.Logf("%d admitted in %v (%.2f× rate·T); debts charged %d, still owed %d; windows ending 2.5 s after the partition: %.3f of their bound (%v)",
		len(at), end.Round(time.Millisecond), float64(len(at))/(rate*end.Seconds()), charged, owed, worst, worstW)
	if charged == 0 {
		t.Error("no debt was charged: the cut-off servers admitted nothing of their own")
	}
	if worst > 1 {
		t.Errorf("a window of %v ending 2.5 s or more after the partition admitted %.3f× 2·burst + servers·ceil(burst/servers) + rate·W", worstW, worst)
	}
}
