package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// TestDoctor: on a redis-server of the test's own, every check passes; once it may
// evict, the eviction check fails with its fix and the exit status is 1; on miniredis
// (no CONFIG, no INFO server) the checks that cannot run warn. The round trips are
// judged against a second's deadline, which a loaded machine meets, and then against a
// microsecond's, which none does.
func TestDoctor(t *testing.T) {
	srv := redistest.StartServer(t)
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"doctor", "-addr", srv.Addr, "-deadline", "1s"}, &out, &errs); code != 0 {
		t.Fatalf("doctor: exit %d\n%s%s", code, out.String(), errs.String())
	}
	for _, name := range []string{"round trip", "version", "eviction", "scripts", "BITFIELD"} {
		if !strings.Contains(out.String(), "PASS  "+name) && !strings.Contains(out.String(), "WARN  "+name) {
			t.Errorf("no %s line:\n%s", name, out.String())
		}
	}
	if !strings.Contains(out.String(), "PASS  eviction") || !strings.Contains(out.String(), "PASS  scripts") {
		t.Errorf("a healthy Redis:\n%s", out.String())
	}
	c := srv.Client()
	if err := c.ConfigSet(context.Background(), "maxmemory", "100mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run(context.Background(), []string{"doctor", "-addr", srv.Addr, "-deadline", "1s"}, &out, &errs); code != 1 ||
		!strings.Contains(out.String(), "FAIL  eviction") || !strings.Contains(out.String(), "noeviction") {
		t.Errorf("an evicting Redis: exit %d\n%s", code, out.String())
	}

	m, _ := redistest.Mini(t)
	out.Reset()
	if code := run(context.Background(), []string{"doctor", "-addr", m.Addr(), "-deadline", "1s"}, &out, &errs); code != 0 || !strings.Contains(out.String(), "WARN  eviction") ||
		!strings.Contains(out.String(), "WARN  version") {
		t.Errorf("miniredis: exit %d\n%s", code, out.String())
	}
	if code := run(context.Background(), []string{"doctor", "-addr", "127.0.0.1:1", "-timeout", time.Second.String()}, &out, &errs); code != 1 {
		t.Errorf("no Redis: exit %d, want 1", code)
	}
	// Round trips are judged against -deadline: no round trip is within a microsecond's
	// fifth, and a second's fifth is room for a loaded machine. Without it, the breaker's
	// default deadline.
	out.Reset()
	if code := run(context.Background(), []string{"doctor", "-addr", srv.Addr, "-deadline", "1us"}, &out, &errs); code != 1 ||
		!strings.Contains(out.String(), "FAIL  round trip") || !strings.Contains(out.String(), "against a 1µs deadline") {
		t.Errorf("a 1µs deadline: exit %d\n%s", code, out.String())
	}
	if code := run(context.Background(), []string{"doctor", "-addr", srv.Addr, "-deadline", "0s"}, &out, &errs); code != 2 {
		t.Errorf("-deadline 0s: exit %d, want 2 (usage)", code)
	}
	out.Reset()
	run(context.Background(), []string{"doctor", "-addr", srv.Addr}, &out, &errs) // its verdict is the machine's
	if !strings.Contains(out.String(), "against a 10ms deadline") {
		t.Errorf("no -deadline: the round trip is not judged against the breaker's 10ms\n%s", out.String())
	}
}

// TestDoctorRunsOutOfTime: when -timeout ends part way through the checks (a Redis 50 ms
// away, 30-odd round trips, 1.5 s), doctor says so, with the checks it finished, and
// gives no verdict on the checks the ended context failed: no FAIL, no ACL fix.
func TestDoctorRunsOutOfTime(t *testing.T) {
	srv := redistest.StartServer(t)
	addr := slowProxy(t, srv.Addr, 50*time.Millisecond)
	var out, errs bytes.Buffer
	code := run(context.Background(), []string{"doctor", "-addr", addr, "-deadline", "1s", "-timeout", "1500ms"}, &out, &errs)
	if code != 1 || !strings.Contains(errs.String(), "-timeout ran out in the") || strings.Contains(out.String(), "FAIL") || strings.Contains(out.String(), "ACL") {
		t.Errorf("exit %d, want 1 and the timeout named, no verdict on the checks it cut\nstdout:\n%sstderr:\n%s", code, out.String(), errs.String())
	}
}

