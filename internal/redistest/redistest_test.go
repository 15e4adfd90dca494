package redistest

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestRunPings(t *testing.T) {
	Run(t, func(t *testing.T, tg Target) {
		ctx := context.Background()
		key := Unique(t)
		if err := tg.Client.Set(ctx, key, "v", time.Minute).Err(); err != nil {
			t.Fatalf("SET on %s: %v", tg.Name, err)
		}
		if got := tg.Client.Get(ctx, key).Val(); got != "v" {
			t.Fatalf("GET on %s = %q, want %q", tg.Name, got, "v")
		}
		tg.Client.Del(ctx, key)
	})
}

func TestUniqueHasNoHashTagBraces(t *testing.T) {
	a, b := Unique(t), Unique(t)
	if a == b {
		t.Fatalf("Unique returned %q twice", a)
	}
	if strings.ContainsAny(a, "{} ") {
		t.Fatalf("Unique(t) = %q, contains a brace or space", a)
	}
}

func TestServerStopContRestart(t *testing.T) {
	s := StartServer(t)
	c := s.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	s.Stop()
	stalled, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true }).Ping(stalled).Err()
	cancel()
	var ne net.Error
	if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("PING to a stopped server: err = %v, want a timeout", err)
	}
	s.Cont()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Cont: %v", err)
	}

	s.Restart()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if n := c.Exists(ctx, "k").Val(); n != 0 {
		t.Fatalf("after Restart key exists (%d); want an empty server", n)
	}
}

// TestStartServerTriesAgain: a server that exits before it answers (here on an unknown
// option, as one whose port another process took does) is started again on fresh
// ports, its arguments asked for anew.
func TestStartServerTriesAgain(t *testing.T) {
	bin := serverBinary(t)
	calls := 0
	s := startServer(t, bin, func() []string {
		if calls++; calls == 1 {
			return []string{"--no-such-option", "yes"}
		}
		return []string{"--maxmemory-policy", "allkeys-lru"}
	})
	if calls != 2 {
		t.Fatalf("arguments asked %d times, want 2", calls)
	}
	got, err := s.Client().ConfigGet(context.Background(), "maxmemory-policy").Result()
	if err != nil || got["maxmemory-policy"] != "allkeys-lru" {
		t.Fatalf("CONFIG GET maxmemory-policy = %v, %v: want the second try's allkeys-lru", got, err)
	}
}

// TestTakenPortIsNotOurs: a server whose port another redis-server took between the
// pick and the bind does not start, though the port answers PING: the other answers.
func TestTakenPortIsNotOurs(t *testing.T) {
	other := StartServer(t)
	s := &Server{Addr: other.Addr, t: t, port: other.port, bin: other.bin}
	err := s.try()
	if err == nil || !strings.Contains(err.Error(), "port was taken") {
		t.Fatalf("starting on %s, which another redis-server holds: %v, want its port taken", other.Addr, err)
	}
	if err := other.Client().Ping(context.Background()).Err(); err != nil {
		t.Fatalf("the other server after: %v", err)
	}
}

func TestMissingFailsUnderCI(t *testing.T) {
	if InCI() {
		t.Skip("checks the non-CI path")
	}
	t.Setenv("REDIS_CLUSTER_ADDRS", "")
	os.Unsetenv("REDIS_CLUSTER_ADDRS")
	ran := false
	t.Run("skips", func(t *testing.T) {
		Cluster(t)
		ran = true
	})
	if ran {
		t.Fatal("Cluster(t) without REDIS_CLUSTER_ADDRS did not skip")
	}
}

// TestOwnClusterFailsOver: a cluster of the test's own forms with a replica per master,
// serves a key written through a cluster client, and once the key's master is killed,
// promotes its replica, which serves the key.
func TestOwnClusterFailsOver(t *testing.T) {
	start := time.Now()
	c := StartCluster(t, ClusterConfig{})
	t.Logf("cluster of %d nodes ready in %v", len(c.Addrs()), time.Since(start).Round(time.Millisecond))
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	ctx := context.Background()
	if err := cc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the cluster: %v", err)
	}
	slot, err := cc.ClusterKeySlot(ctx, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	i := c.Shard(int(slot))
	m, err := cc.MasterForKey(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Options().Addr, c.Masters[i].Addr; got != want {
		t.Fatalf("slot %d is on %s, want Masters[%d] = %s", slot, got, i, want)
	}
	// The replica holds the key before any failover (its first sync is done).
	if err := poll(ctx, func() error { return c.ReadOnly(c.Replicas[i]).Get(ctx, "k").Err() }); err != nil {
		t.Fatalf("GET on the replica: %v", err)
	}

	killed := time.Now()
	c.Masters[i].Kill()
	wait, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	at, err := c.Promoted(wait, i)
	if err != nil {
		t.Fatalf("replica of shard %d not promoted: %v", i, err)
	}
	t.Logf("replica promoted %v after the kill (cluster-node-timeout 1 s)", at.Sub(killed).Round(time.Millisecond))
	if got, err := c.Admin(c.Replicas[i]).Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET on the promoted replica = %q, %v; want v", got, err)
	}
}

// TestCounterCountsDecisionsNotHandshakes: a Counter on a fresh client counts the
// commands and round trips sent, whatever connections the client opened for them
// (each with go-redis's handshake, sent through the client's hooks).
func TestCounterCountsDecisionsNotHandshakes(t *testing.T) {
	Run(t, func(t *testing.T, tg Target) {
		ctx := context.Background()
		var cnt Counter
		c := redis.NewClient(tg.Client.Options())
		c.AddHook(&cnt)
		defer c.Close()
		key := Unique(t)
		const conc = 8
		var wg sync.WaitGroup
		for range conc { // concurrent, so the client opens several connections
			wg.Go(func() {
				if err := c.Get(ctx, key).Err(); err != nil && !errors.Is(err, redis.Nil) {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Get(ctx, key)
			p.Get(ctx, key)
			return nil
		}); err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		if err := c.ScriptLoad(ctx, "return 1").Err(); err != nil { // setup: not counted
			t.Fatal(err)
		}
		if trips, cmds := cnt.Trips.Load(), cnt.Cmds.Load(); trips != conc+1 || cmds != conc+2 {
			t.Fatalf("%s: counted %d round trips and %d commands, want %d and %d", tg.Name, trips, cmds, conc+1, conc+2)
		}
	})
}
