package rediscost

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/luascript"
)

// TestWarmUp measures what the bucket kind costs Redis on the comparison's per-client
// keys (cmd/compare's "zipf 10k": 10,000 keys drawn Zipf s = 1.1, a limit of
// 1,000,000/s and burst, 32 goroutines, 8 hybrid.Limiters with FleetSize 8 spread
// round-robin) after a warm-up of 1 s and of 10 s, as the comparison runs: Redis's CPU
// (INFO cpu) per decision over the 2 s measured and at Close, and the script runs by
// kind (a go-redis hook). A key a server sees less than about once a second is still new
// to it after 1 s, and each of its requests is a take; after 10 s most (server, key)
// pairs have had a roomy grant, whose tokens live five lifetimes, and what a pair does
// not spend goes back as a refund, to a full bucket (it writes nothing). Each warm-up
// runs twice, on an empty server.
//
//	go -C bench test ./rediscost -run TestWarmUp -v -args -rediscost
func TestWarmUp(t *testing.T) {
	ctx, c := ownServer(t)
	addr := c.Options().Addr
	for _, warm := range []time.Duration{time.Second, 10 * time.Second, time.Second, 10 * time.Second} {
		if err := c.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		var counting scriptCount
		lims := make([]*hybrid.Limiter, 8)
		for i := range lims {
			o := &redis.Options{Addr: addr}
			global.Configure(o)
			rc := redis.NewClient(o)
			rc.AddHook(&counting)
			defer rc.Close()
			store, err := global.New(rc)
			if err != nil {
				t.Fatal(err)
			}
			if lims[i], err = hybrid.New(store, hybrid.Config{FleetSize: len(lims), Limits: []hybrid.Limit{
				{Name: "bench", Rate: 1e6, Burst: 1e6, Policy: breaker.FailClosed}}}); err != nil {
				t.Fatal(err)
			}
		}
		var seq uint64
		var mu sync.Mutex
		load := func(d time.Duration) (decisions int) {
			var wg sync.WaitGroup
			end := time.Now().Add(d)
			for g := range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					zipf := rand.NewZipf(rand.New(rand.NewPCG(uint64(g), uint64(warm))), 1.1, 1, 9999)
					n := 0
					for time.Now().Before(end) {
						mu.Lock()
						seq++
						l := lims[seq%uint64(len(lims))]
						mu.Unlock()
						_, _ = l.Allow(ctx, "bench", "k"+strconv.FormatUint(zipf.Uint64(), 10))
						n++
					}
					mu.Lock()
					decisions += n
					mu.Unlock()
				}()
			}
			wg.Wait()
			return decisions
		}
		load(warm)
		counting.reset()
		cpu0 := redisCPU(ctx, t, c)
		n := load(2 * time.Second)
		cpu1 := redisCPU(ctx, t, c)
		takes, refunds := counting.takes, counting.refunds
		for _, l := range lims {
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
		cpu2 := redisCPU(ctx, t, c)
		per := func(x float64) float64 { return x / float64(n) }
		t.Logf("warm-up %v: %d decisions; Redis CPU %.2f µs a decision measured, %.2f at Close, %.2f in all; "+
			"%.3f takes and %.3f refund calls a decision measured, %.3f refund calls at Close",
			warm, n, per((cpu1-cpu0)*1e6), per((cpu2-cpu1)*1e6), per((cpu2-cpu0)*1e6),
			per(float64(takes)), per(float64(refunds)), per(float64(counting.refunds-refunds)))
	}
}

// scriptCount counts the take and refund script calls (EVALSHA or EVAL) its clients send.
type scriptCount struct {
	mu             sync.Mutex
	takes, refunds int
}

func (h *scriptCount) reset() { h.mu.Lock(); h.takes, h.refunds = 0, 0; h.mu.Unlock() }

func (h *scriptCount) count(cmds ...redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range cmds {
		a := c.Args()
		if len(a) < 3 {
			continue
		}
		name, _ := a[0].(string)
		script, _ := a[1].(string)
		switch strings.ToLower(name) {
		case "evalsha", "eval":
			switch script {
			case luascript.Take.Hash(), luascript.TakeSource:
				h.takes++
			case luascript.Refund.Hash(), luascript.RefundSource:
				h.refunds++
			}
		}
	}
}

// redisCPU is Redis's CPU time, user and system, in seconds (INFO cpu).
func redisCPU(ctx context.Context, t *testing.T, c *redis.Client) float64 {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := infoMap(info)
	u, _ := strconv.ParseFloat(m["used_cpu_user"], 64)
	s, _ := strconv.ParseFloat(m["used_cpu_sys"], 64)
	return u + s
}

func (h *scriptCount) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error { h.count(c); return next(ctx, c) }
}
func (h *scriptCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cs []redis.Cmder) error { h.count(cs...); return next(ctx, cs) }
}
