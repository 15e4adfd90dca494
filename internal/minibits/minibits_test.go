package minibits_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/minibits"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// mini starts a miniredis with BITFIELD registered and returns it with a client.
func mini(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	if err := minibits.Register(m); err != nil {
		t.Fatalf("Register: %v", err)
	}
	c := redis.NewClient(redistest.Options(m.Addr()))
	t.Cleanup(func() { _ = c.Close() })
	return m, c
}

// show renders a reply, or its error, so that replies of two servers compare as text.
func show(v any, err error) string {
	switch {
	case err == redis.Nil:
		return "nil"
	case err != nil:
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%#v", v)
}

// do runs one command, "K" standing for key among its arguments, and shows its reply.
func do(ctx context.Context, c *redis.Client, key string, cmd []string) string {
	args := make([]any, len(cmd))
	for i, a := range cmd {
		if a == "K" {
			args[i] = key
		} else {
			args[i] = a
		}
	}
	return show(c.Do(ctx, args...).Result())
}

// final shows what is left under key: its bytes (GET), nil when it is missing, or the
// error of a key of another type.
func final(ctx context.Context, c *redis.Client, key string) string {
	v, err := c.Get(ctx, key).Result()
	if err != nil {
		return show(nil, err)
	}
	return strconv.Quote(v)
}

// cmd splits a command line into its arguments.
func cmd(s string) []string { return strings.Fields(s) }

// compareCases are command sequences whose replies and final bytes must be the same on
// miniredis with minibits and on a real Redis. K is the case's key.
var compareCases = []struct {
	name string
	cmds []string
}{
	{"u16 u32 plain offsets", []string{
		"BITFIELD K SET u16 0 1234 GET u16 0",
		"BITFIELD K INCRBY u32 16 100000 GET u32 16 GET u16 0 GET u8 8",
		"BITFIELD K SET u32 16 4294967295 INCRBY u32 16 1 GET u32 16",
		"BITFIELD K SET u16 3 65535 GET u16 3 GET u8 0 GET u8 1 GET u8 2",
	}},
	{"hash offsets", []string{
		"BITFIELD K SET u8 #3 200 SET i8 #5 -3 GET u8 #3 GET i8 #5 GET u8 #4",
		"BITFIELD K INCRBY u16 #2 7 INCRBY u16 #2 7 GET u16 #2 GET u16 32",
		"BITFIELD K SET i5 #3 -16 GET i5 15 GET u5 #3",
		"BITFIELD K OVERFLOW SAT INCRBY u16 #3 1 INCRBY u16 #70 1 INCRBY u16 #3 1 GET u16 #3 GET u16 #70",
	}},
	{"i8 i5 unaligned across bytes", []string{
		"BITFIELD K SET i5 6 -9 GET i5 6 GET u5 6 GET u8 0 GET u8 8",
		"BITFIELD K INCRBY i5 6 30 GET i5 6",
		"BITFIELD K SET u3 13 7 SET i8 3 -128 GET i8 3 GET u16 0 GET i16 0",
		"BITFIELD K INCRBY i8 3 -1 GET i8 3 INCRBY i8 11 100 GET i16 3",
		"BITFIELD K SET u1 0 1 SET u1 15 1 SET u1 16 1 GET u17 0 GET i17 0",
	}},
	{"i64", []string{
		"BITFIELD K SET i64 3 -9223372036854775808 GET i64 3 GET u63 3 GET u8 0",
		"BITFIELD K INCRBY i64 3 -1 GET i64 3",
		"BITFIELD K OVERFLOW SAT INCRBY i64 3 1 OVERFLOW FAIL INCRBY i64 3 1 GET i64 3",
		"BITFIELD K OVERFLOW SAT INCRBY i64 3 -9223372036854775808 INCRBY i64 3 -9223372036854775808 INCRBY i64 3 -1",
		"BITFIELD K OVERFLOW WRAP INCRBY i64 3 -1 SET i64 #2 9223372036854775807 INCRBY i64 #2 9223372036854775807",
		"BITFIELD K OVERFLOW FAIL INCRBY i64 #2 -9223372036854775808 INCRBY i64 #2 -9223372036854775808 GET i64 #2",
	}},
	{"u63", []string{
		"BITFIELD K SET u63 1 9223372036854775807 GET u63 1 GET i64 0",
		"BITFIELD K INCRBY u63 1 1 GET u63 1",
		"BITFIELD K OVERFLOW SAT INCRBY u63 1 -5 INCRBY u63 1 9223372036854775807 INCRBY u63 1 1",
		"BITFIELD K OVERFLOW SAT INCRBY u63 1 -9223372036854775808 SET u63 1 -1 GET u63 1",
		"BITFIELD K OVERFLOW WRAP INCRBY u63 1 -9223372036854775808 SET u63 1 -1 GET u63 1",
		"BITFIELD K OVERFLOW FAIL SET u63 1 -1 INCRBY u63 1 -9223372036854775807 INCRBY u63 1 9223372036854775807",
	}},
	{"wrap both directions", []string{
		"BITFIELD K SET u8 0 250 INCRBY u8 0 10 INCRBY u8 0 -10 INCRBY u8 0 -1000 INCRBY u8 0 1000",
		"BITFIELD K SET i8 8 127 INCRBY i8 8 1 INCRBY i8 8 -1 INCRBY i8 8 -300 INCRBY i8 8 9223372036854775807",
		"BITFIELD K SET u8 16 300 GET u8 16 SET i8 16 200 GET i8 16 SET u8 16 -1 GET u8 16 SET i8 16 -129",
		"BITFIELD K OVERFLOW wrap SET u5 #10 -5 GET u5 #10 INCRBY u5 #10 -9223372036854775808 INCRBY i5 #10 9223372036854775807",
	}},
	{"sat both directions", []string{
		"BITFIELD K OVERFLOW SAT SET u8 0 3 INCRBY u8 0 300 INCRBY u8 0 -1000 INCRBY u8 0 -1 INCRBY u8 0 9223372036854775807",
		"BITFIELD K OVERFLOW SAT INCRBY u16 #1 -1 INCRBY u16 #1 65536 INCRBY u16 #1 -9223372036854775808",
		"BITFIELD K OVERFLOW SAT INCRBY i8 #4 1000 INCRBY i8 #4 -1000 INCRBY i8 #4 -9223372036854775808 INCRBY i8 #4 9223372036854775807",
		"BITFIELD K OVERFLOW SAT SET u8 #5 -5 GET u8 #5 SET i8 #5 -300 GET i8 #5 SET i8 #5 300 GET i8 #5 SET u8 #5 256 GET u8 #5",
		"BITFIELD K OVERFLOW SAT SET u1 #50 -1 GET u1 #50 INCRBY i1 #50 -1 INCRBY i1 #50 1 INCRBY i1 #50 -5",
	}},
	{"fail both directions", []string{
		"BITFIELD K SET u8 0 250 OVERFLOW FAIL INCRBY u8 0 10 INCRBY u8 0 -251 INCRBY u8 0 5 INCRBY u8 0 -255 GET u8 0",
		"BITFIELD K OVERFLOW FAIL SET i8 8 -128 INCRBY i8 8 -1 INCRBY i8 8 255 INCRBY i8 8 256 GET i8 8",
		"BITFIELD K OVERFLOW FAIL SET u8 16 256 SET u8 16 -1 SET i8 16 128 SET i8 16 -129 SET i8 16 -128 GET i8 16",
		"BITFIELD K OVERFLOW FAIL SET u16 80 65536 INCRBY i16 100 40000",
	}},
	{"fail on a missing key still creates it", []string{
		"BITFIELD K OVERFLOW FAIL SET u8 16 256",
		"EXISTS K",
		"STRLEN K",
		"BITFIELD K OVERFLOW FAIL INCRBY i8 #9 300",
		"STRLEN K",
	}},
	{"overflow modes switch", []string{
		"BITFIELD K OVERFLOW SAT INCRBY u8 0 300 OVERFLOW WRAP INCRBY u8 8 300 OVERFLOW fail INCRBY u8 16 300 INCRBY u8 24 1 overflow Sat incrby u8 24 1000",
		"bitfield K get u8 0 Get u8 8 GET u8 16 gEt u8 24",
	}},
	{"string grows", []string{
		"SET K ab",
		"BITFIELD K SET u8 #5 1",
		"STRLEN K",
		"BITFIELD K INCRBY u1 100 1 GET u8 #12",
		"STRLEN K",
		"BITFIELD K GET u8 #100 GET i64 4000 GET u8 0",
		"STRLEN K",
		"BITFIELD K SET u1 103 0 SET i2 104 0",
		"STRLEN K",
		"BITFIELD K INCRBY u7 1 1",
		"STRLEN K",
	}},
	{"several subcommands in one call", []string{
		"BITFIELD K SET u8 0 5 INCRBY u8 0 3 GET u8 0 SET u8 0 1 GET u8 0",
		"BITFIELD K SET u16 0 65535 GET u8 4 INCRBY i4 2 1 GET u16 0 SET i16 4 -2 GET u16 0 GET u24 0",
		"BITFIELD K OVERFLOW SAT INCRBY u8 #1 200 INCRBY u8 #1 200 OVERFLOW FAIL INCRBY u8 #1 1 OVERFLOW WRAP INCRBY u8 #1 1",
	}},
	{"existing string", []string{
		"SET K hello",
		"BITFIELD K GET u8 0 GET i8 #1 GET u16 #1 GET u32 3 GET i64 0 GET u63 1",
		"BITFIELD K SET u8 #0 72 INCRBY u4 8 1 SET u32 #1 1",
	}},
	{"missing key with GETs only", []string{
		"BITFIELD K GET u8 0 GET i64 4000 GET u63 #100",
		"EXISTS K",
		"BITFIELD K",
		"BITFIELD K OVERFLOW SAT",
		"BITFIELD K OVERFLOW FAIL GET u8 0",
		"BITFIELD_RO K GET u8 0",
		"EXISTS K",
	}},
	{"wrong type", []string{
		"RPUSH K x",
		"BITFIELD K GET u8 0",
		"BITFIELD K SET u8 0 1",
		"BITFIELD K",
		"BITFIELD K GET u65 0",
		"BITFIELD_RO K GET u8 0",
		"BITFIELD_RO K SET u8 0 1",
		"LRANGE K 0 -1",
	}},
	{"errors leave the value untouched", []string{
		"SET K abc",
		"BITFIELD",
		"BITFIELD_RO",
		"BITFIELD K SET u8 0 1 GET u65 0",
		"BITFIELD K SET u8 0 1 GET u64 0",
		"BITFIELD K SET u8 0 1 GET U8 0",
		"BITFIELD K SET u8 0 1 GET i0 0",
		"BITFIELD K SET u8 0 1 GET u0 0",
		"BITFIELD K SET u8 0 1 GET i65 0",
		"BITFIELD K SET u8 0 1 GET x8 0",
		"BITFIELD K SET u8 0 1 GET i 0",
		"BITFIELD K SET u8 0 1 GET u08 0",
		"BITFIELD K SET u8 0 1 GET u+8 0",
		"BITFIELD K SET u8 0 1 GET u8 -1",
		"BITFIELD K SET u8 0 1 GET u8 4294967296",
		"BITFIELD K SET u8 0 1 GET i64 #67108864",
		"BITFIELD K SET u8 0 1 GET u8 #-1",
		"BITFIELD K SET u8 0 1 GET u8 #",
		"BITFIELD K SET u8 0 1 GET u8 ##1",
		"BITFIELD K SET u8 0 1 GET u8 abc",
		"BITFIELD K SET u8 0 1 GET u8 +1",
		"BITFIELD K SET u8 0 1 GET u8 01",
		"BITFIELD K SET u8 0 1 GET u8 -0",
		"BITFIELD K SET u8 0 1 SET u8 0 x",
		"BITFIELD K SET u8 0 1 SET u8 0 1.5",
		"BITFIELD K SET u8 0 1 SET i64 0 9223372036854775808",
		"BITFIELD K SET u8 0 1 SET i64 0 -9223372036854775809",
		"BITFIELD K SET u8 0 1 SET u8 0 -0",
		"BITFIELD K SET u8 0 1 INCRBY u8 0 +1",
		"BITFIELD K SET u8 0 1 OVERFLOW BAD",
		"BITFIELD K SET u8 0 1 OVERFLOW",
		"BITFIELD K SET u8 0 1 GET u8",
		"BITFIELD K SET u8 0 1 SET u8 0",
		"BITFIELD K SET u8 0 1 INCRBY u8 0",
		"BITFIELD K SET u8 0 1 FOO",
		"BITFIELD K SET u8 0 1 FOO u8 0 1",
		"BITFIELD K GET u65 0 GET u8 -1",
		"BITFIELD K GET u8 -1 GET u65 0",
		"BITFIELD K OVERFLOW BAD GET u65 0",
		"BITFIELD K GET u8 x OVERFLOW BAD",
		"BITFIELD K SET u8 x 1",
		"BITFIELD K SET u65 0 x",
		"BITFIELD K SET u8 4294967296 1",
		"BITFIELD_RO K GET u8 0 GET u65 0",
		"BITFIELD_RO K SET u8 0 1 GET u65 0",
		"BITFIELD_RO K GET u8 0 OVERFLOW",
	}},
	{"largest offsets", []string{
		"SET K abcdefgh",
		"BITFIELD K GET u8 4294967295 GET i64 4294967295 GET u8 #536870911 GET i64 #67108863",
		"BITFIELD K GET i64 #288230376151711744 GET u8 #2305843009213693952",
		"EXISTS K",
	}},
	{"bitfield_ro", []string{
		"SET K xyz",
		"BITFIELD_RO K GET u8 0 GET i16 #1 GET u4 4",
		"BITFIELD_RO K OVERFLOW SAT GET u8 0",
		"BITFIELD_RO K OVERFLOW SAT",
		"BITFIELD_RO K",
		"BITFIELD_RO K SET u8 0 1",
		"BITFIELD_RO K INCRBY u8 0 1",
		"BITFIELD_RO K GET u8 0 INCRBY u8 0 1",
		"bitfield_ro K get u8 0",
	}},
}

// TestMatchesRedis runs each case on miniredis with minibits and on the shared real
// Redis, and wants the same reply to every command and the same bytes left in the key.
func TestMatchesRedis(t *testing.T) {
	rc := redistest.Real(t)
	_, mc := mini(t)
	ctx := context.Background()
	for _, tc := range compareCases {
		t.Run(tc.name, func(t *testing.T) {
			key := redistest.Unique(t)
			t.Cleanup(func() { rc.Del(context.Background(), key) })
			for _, c := range tc.cmds {
				want := do(ctx, rc, key, cmd(c))
				if got := do(ctx, mc, key, cmd(c)); got != want {
					t.Errorf("%s\n miniredis: %s\n redis:     %s", c, got, want)
				}
			}
			want, got := final(ctx, rc, key), final(ctx, mc, key)
			if got != want {
				t.Errorf("final GET\n miniredis: %s\n redis:     %s", got, want)
			}
		})
	}
}

// TestKnownReplies checks, without a real Redis, the replies of a few cases where Redis
// does something easy to get wrong (each one checked against Redis 7.0 by
// TestMatchesRedis as well).
func TestKnownReplies(t *testing.T) {
	_, c := mini(t)
	ctx := context.Background()
	for _, tc := range []struct {
		cmds  []string
		want  []string
		final string
	}{
		{
			// OVERFLOW FAIL refuses the write but the string has already grown.
			[]string{"BITFIELD K OVERFLOW FAIL SET u8 16 256", "EXISTS K"},
			[]string{"[]interface {}{interface {}(nil)}", "1"},
			`"\x00\x00\x00"`,
		},
		{
			// An unsigned SET takes a negative value as a huge unsigned one: SAT
			// stores the maximum, not 0. An INCRBY below 0 stops at 0.
			[]string{"BITFIELD K OVERFLOW SAT SET u8 0 -5 GET u8 0 INCRBY u8 0 -300"},
			[]string{"[]interface {}{0, 255, 0}"},
			`"\x00"`,
		},
		{
			// A '#' offset is multiplied without an overflow check: 2^58 * 64 wraps to 0.
			[]string{"SET K abcdefgh", "BITFIELD K GET i64 #288230376151711744 GET i64 0"},
			[]string{`"OK"`, "[]interface {}{7017280452245743464, 7017280452245743464}"},
			`"abcdefgh"`,
		},
		{
			[]string{"BITFIELD K GET u8 0 GET i5 3", "EXISTS K", "BITFIELD K"},
			[]string{"[]interface {}{0, 0}", "0", "[]interface {}{}"},
			"nil",
		},
		{
			[]string{"BITFIELD K SET i5 6 -9 GET u16 0 INCRBY i5 6 -8 GET i5 6"},
			[]string{"[]interface {}{0, 736, 15, 15}"},
			`"\x01\xe0"`,
		},
		{
			[]string{"SET K abc", "BITFIELD K SET u8 0 1 GET u64 0", "BITFIELD_RO K SET u8 0 1", "BITFIELD K SET i8 0 1 GET i8 -0"},
			[]string{
				`"OK"`,
				"error: ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.",
				"error: ERR BITFIELD_RO only supports the GET subcommand",
				"error: ERR bit offset is not an integer or out of range",
			},
			`"abc"`,
		},
	} {
		key := redistest.Unique(t)
		for i, cm := range tc.cmds {
			if got := do(ctx, c, key, cmd(cm)); got != tc.want[i] {
				t.Errorf("%s: got %s, want %s", cm, got, tc.want[i])
			}
		}
		if got := final(ctx, c, key); got != tc.final {
			t.Errorf("%v: final GET %s, want %s", tc.cmds, got, tc.final)
		}
	}
}

// TestKeepsTTL checks that a BITFIELD that writes keeps the key's TTL, and gives none
// to a key that had none.
func TestKeepsTTL(t *testing.T) {
	m, c := mini(t)
	ctx := context.Background()
	if err := c.Do(ctx, "BITFIELD", "k", "SET", "u8", "0", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.PExpire(ctx, "k", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "BITFIELD", "k", "INCRBY", "u8", "0", "1", "INCRBY", "u16", "#40", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, "k").Val(); ttl <= 0 || ttl > 10*time.Second {
		t.Errorf("PTTL after BITFIELD INCRBY = %v, want in (0, 10s]", ttl)
	}
	if ttl := m.TTL("k"); ttl != 10*time.Second {
		t.Errorf("m.TTL = %v, want 10s", ttl)
	}
	m.FastForward(11 * time.Second)
	if m.Exists("k") {
		t.Error("key still there after its TTL")
	}

	if err := c.Do(ctx, "BITFIELD", "n", "INCRBY", "u8", "0", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, "n").Val(); ttl != -1 {
		t.Errorf("PTTL of a key without TTL after BITFIELD = %v, want -1", ttl)
	}
}

// TestSelectedDB checks that BITFIELD works on the connection's SELECTed database.
func TestSelectedDB(t *testing.T) {
	m := miniredis.RunT(t)
	if err := minibits.Register(m); err != nil {
		t.Fatal(err)
	}
	o := redistest.Options(m.Addr())
	o.DB = 3
	c := redis.NewClient(o)
	defer c.Close()
	ctx := context.Background()
	if got := show(c.Do(ctx, "BITFIELD", "k", "SET", "u8", "0", "65", "GET", "u8", "0").Result()); got != "[]interface {}{0, 65}" {
		t.Errorf("reply %s", got)
	}
	if v, err := m.DB(3).Get("k"); v != "A" || err != nil {
		t.Errorf("db 3: %q, %v; want \"A\"", v, err)
	}
	if m.DB(0).Exists("k") {
		t.Error("key written to db 0")
	}
}

// TestScriptAndMulti checks that BITFIELD from a Lua script answers an error at once
// instead of deadlocking, and that inside MULTI it is queued and EXEC answers its reply
// in its place, between the replies of the commands around it (a transaction's
// pipeline, as go-redis's TxPipeline sends it, reads every reply).
func TestScriptAndMulti(t *testing.T) {
	m, c := mini(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := c.Eval(ctx, "return redis.call('BITFIELD', KEYS[1], 'INCRBY', 'u8', 0, 1)", []string{"k"}).Err()
	if err == nil || !strings.Contains(err.Error(), "Lua script") {
		t.Errorf("EVAL calling BITFIELD: %v, want the Lua script error", err)
	}
	if m.Exists("k") {
		t.Error("key written by the script")
	}
	pipe := c.TxPipeline()
	first := pipe.BitField(ctx, "k", "OVERFLOW", "SAT", "INCRBY", "u8", "0", "200", "INCRBY", "u8", "8", "1")
	ttl := pipe.PExpire(ctx, "k", time.Minute)
	second := pipe.BitField(ctx, "k", "OVERFLOW", "SAT", "INCRBY", "u8", "0", "100")
	bad := pipe.BitField(ctx, "k", "INCRBY", "u99", "0", "1")
	if _, err := pipe.Exec(ctx); err == nil || !strings.Contains(err.Error(), "bitfield type") {
		t.Errorf("EXEC: %v, want the bad type's error", err)
	}
	if got := fmt.Sprintf("%v %v %v %v", first.Val(), ttl.Val(), second.Val(), bad.Err()); got != "[200 1] true [255] "+msgBadTypeErr {
		t.Errorf("replies inside MULTI: %s", got)
	}
	if d := m.TTL("k"); d <= 0 || d > time.Minute {
		t.Errorf("TTL after EXEC: %v, want a minute", d)
	}
	// The server still answers.
	if got := show(c.Do(ctx, "BITFIELD", "k", "GET", "u8", "8").Result()); got != "[]interface {}{1}" {
		t.Errorf("BITFIELD after: %s", got)
	}
}

// msgBadTypeErr is the error a bad BITFIELD type answers, as go-redis reports it.
const msgBadTypeErr = "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is."

// TestRegister checks that Register fails on a Miniredis not started and on one that
// has the commands already, and that it is needed again after a restart.
func TestRegister(t *testing.T) {
	if err := minibits.Register(miniredis.NewMiniRedis()); err == nil {
		t.Error("Register on a Miniredis not started succeeded")
	}
	m, c := mini(t)
	if err := minibits.Register(m); err == nil {
		t.Error("second Register succeeded")
	}
	ctx := context.Background()
	if err := c.Do(ctx, "BITFIELD", "k", "SET", "u8", "0", "7").Err(); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "BITFIELD", "k", "GET", "u8", "0").Err(); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("BITFIELD after Restart without Register: %v, want unknown command", err)
	}
	if err := minibits.Register(m); err != nil {
		t.Fatalf("Register after Restart: %v", err)
	}
	if got := show(c.Do(ctx, "BITFIELD", "k", "GET", "u8", "0").Result()); got != "[]interface {}{7}" {
		t.Errorf("BITFIELD after Restart and Register: %s", got)
	}
}

// TestConcurrentIncrements runs 8 connections of 500 pipelined saturating INCRBYs each
// and wants every increment counted.
func TestConcurrentIncrements(t *testing.T) {
	m, _ := mini(t)
	o := redistest.Options(m.Addr())
	// A connection's 500 calls wait for the other connections' 3500, each copying the
	// 140 kB string once: seconds under the race detector.
	o.ReadTimeout = time.Minute
	c := redis.NewClient(o)
	defer c.Close()
	ctx := context.Background()
	const workers, calls = 8, 500
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			p := c.Pipeline()
			for range calls {
				p.Do(ctx, "BITFIELD", "k", "OVERFLOW", "SAT", "INCRBY", "u16", "#3", "1", "INCRBY", "u16", "#70000", "1")
			}
			if _, err := p.Exec(ctx); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := show(c.Do(ctx, "BITFIELD", "k", "GET", "u16", "#3", "GET", "u16", "#70000").Result())
	if want := "[]interface {}{4000, 4000}"; got != want {
		t.Errorf("counters %s, want %s", got, want)
	}
	if n := c.StrLen(ctx, "k").Val(); n != 70001*2 {
		t.Errorf("STRLEN %d, want %d", n, 70001*2)
	}
}

// The model: a pure-Go reference of BITFIELD's semantics on valid subcommands, written
// from the Redis documentation and bitops.c independently of minibits (the string is
// one big-endian big.Int, the arithmetic exact).

// mop is one subcommand of a fuzz case; kind "OVERFLOW" sets ow only.
type mop struct {
	kind   string // GET, SET, INCRBY, OVERFLOW
	signed bool
	bits   int
	offset int64  // in bits
	arg    string // the offset as sent: n or #n
	value  int64
	ow     string // WRAP, SAT, FAIL
}

// model runs ops on the string s (exists says whether the key exists) and returns the
// reply entries (nil for a refused write), the value left and whether the key exists.
func model(s string, exists bool, ops []mop) (reply []any, out string, outExists bool) {
	ow := "WRAP"
	writes := false
	top := int64(-1)
	for _, o := range ops {
		if o.kind == "SET" || o.kind == "INCRBY" {
			writes = true
			top = max(top, o.offset+int64(o.bits)-1)
		}
	}
	buf := []byte(s)
	if writes {
		for int64(len(buf)) < top/8+1 {
			buf = append(buf, 0)
		}
	}
	reply = []any{}
	for _, o := range ops {
		if o.kind == "OVERFLOW" {
			ow = o.ow
			continue
		}
		mod := new(big.Int).Lsh(big.NewInt(1), uint(o.bits))
		lo, hi := big.NewInt(0), new(big.Int).Sub(mod, big.NewInt(1))
		if o.signed {
			half := new(big.Int).Rsh(mod, 1)
			lo = new(big.Int).Neg(half)
			hi = new(big.Int).Sub(half, big.NewInt(1))
		}
		raw := readField(buf, o.offset, o.bits)
		old := new(big.Int).Set(raw)
		if o.signed && old.Cmp(hi) > 0 {
			old.Sub(old, mod)
		}
		if o.kind == "GET" {
			reply = append(reply, old.Int64())
			continue
		}
		v := big.NewInt(o.value)
		if o.kind == "INCRBY" {
			v.Add(old, v)
		} else if !o.signed && o.value < 0 {
			// Redis reads an unsigned SET's value as a uint64.
			v.Add(v, new(big.Int).Lsh(big.NewInt(1), 64))
		}
		if v.Cmp(lo) < 0 || v.Cmp(hi) > 0 {
			switch ow {
			case "FAIL":
				reply = append(reply, nil)
				continue
			case "SAT":
				if v.Cmp(lo) < 0 {
					v.Set(lo)
				} else {
					v.Set(hi)
				}
			case "WRAP":
				v.Mod(v, mod) // Euclidean: in [0, mod)
				if v.Cmp(hi) > 0 {
					v.Sub(v, mod)
				}
			}
		}
		if o.kind == "SET" {
			reply = append(reply, old.Int64())
		} else {
			reply = append(reply, v.Int64())
		}
		bits := new(big.Int).Mod(v, mod) // two's complement bits of the field
		writeField(buf, o.offset, o.bits, bits)
	}
	if !exists && !writes {
		return reply, "", false
	}
	return reply, string(buf), true
}

// field returns the string as one big-endian integer of len(buf)*8 bits, and the shift
// that puts a field of bits bits at offset off in its lowest bits (off+bits <= len*8).
func field(buf []byte, off int64, bits int) (*big.Int, uint) {
	return new(big.Int).SetBytes(buf), uint(int64(len(buf))*8 - off - int64(bits))
}

// readField reads an unsigned field; bits past the end are 0.
func readField(buf []byte, off int64, bits int) *big.Int {
	need := (off + int64(bits) + 7) / 8
	if int64(len(buf)) < need {
		buf = append(append([]byte{}, buf...), make([]byte, need-int64(len(buf)))...)
	}
	n, sh := field(buf, off, bits)
	n.Rsh(n, sh)
	return n.And(n, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), uint(bits)), big.NewInt(1)))
}

