package fleetlimit_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

var fullFaults = flag.Bool("faults", false, "run the whole fault matrix, every fault under every policy, with longer phases (docs/operations.md)")

// fault is one thing Redis does to its clients, done by a client of the test's own.
type fault struct {
	name string
	// loses reports that the fault loses buckets: they come back full, so the fleet
	// may admit one more burst per key, and the loss must be detected.
	loses  bool
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
		// A memory limit just above what Redis holds, with a policy that evicts any
		// key, and 4 MB of other data: the buckets go, and no write fails.
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
			if err := admin.Set(ctx, fmt.Sprint("junk:", i), junk, 0).Err(); err != nil {
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
}

// faultEnv is what a fault acts on: the test's redis-server, a client of its own, and
// the link of the servers behind the test's proxy (the first half of the fleet).
type faultEnv struct {
	srv   *redistest.Server
	admin *redis.Client
	cut   *proxy
}

var faultPolicies = []struct {
	name   string
	policy breaker.Policy
}{
	{"fail-closed", breaker.FailClosed},
	{"fail-local", breaker.FailLocal()},
	{"fail-open", breaker.FailOpen},
}

// TestFaultMatrix runs 4 limiters (4 servers; the first two reach Redis through a TCP
// proxy the test can cut) on a redis-server of the test's own, with a hot key far over
// its limit and 100 cold keys within theirs, through a healthy
// phase, a fault, and a phase after it, for each fault under each failure policy (with
// -faults; otherwise each fault under one policy, with shorter phases). Each cell
// asserts: no error from the Limiter; decisions within the limit's 10 ms wait plus a
// stated scheduling slack at the 99.9th percentile; the hot key's admissions within the
// policy's bound over the whole run (fail-closed: 2·burst + rate·T, plus a burst for
// each loss of the bucket the servers counted; fail-local and fail-open: what the
// servers' own buckets allow); the fault's lost buckets detected; the fallback no longer deciding by the end; and no
// goroutine left once the limiters are closed.
func TestFaultMatrix(t *testing.T) {
	healthy, after := 400*time.Millisecond, 900*time.Millisecond
	if *fullFaults {
		healthy, after = time.Second, 2*time.Second
	}
	for i, f := range faults {
		for j, p := range faultPolicies {
			if !*fullFaults && j != i%len(faultPolicies) {
				continue
			}
			t.Run(f.name+"/"+p.name, func(t *testing.T) {
				runFaultCell(t, f, p.policy, healthy, after)
			})
		}
	}
}

// The load of every fault cell: 4 servers, each with two callers on a hot key (together
// about 3 × its limit) and one cycling through the cold keys within their limits.
const (
	cellServers = 4
	hotRate     = 400.0
	hotBurst    = 40
	coldKeys    = 100
	cellWait    = 10 * time.Millisecond // each limit's MaxWait
	cellSlack   = 90 * time.Millisecond // scheduling on a shared 2-core machine, -race
	quietAfter  = 300 * time.Millisecond
)

// cellConfig is a fleet member's configuration in a fault cell.
func cellConfig(policy breaker.Policy) hybrid.Config {
	return hybrid.Config{
		FleetSize: cellServers,
		Limits: []hybrid.Limit{
			{Name: "hot", Rate: hotRate, Burst: hotBurst, Policy: policy, MaxWait: cellWait},
			{Name: "cold", Rate: 20, Burst: 20, Policy: policy, MaxWait: cellWait},
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
	stopAt             atomic.Int64 // UnixNano at which the callers stop
	quietFrom          atomic.Int64 // UnixNano from which fallback decisions are counted as late
	late               atomic.Int64 // fallback decisions after quietFrom
	lateOf             atomic.Int64 // decisions after quietFrom
	// lastFallback is the UnixNano of the latest decision the failure policy made.
	lastFallback atomic.Int64
}

// startLoad starts the callers on every server of fleet.
func startLoad(fleet []*server) *fleetLoad {
	l := &fleetLoad{start: time.Now()}
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
	l.lat.add(time.Since(t0))
	if err != nil {
		if l.errs.Add(1) == 1 {
			l.firstErr.Store(err)
		}
		return
	}
	phase := l.phase.Load()
	if limit == "hot" && d.Allowed {
		l.admitted[phase].Add(1)
	}
	if n >= 0 {
		l.cold[phase][n].Add(1)
		if d.Source == hybrid.SourceFallback {
			l.coldFallback[phase][n].Add(1)
		}
	}
	if d.Source == hybrid.SourceFallback {
		for at := l.lastFallback.Load(); at < t0.UnixNano() && !l.lastFallback.CompareAndSwap(at, t0.UnixNano()); {
			at = l.lastFallback.Load()
		}
	}
	if q := l.quietFrom.Load(); q != 0 && t0.UnixNano() >= q {
		l.lateOf.Add(1)
		if d.Source == hybrid.SourceFallback {
			l.late.Add(1)
		}
	}
}

// stop stops the callers, waits for them, and returns how long they ran.
func (l *fleetLoad) stop() time.Duration {
	l.stopAt.Store(0)
	l.wg.Wait()
	return time.Since(l.start)
}

// hotAdmitted returns the hot key's admissions over every phase.
func (l *fleetLoad) hotAdmitted() int64 {
	return l.admitted[0].Load() + l.admitted[1].Load() + l.admitted[2].Load()
}

// check asserts what every cell asserts of its decisions: no error from the Limiter,
// the 99.9th percentile of latency within the limit's wait plus scheduling slack, and
// the fallback no longer deciding in the last quietAfter. It returns the percentile.
func (l *fleetLoad) check(t *testing.T) time.Duration {
	t.Helper()
	if n := l.errs.Load(); n > 0 {
		t.Errorf("%d errors from the Limiter, the first: %v", n, l.firstErr.Load())
	}
	p999 := l.lat.quantile(0.999)
	if p999 > cellWait+cellSlack {
		t.Errorf("decision latency p99.9 %v, want at most the limit's wait %v plus %v of scheduling", p999, cellWait, cellSlack)
	}
	if n, of := l.late.Load(), l.lateOf.Load(); of == 0 || float64(n) > 0.05*float64(of) {
		t.Errorf("%d of %d decisions in the last %v were still the fallback's: not recovered", n, of, quietAfter)
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

func runFaultCell(t *testing.T, f fault, policy breaker.Policy, healthy, after time.Duration) {
	ignore := goleak.IgnoreCurrent()
	srv := redistest.StartServer(t)
	admin := redis.NewClient(redistest.Options(srv.Addr))
	cut := newProxy(t, srv.Addr)
	prefix := randomPrefix()
	var fleet []*server
	for i := range cellServers {
		addr := srv.Addr
		if i < cellServers/2 {
			addr = cut.addr
		}
		fleet = append(fleet, newServer(t, addr, prefix, nil, cellBreaker, cellConfig(policy)))
	}

	load := startLoad(fleet)
	time.Sleep(healthy)
	f.inject(t, faultEnv{srv: srv, admin: admin, cut: cut})
	faultEnd := time.Now()
	load.quietFrom.Store(faultEnd.Add(after - quietAfter).UnixNano())
	time.Sleep(after)
	elapsed := load.stop()

	p999 := load.check(t)
	lost, hotLost := lostBuckets(fleet)
	admitted := load.hotAdmitted()
	switch policy.Kind() {
	case breaker.KindClosed:
		bound := 2*hotBurst + hotRate*elapsed.Seconds()
		if f.loses {
			// The bucket came back full once per loss; each server that took from it
			// counts a loss, so this may count one loss several times.
			bound += hotBurst * float64(max(hotLost, 1))
		}
		if float64(admitted) > bound {
			t.Errorf("hot key: %d admitted in %v, bound %.0f", admitted, elapsed.Round(time.Millisecond), bound)
		}
	default:
		checkPreChecks(t, admitted, elapsed)
	}
	if (f.name == "flushall" || f.name == "evict") && lost == 0 {
		t.Errorf("%s lost buckets, but no server counted a lost bucket", f.name)
	}
	t.Logf("%v: hot key admitted %d (%.2f× rate·T), p99.9 %v, lost buckets %d, late fallback %d of %d",
		elapsed.Round(time.Millisecond), admitted, float64(admitted)/(hotRate*elapsed.Seconds()), p999, lost, load.late.Load(), load.lateOf.Load())

	for _, s := range fleet {
		_ = s.limiter.Close(context.Background())
		_ = s.client.Close()
	}
	_ = admin.Close()
	cut.close()
	srv.Kill() // its process's waiter is the test's own goroutine
	goleak.VerifyNone(t, ignore)
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