// proxy listens for connections and joins each to a connection of its own to addr,
// by pipe (which copies between them, each way, until either closes), and returns its
// address. It stops with the test, closing every connection it made.
func proxy(t *testing.T, addr string, pipe func(client, server net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			pipe(in, out)
		}
	}()
	return ln.Addr().String()
}

// slowProxy forwards connections to addr, each request reaching it delay late: a Redis
// that far away. It stops with the test.
func slowProxy(t *testing.T, addr string, delay time.Duration) string {
	t.Helper()
	return proxy(t, addr, func(in, to net.Conn) {
		go func() { _, _ = io.Copy(in, to) }()
		go func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := in.Read(buf)
				if err != nil {
					_ = to.Close()
					return
				}
				time.Sleep(delay) // the distance, not a wait for something
				if _, err := to.Write(buf[:n]); err != nil {
					return
				}
			}
		}()
	})
}

// newLimiter is a Limiter of one server on store, its limit "api" of mode, burst 20 and
// the rate given, with a breaker's timeout that leaves room for -race.
func newLimiter(t *testing.T, store *global.Store, mode hybrid.Mode, rate float64) *hybrid.Limiter {
	t.Helper()
	brk, err := breaker.New(breaker.Settings{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l, err := hybrid.New(store, hybrid.Config{FleetSize: 1, Breaker: brk,
		Limits: []hybrid.Limit{{Name: "api", Rate: rate, Burst: 20, Policy: breaker.FailClosed, MaxWait: time.Second, Mode: mode}}})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestInspect: inspect shows the bucket a Limiter took from, and a windowed limit's
// count of the key's current window.
func TestInspect(t *testing.T) {
	m, c := redistest.Mini(t)
	store, err := global.New(c, global.Prefix("t:"))
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(t, store, hybrid.Mode{}, 10)
	if d, err := l.Allow(context.Background(), "api", "client-1"); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"inspect", "-addr", m.Addr(), "-prefix", "t:", "-limit", "api", "-key", "client-1"}, &out, &errs); code != 0 {
		t.Fatalf("inspect: exit %d\n%s%s", code, out.String(), errs.String())
	}
	if s := out.String(); !strings.Contains(s, "bucket t:{api:client-1}") || !strings.Contains(s, "tokens") || !strings.Contains(s, "expires in") {
		t.Errorf("inspect:\n%s", s)
	}
	_ = l.Close(context.Background())
	out.Reset()
	if code := run(context.Background(), []string{"inspect", "-addr", m.Addr(), "-prefix", "t:", "-limit", "api", "-key", "nobody", "-rate", "10", "-burst", "20", "-width", "1024"}, &out, &errs); code != 0 ||
		!strings.Contains(out.String(), "none") || !strings.Contains(out.String(), "windows of 2s") {
		t.Errorf("inspect, windowed: exit %d\n%s%s", code, out.String(), errs.String())
	}
	if code := run(context.Background(), []string{"inspect", "-addr", m.Addr()}, &out, &errs); code != 2 {
		t.Errorf("inspect without -limit: exit %d, want 2", code)
	}
}

// TestPasswordFromTheEnvironment: the ACL user and password come from $REDIS_USERNAME
// and $REDIS_PASSWORD when -user and -password are not given, and the password never
// appears in the usage text (a mistyped flag prints it to stderr, which ends up in
// logs); -h exits 0.
func TestPasswordFromTheEnvironment(t *testing.T) {
	const secret = "s3cret-pw"
	t.Setenv("REDIS_PASSWORD", secret)
	t.Setenv("REDIS_USERNAME", "ops")
	m, _ := redistest.Mini(t)
	m.RequireUserAuth("ops", secret)
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"inspect", "-addr", m.Addr(), "-limit", "api", "-key", "k"}, &out, &errs); code != 0 {
		t.Fatalf("inspect with $REDIS_PASSWORD: exit %d\n%s%s", code, out.String(), errs.String())
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"inspect", "-limt", "api"}, 2},
		{[]string{"doctor", "-h"}, 0},
	} {
		out.Reset()
		errs.Reset()
		if code := run(context.Background(), tc.args, &out, &errs); code != tc.code || strings.Contains(out.String()+errs.String(), secret) {
			t.Errorf("%v: exit %d (want %d)\n%s%s", tc.args, code, tc.code, out.String(), errs.String())
		}
	}
}