// writeField stores v (0 <= v < 2^bits) as the field; buf holds it.
func writeField(buf []byte, off int64, bits int, v *big.Int) {
	n, sh := field(buf, off, bits)
	mask := new(big.Int).Lsh(new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), uint(bits)), big.NewInt(1)), sh)
	n.AndNot(n, mask)
	n.Or(n, new(big.Int).Lsh(v, sh))
	n.FillBytes(buf)
}

// decodeOps turns fuzz bytes into valid subcommands: offsets below 4096, every type,
// values biased towards the edges of the types.
func decodeOps(data []byte) []mop {
	var ops []mop
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	for len(data) > 0 && len(ops) < 12 {
		b := next()
		if b%5 == 4 {
			ops = append(ops, mop{kind: "OVERFLOW", ow: []string{"WRAP", "SAT", "FAIL"}[int(b/5)%3]})
			continue
		}
		o := mop{kind: []string{"GET", "SET", "INCRBY", "INCRBY"}[b%5]}
		t := next()
		o.signed = t&1 == 1
		if o.signed {
			o.bits = int(t>>1)%64 + 1
		} else {
			o.bits = int(t>>1)%63 + 1
		}
		off := int64(binary.BigEndian.Uint16([]byte{next(), next()}))
		if off&0x8000 != 0 { // '#' form
			idx := (off & 0x7fff) % (4096 / int64(o.bits))
			o.offset, o.arg = idx*int64(o.bits), "#"+strconv.FormatInt(idx, 10)
		} else {
			o.offset = off % (4096 - int64(o.bits) + 1)
			o.arg = strconv.FormatInt(o.offset, 10)
		}
		if o.kind != "GET" {
			v := next()
			switch v % 4 {
			case 0: // small
				o.value = int64(int8(next()))
			case 1: // near the type's edges
				e := int64(1) << (o.bits - 1)
				if o.bits == 64 {
					e = 1 << 62
				}
				o.value = []int64{e, e - 1, -e, -e - 1, 2 * e, 2*e - 1, -2 * e}[int(v/4)%7] + int64(int8(next()))%3
			case 2: // anything
				var b [8]byte
				for i := range b {
					b[i] = next()
				}
				o.value = int64(binary.BigEndian.Uint64(b[:]))
			case 3: // int64 extremes
				o.value = []int64{-1 << 63, 1<<63 - 1, -1, 0}[int(v/4)%4]
			}
		}
		ops = append(ops, o)
	}
	return ops
}

