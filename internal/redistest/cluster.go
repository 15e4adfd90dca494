package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterConfig says what StartCluster starts. Zero fields take the defaults.
type ClusterConfig struct {
	// Masters is how many masters share the slots (default 3); each gets one replica.
	Masters int
	// NodeTimeout is cluster-node-timeout: how long a master may not answer before the
	// others mark it failed and its replica takes over (default 1 s; Redis's is 15 s).
	NodeTimeout time.Duration
}

// OwnCluster is a Redis Cluster started by one test, for tests that kill, stall or
// fail over its nodes: masters with a replica each, every node a redis-server of the
// test's own on spare loopback ports (its client port and its cluster bus port), with
// no persistence. Its nodes are killed when the test ends.
type OwnCluster struct {
	// Masters are the masters as started; Masters[i] holds the i-th of len(Masters)
	// even slot ranges, in order.
	Masters []*Server
	// Replicas[i] replicates Masters[i].
	Replicas []*Server

	t     testing.TB
	ids   map[*Server]string
	admin map[*Server]*redis.Client
}

// StartCluster starts a Redis Cluster for the test (redis-server 7.0 or newer, for
// cluster-port) and returns once every node reports cluster_state:ok, knows every
// replica as its master's, and every replica's link to its master is up: about 2 s, as
// a master reports ok no sooner than 2 s after it started. It skips the test when no
// redis-server is found, and fails it under CI.
func StartCluster(t testing.TB, cfg ClusterConfig) *OwnCluster {
	t.Helper()
	if cfg.Masters <= 0 {
		cfg.Masters = 3
	}
	if cfg.NodeTimeout <= 0 {
		cfg.NodeTimeout = time.Second
	}
	bin := serverBinary(t)
	if err := needVersion(bin, 7); err != nil {
		missing(t, "StartCluster: %v", err)
	}
	c := &OwnCluster{t: t, ids: map[*Server]string{}, admin: map[*Server]*redis.Client{}}
	node := func() *Server {
		s := startServer(t, bin, func() []string {
			bus, err := freePort()
			if err != nil {
				t.Fatalf("redistest: no free port: %v", err)
			}
			return []string{
				"--cluster-enabled", "yes",
				"--cluster-port", strconv.Itoa(bus),
				"--cluster-node-timeout", strconv.FormatInt(cfg.NodeTimeout.Milliseconds(), 10),
				"--cluster-config-file", "nodes.conf", // in the node's own --dir
				// A failed master costs only its own slots: the other masters keep
				// answering instead of refusing every command with CLUSTERDOWN until the
				// replica takes over (docs/operations.md).
				"--cluster-require-full-coverage", "no",
				// A replica's first sync starts at once, not after 5 s of waiting for others.
				"--repl-diskless-sync-delay", "0"}
		})
		c.admin[s] = s.Client()
		return s
	}
	for range cfg.Masters {
		c.Masters = append(c.Masters, node())
		c.Replicas = append(c.Replicas, node())
	}
	if err := c.form(cfg); err != nil {
		t.Fatalf("redistest: StartCluster: %v", err)
	}
	return c
}

// needVersion checks that bin is redis-server major or newer.
func needVersion(bin string, major int) error {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", bin, err)
	}
	// "Redis server v=7.0.15 sha=..."
	_, v, ok := strings.Cut(string(out), "v=")
	if !ok {
		return fmt.Errorf("%s --version: no version in %q", bin, out)
	}
	m, err := strconv.Atoi(v[:strings.IndexByte(v+".", '.')])
	if err != nil {
		return fmt.Errorf("%s --version: %q: %w", bin, out, err)
	}
	if m < major {
		return fmt.Errorf("%s is version %d, want %d or newer", bin, m, major)
	}
	return nil
}

// nodes returns every node: the masters, then the replicas.
func (c *OwnCluster) nodes() []*Server {
	return append(append([]*Server{}, c.Masters...), c.Replicas...)
}

// Addrs returns every node's address, masters first; any of them seeds a cluster client.
func (c *OwnCluster) Addrs() []string {
	var a []string
	for _, s := range c.nodes() {
		a = append(a, s.Addr)
	}
	return a
}

// Shard returns the index in Masters (and Replicas) of the shard that holds slot as
// the cluster was started.
func (c *OwnCluster) Shard(slot int) int { return slot * len(c.Masters) / 16384 }

// form makes the started nodes one cluster: slots to the masters, everyone meets
// everyone, each replica follows its master; then waits until it is ready.
func (c *OwnCluster) form(cfg ClusterConfig) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range c.nodes() {
		id, err := c.admin[s].ClusterMyID(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER MYID on %s: %w", s.Addr, err)
		}
		c.ids[s] = id
	}
	n := len(c.Masters)
	for i, m := range c.Masters {
		lo, hi := i*16384/n, (i+1)*16384/n-1
		a := c.admin[m]
		// Distinct config epochs, as redis-cli --cluster create sets them, so no node
		// has to resolve a collision before the cluster is stable.
		if err := a.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("CLUSTER SET-CONFIG-EPOCH on %s: %w", m.Addr, err)
		}
		if err := a.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d on %s: %w", lo, hi, m.Addr, err)
		}
	}
	first := c.admin[c.Masters[0]]
	for _, s := range c.nodes()[1:] {
		if err := first.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", s.port, c.busPort(s)).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET %s: %w", s.Addr, err)
		}
	}
	for i, r := range c.Replicas {
		m := c.Masters[i]
		// A replica can follow its master once it has heard of it.
		if err := poll(ctx, func() error {
			return c.admin[r].Do(ctx, "CLUSTER", "REPLICATE", c.ids[m]).Err()
		}); err != nil {
			return fmt.Errorf("CLUSTER REPLICATE %s on %s: %w", m.Addr, r.Addr, err)
		}
	}
	if err := poll(ctx, c.ready); err != nil {
		return fmt.Errorf("cluster not ready after %v: %w", 30*time.Second, err)
	}
	return nil
}