// windowRate is the rate of the windowed limit admitWindowed counts in, burst 20:
// windows of an hour, so that the admissions and inspect's read fall in one.
const windowRate = 20.0 / 3600

// admitWindowed admits n requests of client-1 under a windowed limit "api" of
// windowRate on store, then closes the Limiter: its last report counts them in Redis.
func admitWindowed(t *testing.T, store *global.Store, n int) {
	t.Helper()
	admitWindowedKeys(t, store, map[string]int{"client-1": n})
}

// admitWindowedKeys is admitWindowed for several keys: n[key] requests of each.
func admitWindowedKeys(t *testing.T, store *global.Store, n map[string]int) {
	t.Helper()
	ctx := context.Background()
	l := newLimiter(t, store, hybrid.Windowed(100*time.Millisecond), windowRate)
	for key, n := range n {
		for range n {
			if d, err := l.Allow(ctx, "api", key); err != nil || !d.Allowed {
				t.Fatalf("Allow %s: %+v, %v", key, d, err)
			}
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestInspectWindowedReadsOnly: inspect reads a windowed limit's count of the key's
// window from the arrays a windowed hybrid.Limiter writes, and writes nothing: no key
// made, none changed (a missing array reads 0).
func TestInspectWindowedReadsOnly(t *testing.T) {
	m, c := redistest.Mini(t)
	ctx := context.Background()
	store, err := global.New(c)
	if err != nil {
		t.Fatal(err)
	}
	admitWindowed(t, store, 3)
	state := func() map[string]string {
		out := map[string]string{}
		for _, k := range m.Keys() {
			v, _ := c.Dump(ctx, k).Result()
			out[k] = fmt.Sprint(v, m.TTL(k))
		}
		return out
	}
	before := state()
	for _, tc := range []struct{ limit, key, want string }{
		{"api", "client-1", ": 3 of 20"},
		{"api", "nobody", ": 0 of 20"},
		{"other", "client-1", ": 0 of 20"}, // no array at all
	} {
		var out, errs bytes.Buffer
		args := []string{"inspect", "-addr", m.Addr(), "-limit", tc.limit, "-key", tc.key,
			"-rate", strconv.FormatFloat(windowRate, 'g', -1, 64), "-burst", "20"}
		if code := run(ctx, args, &out, &errs); code != 0 || !strings.Contains(out.String(), tc.want) {
			t.Errorf("inspect %s %s: exit %d, want %q\n%s%s", tc.limit, tc.key, code, tc.want, out.String(), errs.String())
		}
	}
	if after := state(); !maps.Equal(before, after) {
		t.Errorf("inspect wrote to Redis: keys %v, then %v", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
	}
}

// TestTLS: with -tls and -tls-ca, the command reaches a Redis that speaks TLS with a
// certificate of that CA; without -tls-ca, the system's roots refuse the certificate;
// without -tls, the connection fails.
func TestTLS(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleetlimit test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := miniredis.RunTLS(&tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, tc := range []struct {
		flags []string
		code  int
	}{
		{[]string{"-tls", "-tls-ca", ca}, 0},
		{[]string{"-tls"}, 1},              // the system's roots do not know the test CA
		{[]string{"-timeout", "500ms"}, 1}, // plain text to a TLS server
		{[]string{"-tls-ca", ca}, 2},       // -tls-ca without -tls
		{[]string{"-tls", "-tls-ca", "/nonexistent"}, 2},
	} {
		var out, errs bytes.Buffer
		args := append([]string{"inspect", "-addr", m.Addr(), "-limit", "api", "-key", "k"}, tc.flags...)
		if code := run(context.Background(), args, &out, &errs); code != tc.code {
			t.Errorf("%v: exit %d, want %d\n%s%s", tc.flags, code, tc.code, out.String(), errs.String())
		}
	}
}

// TestInspectCluster: on a Redis Cluster, inspect reads a windowed limit's count from
// the key's shard, in the arrays a windowed hybrid.Limiter writes there.
func TestInspectCluster(t *testing.T) {
	c := redistest.Cluster(t, func(o *redis.ClusterOptions) { o.MaxRedirects = -1 })
	ctx := context.Background()
	prefix := redistest.Unique(t) + ":"
	store, err := global.New(c, global.Prefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	admitWindowed(t, store, 3)
	var out, errs bytes.Buffer
	args := []string{"inspect", "-cluster", "-addr", c.Options().Addrs[0], "-prefix", prefix, "-limit", "api", "-key", "client-1",
		"-rate", strconv.FormatFloat(windowRate, 'g', -1, 64), "-burst", "20"}
	if code := run(ctx, args, &out, &errs); code != 0 || !strings.Contains(out.String(), ": 3 of 20") {
		t.Errorf("inspect -cluster, windowed: exit %d, want the current window's 3 of 20\n%s%s", code, out.String(), errs.String())
	}
	// Without -cluster, a plain client would read one node's keys (or get MOVED): the
	// command says to add it, before it reads or writes anything.
	for _, args := range [][]string{
		{"inspect", "-addr", c.Options().Addrs[0], "-prefix", prefix, "-limit", "api", "-key", "client-1"},
		{"doctor", "-addr", c.Options().Addrs[0], "-prefix", prefix},
	} {
		out.Reset()
		errs.Reset()
		if code := run(ctx, args, &out, &errs); code != 2 || !strings.Contains(errs.String(), "add -cluster") || out.Len() > 0 {
			t.Errorf("%s on a Cluster node without -cluster: exit %d, want 2 and the flag named\n%s%s", args[0], code, out.String(), errs.String())
		}
	}
}

// TestDoctorCluster: on a Cluster of the test's own (full coverage off, as
// docs/operations.md says), every check passes; once a master requires full coverage,
// doctor warns with the fix.
func TestDoctorCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Cluster of six redis-servers")
	}
	c := redistest.StartCluster(t, redistest.ClusterConfig{NodeTimeout: time.Second})
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"doctor", "-cluster", "-addr", c.Addrs()[0], "-deadline", "1s"}, &out, &errs); code != 0 ||
		!strings.Contains(out.String(), "PASS  cluster") || strings.Contains(out.String(), "WARN  failover") {
		t.Fatalf("doctor on a healthy Cluster: exit %d\n%s%s", code, out.String(), errs.String())
	}
	if err := c.Masters[0].Client().ConfigSet(context.Background(), "cluster-require-full-coverage", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run(context.Background(), []string{"doctor", "-cluster", "-addr", c.Addrs()[0], "-deadline", "1s"}, &out, &errs); code != 0 ||
		!strings.Contains(out.String(), "WARN  failover") || !strings.Contains(out.String(), "cluster-require-full-coverage no") {
		t.Errorf("a master requiring full coverage: exit %d\n%s", code, out.String())
	}
	// Redis's default cluster-node-timeout, 15 s, is an outage that long for a failed
	// master's keys: past 5 s, doctor warns.
	if err := c.Masters[1].Client().ConfigSet(context.Background(), "cluster-node-timeout", "15000").Err(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run(context.Background(), []string{"doctor", "-cluster", "-addr", c.Addrs()[0], "-deadline", "1s"}, &out, &errs); code != 0 ||
		!strings.Contains(out.String(), "cluster-node-timeout 15000 ms") || !strings.Contains(out.String(), "1000-2000 ms") {
		t.Errorf("a master with cluster-node-timeout 15000: exit %d\n%s", code, out.String())
	}
}

// TestRejectsStrayArguments: an argument that is not a flag stops flag parsing, so the
// flags after it would go unread and the command would check another Redis (the default
// address) than the one named: it exits 2 and says why, before it connects.
func TestRejectsStrayArguments(t *testing.T) {
	for _, args := range [][]string{
		{"doctor", "127.0.0.1:1", "-cluster"},
		{"inspect", "-limit", "api", "-key", "k", "extra"},
	} {
		var out, errs bytes.Buffer
		if code := run(context.Background(), args, &out, &errs); code != 2 || !strings.Contains(errs.String(), "unexpected argument") {
			t.Errorf("%q: exit %d, %q; want 2 and the stray argument named", args, code, errs.String())
		}
	}
}

// TestInspectRejectsBadFlags: -rate without -burst (or the reverse), a limit name no
// limit can have, a -width that is not a power of two in range (ShardWidth would round
// it to other counters than the ones named) and a -timeout that is not positive are
// usage errors, not a report on nothing.
func TestInspectRejectsBadFlags(t *testing.T) {
	srv := redistest.StartServer(t)
	for _, args := range [][]string{
		{"inspect", "-addr", srv.Addr, "-limit", "api", "-key", "k", "-rate", "10"},
		{"inspect", "-addr", srv.Addr, "-limit", "api", "-key", "k", "-burst", "10"},
		{"inspect", "-addr", srv.Addr, "-limit", "a{b}", "-key", "k"},
		{"inspect", "-addr", srv.Addr, "-limit", "api", "-key", "k", "-rate", "10", "-burst", "10", "-width", "1000"},
		{"inspect", "-addr", srv.Addr, "-limit", "api", "-key", "k", "-width", "8"},
		{"inspect", "-addr", srv.Addr, "-limit", "api", "-key", "k", "-timeout", "0s"},
		{"doctor", "-addr", srv.Addr, "-timeout", "-1s"},
	} {
		var out, errs bytes.Buffer
		if code := run(context.Background(), args, &out, &errs); code != 2 {
			t.Errorf("%q: exit %d (%s%s), want 2", args, code, out.String(), errs.String())
		}
	}
}

// TestDoctorRoundTripVerdicts: the round trip passes under a fifth of -deadline, warns
// under half of it and fails past that, and only a FAIL makes the exit status 1. A
// Redis 40 ms away (every round trip at least that long) is judged against 200 ms (a
// warning: 40 ms is a fifth, and a loaded machine stays under 100 ms) and against 80 ms
// (a failure: 40 ms is half).
func TestDoctorRoundTripVerdicts(t *testing.T) {
	srv := redistest.StartServer(t)
	addr := slowProxy(t, srv.Addr, 40*time.Millisecond)
	for _, tc := range []struct {
		deadline string
		want     verdict
		code     int
	}{
		{"200ms", warn, 0},
		{"80ms", fail, 1},
	} {
		var out, errs bytes.Buffer
		code := run(context.Background(), []string{"doctor", "-addr", addr, "-deadline", tc.deadline, "-timeout", "30s"}, &out, &errs)
		if line := string(tc.want) + "  round trip"; code != tc.code || !strings.Contains(out.String(), line) || !strings.Contains(out.String(), "against a "+tc.deadline+" deadline") {
			t.Errorf("-deadline %s, a Redis 40ms away: exit %d, want %d and %q\n%s%s", tc.deadline, code, tc.code, line, out.String(), errs.String())
		}
	}
}

// versionProxy forwards connections to addr, each reply with from, an INFO field,
// replaced by to, of the same length (a bulk string's length goes before it): a Redis
// that says it is another version. It stops with the test.
func versionProxy(t *testing.T, addr, from, to string) string {
	t.Helper()
	if len(from) != len(to) {
		t.Fatalf("versionProxy: %q and %q differ in length", from, to)
	}
	return proxy(t, addr, func(in, out net.Conn) {
		go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
		go func() {
			defer in.Close()
			var pending []byte
			buf := make([]byte, 64<<10)
			for {
				n, err := out.Read(buf)
				if err != nil {
					return
				}
				pending = bytes.ReplaceAll(append(pending, buf[:n]...), []byte(from), []byte(to))
				// A tail that may begin from waits for the next read: from may be split
				// across two. A reply ends in CRLF, which begins no INFO field.
				keep := 0
				for k := min(len(from)-1, len(pending)); k > 0; k-- {
					if bytes.HasSuffix(pending, []byte(from[:k])) {
						keep = k
						break
					}
				}
				if _, err := in.Write(pending[:len(pending)-keep]); err != nil {
					return
				}
				pending = append([]byte(nil), pending[len(pending)-keep:]...)
			}
		}()
	})
}

// TestDoctorVersion: Redis 6 and later pass, 5 warns (it runs the scripts, untested) and
// an older one fails (no effects replication for scripts that read TIME), with exit
// status 1. The test's redis-server says it is each of these through a proxy.
func TestDoctorVersion(t *testing.T) {
	srv := redistest.StartServer(t)
	info, err := srv.Client().Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	actual := field(info, "redis_version")
	major, rest, ok := strings.Cut(actual, ".")
	if !ok {
		t.Fatalf("redis_version %q", actual)
	}
	for _, tc := range []struct {
		major int
		want  verdict
		code  int
	}{
		{7, pass, 0},
		{6, pass, 0},
		{5, warn, 0},
		{4, fail, 1},
	} {
		v := fmt.Sprintf("%0*d.%s", len(major), tc.major, rest) // as long as the real one
		addr := versionProxy(t, srv.Addr, "redis_version:"+actual, "redis_version:"+v)
		var out, errs bytes.Buffer
		code := run(context.Background(), []string{"doctor", "-addr", addr, "-deadline", "1s"}, &out, &errs)
		if line := fmt.Sprintf("%s  %-12s Redis %s\n", tc.want, "version", v); code != tc.code || !strings.Contains(out.String(), line) {
			t.Errorf("Redis %s: exit %d, want %d and %q\n%s%s", v, code, tc.code, line, out.String(), errs.String())
		}
	}
}

// TestDoctorACL: a user refused SCRIPT LOAD or BITFIELD fails that check, with the ACL
// rule to add, and exit status 1; a user whose keys are those of a prefix passes the
// BITFIELD check with -prefix, whose test key goes under it, and fails it without,
// naming the key it tried.
func TestDoctorACL(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	for user, rules := range map[string][]any{
		"noscript":   {"~*", "+@all", "-@scripting"},
		"nobitfield": {"~*", "+@all", "-bitfield"},
		"tkeys":      {"~t:*", "+@all"},
	} {
		if err := srv.Client().Do(ctx, append([]any{"ACL", "SETUSER", user, "on", ">pw"}, rules...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		user   string
		flags  []string
		code   int
		want   []string
		absent []string
	}{
		{"noscript", nil, 1, []string{"FAIL  scripts", "fix: allow SCRIPT LOAD and EVALSHA for the limiter's user (ACL +@scripting)", "PASS  BITFIELD"}, nil},
		{"nobitfield", nil, 1, []string{"FAIL  BITFIELD", "windowed limits need BITFIELD (ACL +bitfield)", "PASS  scripts"}, nil},
		{"tkeys", []string{"-prefix", "t:"}, 0, []string{"PASS  BITFIELD"}, []string{"FAIL"}},
		{"tkeys", nil, 1, []string{"FAIL  BITFIELD", "(fl:doctor:{"}, nil},
	} {
		var out, errs bytes.Buffer
		args := append([]string{"doctor", "-addr", srv.Addr, "-deadline", "1s", "-user", tc.user, "-password", "pw"}, tc.flags...)
		code := run(ctx, args, &out, &errs)
		bad := code != tc.code
		for _, s := range tc.want {
			bad = bad || !strings.Contains(out.String(), s)
		}
		for _, s := range tc.absent {
			bad = bad || strings.Contains(out.String(), s)
		}
		if bad {
			t.Errorf("%s %v: exit %d, want %d, the lines %q and none of %q\n%s%s", tc.user, tc.flags, code, tc.code, tc.want, tc.absent, out.String(), errs.String())
		}
	}
}

// TestInspectWindows: inspect prints the key's previous and current windows, in order,
// each with the instant it ends: the previous one has ended when Redis is asked, the
// current one ends one window later, and the admissions are in the current one.
func TestInspectWindows(t *testing.T) {
	m, c := redistest.Mini(t)
	store, err := global.New(c)
	if err != nil {
		t.Fatal(err)
	}
	admitWindowed(t, store, 3)
	var out, errs bytes.Buffer
	before := time.Now()
	code := run(context.Background(), []string{"inspect", "-addr", m.Addr(), "-limit", "api", "-key", "client-1",
		"-rate", strconv.FormatFloat(windowRate, 'g', -1, 64), "-burst", "20"}, &out, &errs)
	after := time.Now()
	if code != 0 {
		t.Fatalf("inspect: exit %d\n%s%s", code, out.String(), errs.String())
	}
	lines := regexp.MustCompile(`(?m)^  window (\d+) \(ends (\S+)\): (\d+) of 20$`).FindAllStringSubmatch(out.String(), -1)
	if len(lines) != 2 {
		t.Fatalf("%d window lines, want the previous and the current window's\n%s", len(lines), out.String())
	}
	var idx [2]int
	var ends [2]time.Time
	for i, l := range lines {
		idx[i], _ = strconv.Atoi(l[1])
		if ends[i], err = time.Parse(time.RFC3339Nano, l[2]); err != nil {
			t.Fatal(err)
		}
	}
	const window = time.Hour // burst / rate
	if idx[1] != idx[0]+1 || ends[1].Sub(ends[0]) != window || ends[0].After(after) || !ends[1].After(before) ||
		lines[0][3] != "0" || lines[1][3] != "3" {
		t.Errorf("windows %v ending %v, read between %v and %v: want consecutive windows, the previous ended, the current not, 0 then 3 of 20\n%s",
			idx, ends, before, after, out.String())
	}
}

// TestInspectReadsTheLesserCounter: a windowed limit counts each key in two rows of
// counters of its window's array, and another key in the same array may share either
// of its counters; the limiter takes the lesser of the two as the key's count, and so
// does inspect. Key a shares key p's counter in row 0, key b p's counter in row 1: each
// reads its own count, not the sum.
func TestInspectReadsTheLesserCounter(t *testing.T) {
	width := redisstore.ShardWidth(wire.DefaultWindowWidth, 1) // one Redis, one shard
	wus := wire.WindowMicros(windowRate, 20)
	now := time.Now().UnixMicro()
	counter := func(key string, row int) int { return wire.WindowCounter(string(redisstore.IDOf(key)), row, width) }
	// The key's window now (each key's windows have a phase of their own), and whether
	// it is still that window 5 minutes on: the test's admissions and reads fall in it.
	window := func(key string) (int64, bool) {
		phase := wire.WindowPhase(string(redisstore.IDOf(key)), wus)
		w := wire.WindowIndex(now, phase, wus)
		return w, w == wire.WindowIndex(now+(5*time.Minute).Microseconds(), phase, wus)
	}
	var p, a, b string
	var pw int64
	for i := 0; p == "" || a == "" || b == ""; i++ {
		if i == 1<<24 {
			t.Fatal("no keys share a counter in one window")
		}
		k := "key-" + strconv.Itoa(i)
		w, stays := window(k)
		switch {
		case !stays:
		case p == "":
			p, pw = k, w
		case w != pw:
		case a == "" && counter(k, 0) == counter(p, 0) && counter(k, 1) != counter(p, 1):
			a = k
		case b == "" && counter(k, 1) == counter(p, 1) && counter(k, 0) != counter(p, 0):
			b = k
		}
	}
	m, c := redistest.Mini(t)
	store, err := global.New(c)
	if err != nil {
		t.Fatal(err)
	}
	admitWindowedKeys(t, store, map[string]int{p: 3, a: 1, b: 2})
	for _, tc := range []struct{ key, want string }{
		{a, ": 1 of 20"}, // its row 0 counter is p's too, at 3 or more
		{b, ": 2 of 20"}, // its row 1 counter is p's too, at 3 or more
	} {
		var out, errs bytes.Buffer
		args := []string{"inspect", "-addr", m.Addr(), "-limit", "api", "-key", tc.key,
			"-rate", strconv.FormatFloat(windowRate, 'g', -1, 64), "-burst", "20"}
		if code := run(context.Background(), args, &out, &errs); code != 0 || !strings.Contains(out.String(), tc.want) {
			t.Errorf("inspect %s: exit %d, want %q\n%s%s", tc.key, code, tc.want, out.String(), errs.String())
		}
	}
}
