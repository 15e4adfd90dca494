package sim

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// same reports whether two results are identical but for wall time.
func same(a, b Result) bool {
	a.WallMS, b.WallMS = 0, 0
	return reflect.DeepEqual(a, b)
}

// TestRunIsDeterministic runs each strategy twice on a small fleet: the results must be
// identical, so every figure of the tables can be reproduced from its seed.
func TestRunIsDeterministic(t *testing.T) {
	t.Parallel() // beside the other long tests of the package: two cores stay busy
	sc := Scenario{Name: "det", Servers: 20, Duration: time.Second, Rate: 2000, Burst: 200, Demand: 3000,
		Keys: 10, Balancer: Skewed, Policy: FailLocal, Outage: Window{Start: 300 * time.Millisecond, End: 500 * time.Millisecond},
		Churn: []Change{{At: 600 * time.Millisecond, Servers: 15}, {At: 800 * time.Millisecond, Servers: 25}}}
	for _, st := range []Strategy{Naive, Script, ScriptCallerClock, Hybrid, LocalOnly} {
		a := runTwice(t, sc, st)
		sc2 := sc
		sc2.Seed = 2
		c, err := Run(t, sc2, st)
		if err != nil {
			t.Fatal(err)
		}
		if same(a, c) {
			t.Errorf("%s: seeds 1 and 2 gave identical results; the seed is not used", st)
		}
	}
}

// runTwice runs sc under st twice, fails t unless the two results are the same, and
// returns the first.
func runTwice(t *testing.T, sc Scenario, st Strategy) Result {
	t.Helper()
	a, err := Run(t, sc, st)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(t, sc, st)
	if err != nil {
		t.Fatal(err)
	}
	if !same(a, b) {
		t.Errorf("%s: two runs of the same seed differ:\n%+v\n%+v", st, a, b)
	}
	return a
}

// TestModelRunsMatchMiniredis runs the hybrid strategies on the same small scenarios
// twice: once with the real scripts on miniredis and once on the Go model. Every figure
// must be identical, which is what licenses GoModel for the built-in suites at full scale
// (fullScale; with -long they run on miniredis). The scenarios take every script path a
// suite takes: leases and refunds, outages, partitions, starved servers, churn with
// heartbeats, a server's fast clock, reservations' claims, limit changes (versions),
// several limits at once, and charge-later's charges and low-key exchanges.
func TestModelRunsMatchMiniredis(t *testing.T) {
	t.Parallel() // beside the other long tests of the package: two cores stay busy
	base := Scenario{Servers: 20, Duration: 2 * time.Second, Rate: 2000, Burst: 200, Demand: 3000, Policy: FailLocal}
	many := base
	many.Name, many.Keys, many.Rate, many.Burst, many.Demand = "many", 100, 20, 20, 2000
	outage := base
	outage.Name, outage.Outage = "outage", Window{Start: 500 * time.Millisecond, End: time.Second}
	churn := base
	churn.Name, churn.Churn = "churn", []Change{{At: 500 * time.Millisecond, Servers: 12}, {At: time.Second, Servers: 30}}
	partition := base
	partition.Name, partition.Partition, partition.PartitionServers = "partition", outage.Outage, 10
	// Half the servers starved, their answers read late: takes granted and never read.
	starved := base
	starved.Name, starved.Starve, starved.StarvedServers = "starved", Window{Start: 500 * time.Millisecond, End: time.Second}, 10
	starved.StarveRun, starved.StarvePeriod = 300*time.Microsecond, 24*time.Millisecond
	heartbeat := churn
	heartbeat.Name, heartbeat.Heartbeat = "heartbeat", 500*time.Millisecond
	fast := base
	fast.Name, fast.FastServer, fast.FastBy = "fast-server", 0, 2*time.Second
	// Ten times the limit, every request a reservation: the denied ones claim.
	reserve := base
	reserve.Name, reserve.Rate, reserve.Burst, reserve.Demand, reserve.Reserve = "reservations", 100, 100, 1000, true
	change := base
	change.Name = "limit-change"
	change.LimitChanges = []LimitChange{{At: 400 * time.Millisecond, Spread: time.Second, Rate: 1000, Burst: 100}}
	several := many
	several.Name = "several-limits"
	several.AlsoLimits = []AlsoLimit{{Name: "global", Rate: 500, Burst: 500, Keys: 1}, {Name: "tenant", Rate: 100, Burst: 100, Keys: 10}}
	async := many
	async.Name = "many-async"
	base.Name = "hot"
	for _, sc := range []Scenario{base, many, outage, partition, churn, starved, heartbeat, fast, reserve, change, several, async} {
		st := Hybrid
		if sc.Name == "many-async" {
			st = HybridAsync
		}
		t.Run(sc.Name, func(t *testing.T) {
			lua, err := Run(t, sc, st)
			if err != nil {
				t.Fatal(err)
			}
			sc.GoModel = true
			mod, err := Run(t, sc, st)
			if err != nil {
				t.Fatal(err)
			}
			if lua.RedisCalls == 0 {
				t.Fatal("no Redis calls: the comparison proves nothing")
			}
			if sc.Reserve && lua.Sources[srcReserved.String()] == 0 {
				t.Fatal("no request admitted by a claim: the reservations' path was not taken")
			}
			if u := lua.Starve; sc.StarvedServers > 0 && (u == nil || u.StarvedTimeouts == 0 || u.GrantsReadLate == 0) {
				t.Fatalf("no grant answered after its deadline: the starved servers' path was not taken (%+v)", u)
			}
			if !same(lua, mod) {
				t.Errorf("miniredis and the Go model disagree:\nlua   %+v\nmodel %+v", lua, mod)
			}
		})
	}
}