func (c *OwnCluster) busPort(s *Server) string {
	for i, a := range s.args {
		if a == "--cluster-port" {
			return s.args[i+1]
		}
	}
	return strconv.Itoa(s.port + 10000)
}

// ready reports, as an error, the first thing that keeps the cluster from being as
// started and healthy: a node not ok, a node with another view of who replicates whom
// or of a link, a replica not synced.
func (c *OwnCluster) ready() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, s := range c.nodes() {
		a := c.admin[s]
		info, err := a.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", s.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state is not ok", s.Addr)
		}
		nodes, err := a.ClusterNodes(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER NODES: %w", s.Addr, err)
		}
		seen := map[string]string{} // id -> "master" or the id of the master it follows
		for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 {
				continue
			}
			if strings.Contains(f[2], "fail") || strings.Contains(f[2], "handshake") || f[7] != "connected" {
				return fmt.Errorf("%s sees %s as %s, %s", s.Addr, f[1], f[2], f[7])
			}
			switch {
			case strings.Contains(f[2], "master"):
				seen[f[0]] = "master"
			case strings.Contains(f[2], "slave"):
				seen[f[0]] = f[3]
			}
		}
		for i, m := range c.Masters {
			if seen[c.ids[m]] != "master" {
				return fmt.Errorf("%s does not see %s as a master yet", s.Addr, m.Addr)
			}
			if seen[c.ids[c.Replicas[i]]] != c.ids[m] {
				return fmt.Errorf("%s does not see %s as the replica of %s yet", s.Addr, c.Replicas[i].Addr, m.Addr)
			}
		}
	}
	for _, r := range c.Replicas {
		info, err := c.admin[r].Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Errorf("%s: INFO replication: %w", r.Addr, err)
		}
		if !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("%s: link to its master is not up", r.Addr)
		}
	}
	return nil
}

// Promoted waits until the replica of shard i is a master and every node running (not
// killed, not stopped) reports cluster_state:ok: the end of a failover. It returns when
// that was seen.
func (c *OwnCluster) Promoted(ctx context.Context, i int) (time.Time, error) {
	r := c.Replicas[i]
	err := poll(ctx, func() error {
		role, err := c.admin[r].Do(ctx, "ROLE").Slice()
		if err != nil {
			return fmt.Errorf("%s: ROLE: %w", r.Addr, err)
		}
		if len(role) == 0 || role[0] != "master" {
			return fmt.Errorf("%s is not a master yet: ROLE %v", r.Addr, role)
		}
		for _, s := range c.nodes() {
			if !s.running() {
				continue
			}
			info, err := c.admin[s].ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("%s: CLUSTER INFO: %w", s.Addr, err)
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster_state is not ok", s.Addr)
			}
		}
		return nil
	})
	return time.Now(), err
}

// ReadOnly returns a client for node s that may read the keys of its master's slots
// (READONLY on every connection), for a test that looks at what a replica holds.
func (c *OwnCluster) ReadOnly(s *Server) *redis.Client {
	return s.Client(func(o *redis.Options) {
		o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
			return cn.ReadOnly(ctx).Err()
		}
	})
}

// Admin returns the test's own client for node s (not in READONLY mode).
func (c *OwnCluster) Admin(s *Server) *redis.Client { return c.admin[s] }

// poll calls cond every 10 ms until it returns nil or ctx ends; then it returns ctx's
// error wrapping cond's last one.
func poll(ctx context.Context, cond func() error) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// running reports whether the server's process is up: neither killed nor stopped.
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil && !s.stopped
}

// Settled waits until the replica of shard i has applied what its master sent it: its
// link to the master is down (the master died and the replica read to the end of the
// stream) or its replication offset stayed the same over 3 polls (30 ms: a master that
// is stopped sends nothing more). What it holds then is what it takes over with.
func (c *OwnCluster) Settled(ctx context.Context, i int) error {
	r := c.admin[c.Replicas[i]]
	last, same := "", 0
	return poll(ctx, func() error {
		info, err := r.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Errorf("%s: INFO replication: %w", c.Replicas[i].Addr, err)
		}
		if strings.Contains(info, "master_link_status:down") {
			return nil
		}
		off := ""
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "slave_repl_offset:"); ok {
				off = v
			}
		}
		if off != last {
			last, same = off, 0
		} else if same++; same >= 3 {
			return nil
		}
		return fmt.Errorf("%s: replication offset still moving (%s)", c.Replicas[i].Addr, off)
	})
}
