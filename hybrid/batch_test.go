package hybrid_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// failoverHook holds back single commands for the key "first" until gate closes, and
// makes the pipelined item for the key "down" fail as an unreachable node would.
type failoverHook struct{ gate chan struct{} }

func touches(cmd redis.Cmder, key string) bool {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.HasSuffix(s, ":"+key+"}") {
			return true
		}
	}
	return false
}

func (failoverHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h failoverHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if touches(cmd, "first") {
			<-h.gate
		}
		return next(ctx, cmd)
	}
}

func (failoverHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if touches(cmd, "down") {
				cmd.SetErr(errors.New("dial tcp 10.0.0.7:6379: connect: connection refused"))
			}
		}
		return err
	}
}

// TestBatchKeepsOtherItemsGrants: two refills share one pipelined round trip and one
// item's node is unreachable (a failover). The other item's grant is used, not dropped:
// before, the whole batch was failed and the tokens Redis had granted were lost (neither
// used nor refunded).
func TestBatchKeepsOtherItemsGrants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := miniredis.NewMiniRedis()
		c0, err := m.Dial() // starts the server without a listener
		if err != nil {
			t.Fatal(err)
		}
		c0.Close()
		defer m.Close()
		c := redis.NewClient(&redis.Options{
			Addr:                     "127.0.0.1:6379", // never dialled: the Dialer is
			Dialer:                   func(context.Context, string, string) (net.Conn, error) { return m.Dial() },
			MaxRetries:               -1,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		defer c.Close()
		hook := failoverHook{gate: make(chan struct{})}
		c.AddHook(hook)
		brk, err := breaker.New(breaker.Settings{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		l, err := hybrid.New(newStore(t, c), hybrid.Config{
			FleetSize: 1,
			Breaker:   brk,
			Limits:    []hybrid.Limit{{Name: "api", Rate: 0.001, Burst: 10, Policy: breaker.FailClosed, MaxWait: 10 * time.Second}},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		decisions := map[string]hybrid.Decision{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		allow := func(key string) {
			wg.Go(func() {
				d, err := l.Allow(ctx, "api", key)
				if err != nil {
					t.Errorf("%s: %v", key, err)
				}
				mu.Lock()
				decisions[key] = d
				mu.Unlock()
			})
		}
		allow("first")  // its refill goes alone and is held at the gate...
		synctest.Wait() // ...so the next two queue behind it
		allow("ok")     // and go out together,
		allow("down")   // this one to a node that does not answer
		synctest.Wait()
		close(hook.gate)
		wg.Wait()
		if d := decisions["ok"]; !d.Allowed || d.Source != hybrid.SourceGlobal {
			t.Errorf("ok: %+v; want allowed by its grant (the batch's other item failed)", d)
		}
		if d := decisions["down"]; d.Allowed || d.Source != hybrid.SourceFallback {
			t.Errorf("down: %+v; want the policy's denial", d)
		}
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		st := l.Stats()
		t.Logf("stats %+v", st)
		// first and ok each spent one token; every other granted token went back.
		if st.Refunded != st.Granted-2 || st.RefundsLost != 0 {
			t.Errorf("granted %d, refunded %d, lost %d: want granted = 2 spent + refunded", st.Granted, st.Refunded, st.RefundsLost)
		}
	})
}
