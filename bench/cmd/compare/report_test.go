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
		Admitted: 6000, Denied: 34000, Mallocs: 800000, P50Ns: 30000, P99Ns: 90000, RoundTrips: 40000, CommandsSent: 40000, ScriptRuns: 40000, RedisCalls: 130000,
		Commands: map[string]int64{"evalsha": 40000}, RedisCPUS: 0.8}
	hot2 := hot
	hot2.Repeat, hot2.Admitted, hot2.Denied, hot2.Failed, hot2.FirstError = 2, 6060, 33900, 40, "boom"
	zipf := Run{Rival: "redis_rate", Scenario: "zipf 10k", Goroutines: 32, Rate: 1e6, Burst: 1e6, Keys: 10000, WarmupS: 1,
		ElapsedS: 2, Admitted: 50000, RoundTrips: 50000, RedisCalls: 200000, RedisCPUS: 1}
	return env, []Run{hot, hot2, zipf}
}

func TestRowsTakeMediansAndWorstCases(t *testing.T) {
	_, runs := sample()
	rs := rows(runs, map[string]func(Run) float64{"redis_rate": Run.Bound})
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
	reportHas(t, env2, runs2, "benchmarks/compare.png",
		"cd bench && go run ./cmd/compare",
		"| redis_rate | 1 | 19,990 | 20.0 | 30.0 | 90.0 | 1.00 | 1.00 | 1.00 | 3.25 | 20.0 | 1.010 | 0.1% |",
		"`github.com/go-redis/redis_rate/v10` v10.0.1",
		"redis_rate, hot key, 1 goroutine: admitted 1.010 × what it is held to in its worst repeat (1.010 × burst + rate·T)",
		"![decisions per second and Redis CPU per decision](benchmarks/compare.png)")
	var png bytes.Buffer
	if err := writePlot(&png, rivals(), runs2); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png.Bytes(), []byte("\x89PNG")) {
		t.Error("the plot is not a PNG")
	}
}

// fleetSample is one repeat of redis_rate and every kind of fleetlimit on 1 and 8
// servers on the Zipf keys with 32 goroutines, and a windowed hot-key row over
// burst + rate·T but within what the kind is held to.
func fleetSample() (Env, []Run) {
	env, _ := sample()
	zipf := func(rival string, decisions int64, cpuS float64, cmds, scripts int64) Run {
		return Run{Rival: rival, Scenario: "zipf 10k", Goroutines: 32, Repeat: 1, Rate: 1e6, Burst: 1e6, Keys: 10000, WarmupS: 1,
			ElapsedS: 2, Admitted: decisions, CommandsSent: cmds, ScriptRuns: scripts, RoundTrips: cmds, RedisCalls: 4 * scripts, RedisCPUS: cpuS,
			CloseCommands: scripts / 10, CloseScripts: scripts / 10, CloseCPUS: cpuS / 10}
	}
	runs := []Run{
		zipf("redis_rate", 100000, 2, 100000, 100000),
		zipf("fleetlimit bucket, 1 server", 400000, 1, 40000, 40000),
		zipf("fleetlimit bucket, 8 servers", 150000, 1.5, 90000, 90000),
		zipf("fleetlimit charge-later, 1 server", 400000, 1.1, 41000, 41000),
		zipf("fleetlimit charge-later, 8 servers", 150000, 1.6, 92000, 92000),
		zipf("fleetlimit windowed, 1 server", 1000000, 0.2, 1000, 0),
		zipf("fleetlimit windowed, 8 servers", 600000, 0.3, 3000, 0),
		{Rival: "fleetlimit windowed, 8 servers", Scenario: "hot key", Goroutines: 1, Repeat: 1, Rate: 2000, Burst: 2000, Keys: 1,
			ElapsedS: 2, Admitted: 8000, Denied: 1000000},
	}
	return env, runs
}

func TestPerClientChoosesTheLeastRedisCPU(t *testing.T) {
	env, runs := fleetSample()
	reportHas(t, env, runs, "",
		"**For per-client keys, choose the windowed kind.**",
		"there the windowed kind spends 0.500 µs a decision, 1/40.0 of redis_rate's (20.0 µs)",
		"the bucket kind 10.0 µs (1/2.00 of redis_rate's; 0.600 commands, 0.600 script runs)",
		"On one server too the windowed kind spends least: 0.200 µs a decision, 1/100 of redis_rate's.",
		"The charge-later kind spends about what the bucket does",
		"| fleetlimit windowed, 8 servers | 32 | 300,000 | 0.500 | 1/40.0 | 0.050 | 0.005 | 0 | 0.005 | 0 |",
		"| fleetlimit windowed, 8 servers | 32 | 300,000 | 0 | 0 | 0 | 0.005 | 0 | 0.005 | 0 | 0.500 | 1.0000 | 0 |",
		// 8,000 admitted against burst + rate·T = 6,000, and against 2·burst + rate·T + S·c = 10,000.
		"fleetlimit windowed, 8 servers, hot key, 1 goroutine: admitted 1.333 × burst + rate·T in its worst repeat, 0.800 × what its kind is held to",
		"so every kind runs both scenarios as specified")
}

// reportHas checks that the report of env and runs holds every line of want.
func reportHas(t *testing.T, env Env, runs []Run, plotFile string, want ...string) {
	t.Helper()
	var md bytes.Buffer
	if err := writeMarkdown(&md, env, rivals(), runs, plotFile); err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !strings.Contains(md.String(), w) {
			t.Errorf("report lacks %q:\n%s", w, md.String())
		}
	}
}

func TestWindowedUnfit(t *testing.T) {
	var w kind
	for _, k := range kinds {
		if k.Name == "windowed" {
			w = k
		}
	}
	for _, c := range []struct {
		s    spec
		want string
	}{
		{spec{Rate: 2000, Burst: 2000}, ""},
		{spec{Rate: 1_000_000, Burst: 1_000_000}, ""},
		{spec{Rate: 1 << 31, Burst: 1 << 31}, "windowed limit's largest"},
		{spec{Rate: 100, Burst: 1}, "is not from"},
		{spec{Rate: 1000, Burst: 200}, "over half its window"},
	} {
		got := w.unfit(c.s)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("unfit(%+v) = %q, want one saying %q", c.s, got, c.want)
		}
	}
}