// TestBreakerTimeout: a breaker made with a zero Timeout sets each call's deadline timer
// breakerTimeout after its start, so the scenarios' default deadline is the breaker's.
func TestBreakerTimeout(t *testing.T) {
	var c timerClock
	b, err := breaker.New(breaker.Settings{Clock: &c})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Do(context.Background(), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if c.d != breakerTimeout {
		t.Errorf("the breaker's call deadline is %v after its start; breakerTimeout is %v", c.d, breakerTimeout)
	}
}

// timerClock is a breaker.Clock at a fixed instant that records the duration of the last
// timer set and never fires it.
type timerClock struct{ d time.Duration }

func (*timerClock) Now() time.Time { return time.Unix(0, 0) }

func (c *timerClock) AfterFunc(d time.Duration, _ func()) func() bool {
	c.d = d
	return func() bool { return true }
}

func TestScenarioValidation(t *testing.T) {
	ok := Scenario{Name: "v", Rate: 10, Burst: 10, Demand: 10, Policy: FailClosed}
	cases := []struct {
		name string
		edit func(*Scenario)
	}{
		{"zero rate", func(s *Scenario) { s.Rate = 0 }},
		{"NaN demand", func(s *Scenario) { s.Demand = nan() }},
		{"burst 0", func(s *Scenario) { s.Burst = 0 }},
		{"cost over burst", func(s *Scenario) { s.Cost = 11 }},
		{"jitter over rtt", func(s *Scenario) { s.RTT, s.Jitter = time.Millisecond, 2*time.Millisecond }},
		{"zipf s 1", func(s *Scenario) { s.Keys, s.ZipfS = 10, 1 }},
		{"unknown policy", func(s *Scenario) { s.Policy = "maybe" }},
		{"no policy", func(s *Scenario) { s.Policy = "" }},
		{"fast server outside", func(s *Scenario) { s.FastBy, s.FastServer = time.Second, 500 }},
		{"empty fleet", func(s *Scenario) { s.Churn = []Change{{At: time.Second, Servers: 0}} }},
		{"starved servers without a window", func(s *Scenario) { s.StarvedServers, s.StarveRun, s.StarvePeriod = 1, 1, 2 }},
		{"starvation without servers", func(s *Scenario) { s.Starve, s.StarveRun, s.StarvePeriod = Window{End: time.Second}, 1, 2 }},
		{"starvation without a schedule", func(s *Scenario) { s.Starve, s.StarvedServers = Window{End: time.Second}, 1 }},
		{"starved run over period", func(s *Scenario) {
			s.Starve, s.StarvedServers, s.StarveRun, s.StarvePeriod = Window{End: time.Second}, 1, 2*time.Millisecond, time.Millisecond
		}},
		{"schedule without a starvation", func(s *Scenario) { s.StarveRun, s.StarvePeriod = 1, 2 }},
		{"more starved servers than the fleet", func(s *Scenario) {
			s.Starve, s.StarvedServers, s.StarveRun, s.StarvePeriod = Window{End: time.Second}, 201, 1, 2
		}},
		{"starvation and outage", func(s *Scenario) {
			s.Starve, s.StarvedServers, s.StarveRun, s.StarvePeriod = Window{End: time.Second}, 1, 1, 2
			s.Outage = Window{End: time.Second}
		}},
	}
	for _, c := range cases {
		sc := ok
		c.edit(&sc)
		if _, err := Run(t, sc, Script); !errors.Is(err, ErrInvalidScenario) {
			t.Errorf("%s: err = %v, want ErrInvalidScenario", c.name, err)
		}
	}
	if _, err := Run(t, ok, "carrier pigeon"); !errors.Is(err, ErrInvalidScenario) {
		t.Errorf("unknown strategy: err = %v", err)
	}
	if _, err := Run(t, ok, Script); err != nil {
		t.Errorf("valid scenario: %v", err)
	}
}

func nan() float64 { var z float64; return z / z }

// TestNaiveRacesAsTheArticleTrace replays the source article's trace: two servers share a
// bucket with one token; both read it before either writes. The naive read-modify-write
// admits both requests; the seed script, one.
func TestNaiveRacesAsTheArticleTrace(t *testing.T) {
	sc := Scenario{Name: "trace", Servers: 2, Duration: 100 * time.Microsecond, Jitter: -1,
		Rate: 0.001, Burst: 1, Demand: 20000, Policy: FailLocal} // two requests within 0.1 ms: both read first
	want := map[Strategy]int64{Naive: 2, Script: 1}
	for st, n := range want {
		r, err := Run(t, sc, st)
		if err != nil {
			t.Fatal(err)
		}
		if r.Requests != 2 || r.Admitted+r.AdmittedLate != n {
			t.Errorf("%s: %d requests, %d admitted; want 2 requests, %d admitted", st, r.Requests, r.Admitted+r.AdmittedLate, n)
		}
	}
}

// TestPercentile: the value of rank p·n rounded to the nearest integer, at least the
// first and at most the last: p = 1 is the slowest decision (Result.MaxDecisionUS, which
// the checks bound).
func TestPercentile(t *testing.T) {
	us := func(n int) []time.Duration {
		s := make([]time.Duration, n)
		for i := range s {
			s[i] = time.Duration(i+1) * time.Microsecond // rank i+1 holds i+1 µs
		}
		return s
	}
	for _, tc := range []struct {
		n    int
		p    float64
		want float64
	}{
		{0, 0.5, 0}, {1, 0.5, 1}, {1, 1, 1}, {2, 0.5, 1}, {2, 1, 2},
		{99, 0.5, 50}, {99, 0.99, 98}, {99, 1, 99},
		{101, 0.5, 51}, {101, 0.99, 100}, {150, 0.99, 149}, {150, 1, 150},
		{160, 0.99, 158}, // 158.4: one rank below nearest rank's 159
	} {
		if got := percentile(us(tc.n), tc.p); got != tc.want {
			t.Errorf("percentile of %d at %v = %v, want %v", tc.n, tc.p, got, tc.want)
		}
	}
}
