package main

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestNum(t *testing.T) {
	for _, c := range []struct {
		v    float64
		dec  int
		want string
	}{
		{0, 0, "0"}, {999, 0, "999"}, {1000, 0, "1,000"}, {2849043.4, 0, "2,849,043"},
		{-1234.5, 1, "-1,234.5"}, {0.99949, 3, "0.999"}, {math.NaN(), 2, "–"},
	} {
		if got := num(c.v, c.dec); got != c.want {
			t.Errorf("num(%v, %d) = %q, want %q", c.v, c.dec, got, c.want)
		}
	}
	for v, want := range map[float64]string{0: "0", 123.4: "123", 17.14: "17.1", 6.031: "6.03", 0.0427: "0.043", 0.00041: "0.00041"} {
		if got := sig(v); got != want {
			t.Errorf("sig(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestMedian(t *testing.T) {
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median of 3 = %v, want 2", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median of 4 = %v, want 2.5", got)
	}
	if got := median(nil); !math.IsNaN(got) {
		t.Errorf("median of none = %v, want NaN", got)
	}
}

// sample is two repeats of one hot-key row and one Zipf row.
func sample() (Env, []Run) {
	env := Env{Date: "2026-01-02 03:04 UTC", Command: "cd bench && go run ./cmd/compare", CPUs: 2, GoVersion: "go1.26",
		RedisVersion: "7.0.15", Modules: map[string]string{"github.com/go-redis/redis_rate/v10": "v10.0.1"}, DurationS: 2, Repeats: 2}
	hot := Run{Rival: "redis_rate", Scenario: "hot key", Goroutines: 1, Rate: 2000, Burst: 2000, Keys: 1, ElapsedS: 2,
		Admitted: 6000, Denied: 34000, Mallocs: 800000, P50Ns: 30000, P99Ns: 90000, RoundTrips: 40000, RedisCalls: 130000,
		Commands: map[string]int64{"evalsha": 40000}, RedisCPUS: 0.8}
	hot2 := hot
	hot2.Repeat, hot2.Admitted, hot2.Denied, hot2.Failed, hot2.FirstError = 2, 6060, 33900, 40, "boom"
	zipf := Run{Rival: "redis_rate", Scenario: "zipf 10k", Goroutines: 32, Rate: 1e6, Burst: 1e6, Keys: 10000, WarmupS: 1,
		ElapsedS: 2, Admitted: 50000, RoundTrips: 50000, RedisCalls: 200000, RedisCPUS: 1}
	return env, []Run{hot, hot2, zipf}
}

func TestRowsTakeMediansAndWorstCases(t *testing.T) {
	_, runs := sample()
	rs := rows(runs, map[string]bool{"redis_rate": true})
	if len(rs) != 2 {
		t.Fatalf("%d rows, want 2", len(rs))
	}
	hot := rs[0]
	if want := (40000.0 + 39960.0) / 2 / 2; hot.DecPerS != want {
		t.Errorf("decisions/s = %v, want %v", hot.DecPerS, want)
	}
	if want := 6060.0 / 6000; math.Abs(hot.AdmBound-want) > 1e-12 {
		t.Errorf("admitted/bound = %v, want the worst repeat's %v", hot.AdmBound, want)
	}
	if want := 40.0 / 40000; hot.FailShare != want || hot.FirstError != "boom" {
		t.Errorf("fail share %v, first error %q; want %v, boom", hot.FailShare, hot.FirstError, want)
	}
	if z := rs[1]; !math.IsNaN(z.AdmBound) || z.AdmReq != 1 || z.CPUDec != 20 {
		t.Errorf("zipf row: bound %v, admitted/requested %v, CPU µs/decision %v; want NaN, 1, 20", z.AdmBound, z.AdmReq, z.CPUDec)
	}
}

func TestRawRoundTripAndReport(t *testing.T) {
	env, runs := sample()
	var raw bytes.Buffer
	if err := writeRaw(&raw, env, runs); err != nil {
		t.Fatal(err)
	}
	env2, runs2, err := readRaw(&raw)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(env, env2) || !reflect.DeepEqual(runs, runs2) {
		t.Fatalf("raw output does not read back as written:\n%+v\n%+v", runs, runs2)
	}
	var md bytes.Buffer
	if err := writeMarkdown(&md, env2, rivals(), runs2, "benchmarks/compare.png"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"cd bench && go run ./cmd/compare",
		"| redis_rate | 1 | 19,990 | 20.0 | 30.0 | 90.0 | 3.25 | 1.00 | 20.0 | 1.010 | 0.1% |",
		"`github.com/go-redis/redis_rate/v10` v10.0.1",
		"redis_rate, hot key, 1 goroutine: admitted 1.010 × the bound",
		"![decisions per second and Redis CPU per decision](benchmarks/compare.png)",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
	var png bytes.Buffer
	if err := writePlot(&png, rivals(), runs2); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png.Bytes(), []byte("\x89PNG")) {
		t.Error("the plot is not a PNG")
	}
}
