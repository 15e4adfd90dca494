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

func runFaultCell(t *testing.T, f fault, policy breaker.Policy, healthy, after time.Duration) {
	const (
		servers    = 4
		rate       = 400.0
		burst      = 40
		coldKeys   = 100
		maxWait    = 10 * time.Millisecond
		slack      = 90 * time.Millisecond // scheduling on a shared 2-core machine, -race
		quietAfter = 300 * time.Millisecond
	)
	ignore := goleak.IgnoreCurrent()
	srv := redistest.StartServer(t)
	admin := redis.NewClient(redistest.Options(srv.Addr))
	cut := newProxy(t, srv.Addr)
	prefix := randomPrefix()
	var fleet []*server
	for i := range servers {
		addr := srv.Addr
		if i < servers/2 {
			addr = cut.addr
		}
		fleet = append(fleet, newServer(t, addr, prefix, nil, breaker.Settings{OpenTimeout: 200 * time.Millisecond}, hybrid.Config{
			FleetSize: servers,
			Limits: []hybrid.Limit{
				{Name: "hot", Rate: rate, Burst: burst, Policy: policy, MaxWait: maxWait},
				{Name: "cold", Rate: 20, Burst: 20, Policy: policy, MaxWait: maxWait},
			},
		}))
	}

	var (
		errs      atomic.Int64
		firstErr  atomic.Value
		hotAdmit  atomic.Int64
		lat       latencies
		stopAt    atomic.Int64 // UnixNano at which the load stops
		quietFrom atomic.Int64 // UnixNano from which fallback decisions are counted as late
		late      atomic.Int64 // fallback decisions after quietFrom
		lateOf    atomic.Int64 // decisions after quietFrom
	)
	decide := func(l *hybrid.Limiter, limit, key string) {
		t0 := time.Now()
		d, err := l.Allow(context.Background(), limit, key)
		lat.add(time.Since(t0))
		if err != nil {
			if errs.Add(1) == 1 {
				firstErr.Store(err)
			}
			return
		}
		if limit == "hot" && d.Allowed {
			hotAdmit.Add(1)
		}
		if q := quietFrom.Load(); q != 0 && t0.UnixNano() >= q {
			lateOf.Add(1)
			if d.Source == hybrid.SourceFallback {
				late.Add(1)
			}
		}
	}
	start := time.Now()
	stopAt.Store(start.Add(time.Hour).UnixNano())
	var wg sync.WaitGroup
	for i, s := range fleet {
		for range 2 { // two callers on the hot key per server
			wg.Go(func() {
				for time.Now().UnixNano() < stopAt.Load() {
					decide(s.limiter, "hot", "hot-client")
					time.Sleep(200 * time.Microsecond)
				}
			})
		}
		wg.Go(func() { // one caller cycling through the cold keys, well within their limits
			for n := i; time.Now().UnixNano() < stopAt.Load(); n++ {
				decide(s.limiter, "cold", fmt.Sprint("client-", n%coldKeys))
				time.Sleep(time.Millisecond)
			}
		})
	}

	time.Sleep(healthy)
	f.inject(t, faultEnv{srv: srv, admin: admin, cut: cut})
	faultEnd := time.Now()
	quietFrom.Store(faultEnd.Add(after - quietAfter).UnixNano())
	time.Sleep(after)
	stopAt.Store(0)
	wg.Wait()
	elapsed := time.Since(start)

	if n := errs.Load(); n > 0 {
		t.Errorf("%d errors from the Limiter, the first: %v", n, firstErr.Load())
	}
	p999 := lat.quantile(0.999)
	if p999 > maxWait+slack {
		t.Errorf("decision latency p99.9 %v, want at most the limit's wait %v plus %v of scheduling", p999, maxWait, slack)
	}
	var lost, hotLost int64
	for _, s := range fleet {
		for _, ls := range s.limiter.Stats().Limits {
			lost += ls.LostBuckets
			if ls.Name == "hot" {
				hotLost += ls.LostBuckets
			}
		}
	}
	admitted := hotAdmit.Load()
	switch policy.Kind() {
	case breaker.KindClosed:
		bound := 2*burst + rate*elapsed.Seconds()
		if f.loses {
			// The bucket came back full once per loss; each server that took from it
			// counts a loss, so this may count one loss several times.
			bound += burst * float64(max(hotLost, 1))
		}
		if float64(admitted) > bound {
			t.Errorf("hot key: %d admitted in %v, bound %.0f", admitted, elapsed.Round(time.Millisecond), bound)
		}
	default:
		// Each server's own pre-check (the fleet's rate and burst) caps what the fallback
		// can add: at most servers × (burst + rate·T) in all.
		if bound := servers * (burst + rate*elapsed.Seconds()); float64(admitted) > bound {
			t.Errorf("hot key: %d admitted in %v, more than %d servers' pre-checks allow (%.0f)", admitted, elapsed.Round(time.Millisecond), servers, bound)
		}
	}
	if (f.name == "flushall" || f.name == "evict") && lost == 0 {
		t.Errorf("%s lost buckets, but no server counted a lost bucket", f.name)
	}
	if n, of := late.Load(), lateOf.Load(); of == 0 || float64(n) > 0.05*float64(of) {
		t.Errorf("%d of %d decisions in the last %v were still the fallback's: not recovered", n, of, quietAfter)
	}
	t.Logf("%v: hot key admitted %d (%.2f× rate·T), p99.9 %v, lost buckets %d, late fallback %d of %d",
		elapsed.Round(time.Millisecond), admitted, float64(admitted)/(rate*elapsed.Seconds()), p999, lost, late.Load(), lateOf.Load())

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
