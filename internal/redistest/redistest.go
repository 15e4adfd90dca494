// Package redistest gives fleetlimit's tests the Redis servers they run against:
// an embedded miniredis always, a real Redis when one answers, a redis-server of the
// test's own for tests that stall, kill or restart it, and a real Redis Cluster.
//
// Tests are hermetic by default: on a machine with only Go, every helper that needs a
// real server skips. When the environment variable CI is set, a missing real server is a
// test failure instead, so a CI run can never pass by skipping its real-Redis suites.
//
// The shared real Redis (REDIS_ADDR, default 127.0.0.1:6379) is used by many test
// packages at once: tests must keep to keys under Unique(t) and must never run FLUSHALL,
// FLUSHDB or SCRIPT FLUSH on it. Anything destructive belongs on a StartServer server.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/fleetlimit/fleetlimit/internal/minibits"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// InCI reports whether the tests run under CI (the CI environment variable is set).
// Under CI a missing real Redis fails the test instead of skipping it.
func InCI() bool { return os.Getenv("CI") != "" }

// Addr is the address of the shared real Redis: REDIS_ADDR, default 127.0.0.1:6379.
func Addr() string {
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// Options returns client options for addr as the library recommends them for a
// limiter's client: no retries (a retried script may be charged twice), one dial
// attempt, and maintenance notifications off (miniredis does not know them). Tests
// change fields as they need.
func Options(addr string) *redis.Options {
	return &redis.Options{
		Addr:                     addr,
		MaxRetries:               -1,
		DialerRetries:            1,
		DialTimeout:              time.Second,
		ReadTimeout:              2 * time.Second,
		WriteTimeout:             2 * time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// missing skips the test, or fails it under CI, because a real server is not there.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("redistest: %s (CI is set: a real Redis is required)", msg)
	}
	t.Skipf("redistest: %s; skipping (set REDIS_ADDR, or CI to make this a failure)", msg)
}

// Target is one Redis a suite runs against.
type Target struct {
	// Name is "miniredis" or "redis"; suites use it as the subtest name.
	Name string
	// Client talks to the server. It is closed when the test ends.
	Client *redis.Client
	// Mini is the embedded server for the miniredis target, nil for a real Redis.
	// Tests that need to move the server's clock (Mini.SetTime) check it first.
	Mini *miniredis.Miniredis
}

// Real reports whether the target is a real redis-server.
func (tg Target) Real() bool { return tg.Mini == nil }

// Mini starts a miniredis for the test and returns it with a client for it; both are
// closed when the test ends. It has BITFIELD (package minibits), which miniredis lacks;
// after m.Restart, call minibits.Register again.
func Mini(t testing.TB, opts ...func(*redis.Options)) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	if err := minibits.Register(m); err != nil { // BITFIELD, which windowed limits use
		t.Fatalf("redistest: %v", err)
	}
	o := Options(m.Addr())
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return m, c
}

var realOnce struct {
	sync.Once
	err error
}

// Real returns a client for the shared real Redis at Addr, closed when the test ends.
// It skips the test when no Redis answers there, and fails it under CI.
func Real(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	realOnce.Do(func() {
		c := redis.NewClient(Options(Addr()))
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		realOnce.err = c.Ping(ctx).Err()
	})
	if realOnce.err != nil {
		missing(t, "no Redis answers at %s: %v", Addr(), realOnce.err)
	}
	o := Options(Addr())
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Run runs fn as a subtest against miniredis, then against the shared real Redis
// (skipped when none answers, failed under CI). opts adjust the clients' options.
func Run(t *testing.T, fn func(t *testing.T, tg Target), opts ...func(*redis.Options)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		m, c := Mini(t, opts...)
		fn(t, Target{Name: "miniredis", Client: c, Mini: m})
	})
	t.Run("redis", func(t *testing.T) {
		c := Real(t, opts...)
		fn(t, Target{Name: "redis", Client: c})
	})
}

// Unique returns a name unique to this test and run, safe to use as a limit name or
// key prefix on a shared Redis: "<test name>-<random hex>", without spaces or braces.
func Unique(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer(" ", "_", "{", "(", "}", ")", "/", ".").Replace(t.Name())
	return name + "-" + hex.EncodeToString(b[:])
}

// Cluster returns a client for the real Redis Cluster named by REDIS_CLUSTER_ADDRS
// (comma-separated host:port of its nodes, any of which seeds the client;
// .ci/redis-cluster.sh prints all six), closed when the test ends. It skips the test
// when the variable is unset or the cluster does not answer, and fails it under CI.
func Cluster(t testing.TB, opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	t.Helper()
	env := os.Getenv("REDIS_CLUSTER_ADDRS")
	if env == "" {
		missing(t, "REDIS_CLUSTER_ADDRS is not set (.ci/redis-cluster.sh start prints it)")
	}
	o := &redis.ClusterOptions{
		Addrs:         strings.Split(env, ","),
		DialTimeout:   time.Second,
		ReadTimeout:   2 * time.Second,
		WriteTimeout:  2 * time.Second,
		DialerRetries: 1,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClusterClient(o)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.Ping(ctx).Err()
	}); err != nil {
		missing(t, "Redis Cluster at %s does not answer: %v", env, err)
	}
	return c
}