// args renders ops as BITFIELD's arguments after the key.
func args(ops []mop) []any {
	var a []any
	for _, o := range ops {
		if o.kind == "OVERFLOW" {
			a = append(a, "OVERFLOW", o.ow)
			continue
		}
		typ := "u"
		if o.signed {
			typ = "i"
		}
		a = append(a, o.kind, typ+strconv.Itoa(o.bits), o.arg)
		if o.kind != "GET" {
			a = append(a, strconv.FormatInt(o.value, 10))
		}
	}
	return a
}

// FuzzBitfield decodes random bytes into an initial string (or a missing key) and a
// short sequence of valid subcommands, and checks miniredis with minibits against the
// model: the reply, the bytes left and whether the key exists.
func FuzzBitfield(f *testing.F) {
	f.Add([]byte{0}, []byte{1, 16, 0, 3, 0, 5})
	f.Add([]byte{3, 'a', 'b', 'c'}, []byte{0, 15, 0x80, 1, 2, 0, 127, 4, 1, 15, 0, 9, 1, 4, 0, 2, 127, 0, 0})
	f.Add([]byte{1, 0xff}, []byte{14, 2, 0x80, 7, 5, 0, 0, 2, 127, 0, 3, 3, 1, 0x7f, 0x80, 0x00})
	f.Add([]byte{0}, []byte{9, 1, 0x00, 0x04, 0, 0, 0, 0, 0, 0, 0, 0})
	m := miniredis.RunT(f)
	if err := minibits.Register(m); err != nil {
		f.Fatal(err)
	}
	c := redis.NewClient(redistest.Options(m.Addr()))
	defer c.Close()
	ctx := context.Background()
	n := 0
	f.Fuzz(func(t *testing.T, init, data []byte) {
		ops := decodeOps(data)
		n++
		key := "k" + strconv.Itoa(n)
		defer m.Del(key)
		exists := len(init) > 0 && init[0]%4 != 0
		var s string
		if exists {
			s = string(init[1:min(len(init), 40)])
			m.Set(key, s)
		}
		wantReply, wantVal, wantExists := model(s, exists, ops)
		got := show(c.Do(ctx, append([]any{"BITFIELD", key}, args(ops)...)...).Result())
		if want := show(wantReply, nil); got != want {
			t.Fatalf("BITFIELD %v on %q\n got  %s\n want %s", args(ops), s, got, want)
		}
		v, err := m.Get(key)
		if gotExists := err == nil; gotExists != wantExists || v != wantVal {
			t.Fatalf("BITFIELD %v on %q: left %q (exists %v), want %q (exists %v)", args(ops), s, v, gotExists, wantVal, wantExists)
		}
	})
}
