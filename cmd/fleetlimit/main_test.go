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
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
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

// slowProxy forwards connections to addr, each request reaching it delay late: a Redis
// that far away. It stops with the test.
func slowProxy(t *testing.T, addr string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			to, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			t.Cleanup(func() { _ = in.Close(); _ = to.Close() })
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
		}
	}()
	return ln.Addr().String()
}

// newLimiter is a Limiter of one server on store, its limit "api" (10/s, burst 20) of
// mode, with a breaker's timeout that leaves room for -race.
// newLimiter is a Limiter on store with one limit "api" of burst 20 and the rate given.
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
	ctx := context.Background()
	l := newLimiter(t, store, hybrid.Windowed(100*time.Millisecond), windowRate)
	for range n {
		if d, err := l.Allow(ctx, "api", "client-1"); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
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