// Server is a redis-server started by one test on a spare loopback port, for tests
// that stall (Stop), kill or restart it. It is killed when the test ends.
type Server struct {
	// Addr is the server's host:port; it stays the same across Restart.
	Addr string

	t    testing.TB
	port int
	bin  string
	args []string // more redis-server arguments (a cluster node's)
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// stopped is set by Stop and cleared by Cont.
	stopped bool
}

// StartServer starts a redis-server of the test's own (REDIS_SERVER names the binary,
// default redis-server on PATH) with no persistence, and waits until it answers PING.
// It skips the test when no binary is found, and fails it under CI.
func StartServer(t testing.TB) *Server {
	t.Helper()
	return startServer(t, serverBinary(t), nil)
}

// serverBinary returns the redis-server to start: REDIS_SERVER, default redis-server
// on PATH. It skips the test when there is none, and fails it under CI.
func serverBinary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		missing(t, "no redis-server binary: %v", err)
	}
	return path
}

// startServer starts bin on a spare loopback port with the arguments args returns added
// to its command line (nil: none). freePort's port is free when picked, not when the
// server binds it: a server that exits before it answers (another process took its
// port, or a port args picked) is started again on fresh ports, three tries in all.
func startServer(t testing.TB, bin string, args func() []string) *Server {
	t.Helper()
	var err error
	for range 3 {
		var port int
		if port, err = freePort(); err != nil {
			t.Fatalf("redistest: no free port: %v", err)
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), t: t, port: port, bin: bin}
		if args != nil {
			s.args = args()
		}
		if err = s.try(); err == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("redistest: %v", err)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start starts the server on its address, failing the test if it does not come up.
func (s *Server) start() {
	s.t.Helper()
	if err := s.try(); err != nil {
		s.t.Fatal("redistest: ", err)
	}
}

// try starts the server on its address and waits until it answers; if it does not, it
// is killed and the error says why.
func (s *Server) try() error {
	cmd := exec.Command(s.bin, append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", s.t.TempDir(), "--loglevel", "warning"}, s.args...)...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	if err := s.waitReady(10 * time.Second); err != nil {
		s.Kill()
		return fmt.Errorf("redis-server on %s did not come up: %w", s.Addr, err)
	}
	return nil
}

// answersItself checks that the redis-server answering on s's address (through c) is
// the process s started: its port was free when picked, not necessarily when the server
// bound it, and a redis-server another test started on it meanwhile would answer in its
// place while s's own exited.
func (s *Server) answersItself(c *redis.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	if !strings.Contains(info, fmt.Sprintf("process_id:%d\r\n", pid)) {
		return fmt.Errorf("another redis-server answers on %s: its port was taken", s.Addr)
	}
	return nil
}

// waitReady polls PING until the server answers or the budget runs out, and then checks
// that the server answering is s's own (answersItself).
func (s *Server) waitReady(budget time.Duration) error {
	c := redis.NewClient(Options(s.Addr))
	defer c.Close()
	deadline := time.Now().Add(budget)
	for {
		// Wait for the port first: a refused dial makes go-redis log a line.
		if conn, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond); err == nil {
			_ = conn.Close()
		} else {
			select {
			case <-s.done:
				return errors.New("redis-server exited")
			case <-time.After(10 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return err
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s.answersItself(c)
		}
		select {
		case <-s.done:
			return errors.New("redis-server exited")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}

// Client returns a client for this server with the recommended options, adjusted by
// opts, closed when the test ends.
func (s *Server) Client(opts ...func(*redis.Options)) *redis.Client {
	o := Options(s.Addr)
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *Server) signal(sig syscall.Signal, stopped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(sig)
		s.stopped = stopped
	}
}

// Stop freezes the server with SIGSTOP: connections stay open and nothing answers,
// as with a Redis stalled by a long command or a paused VM.
func (s *Server) Stop() { s.signal(syscall.SIGSTOP, true) }

// Cont resumes a server frozen by Stop.
func (s *Server) Cont() { s.signal(syscall.SIGCONT, false) }

// Kill ends the server with SIGKILL and waits for it to exit. Safe to call twice.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.stopped = nil, false
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a stopped process must run to die cleanly
	_ = cmd.Process.Kill()
	<-done
}

// Restart kills the server and starts a new one on the same address. The new server
// has no data and an empty script cache, as after a crash or a failover.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}
