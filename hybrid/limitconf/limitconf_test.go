package limitconf_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/hybrid"
	"github.com/fleetlimit/fleetlimit/hybrid/limitconf"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
)

// TestRates: the rates the package doc lists are read per second, and the others fail
// with ErrInvalid.
func TestRates(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64 // 0: an error
	}{
		{"100/s", 100}, {"100/sec", 100}, {"100 / second", 100}, {"60/m", 1}, {"60/min", 1},
		{"3600/h", 1}, {"3600/hour", 1}, {"86400/d", 1}, {"5/10m", 5.0 / 600}, {"1/1h30m", 1.0 / 5400},
		{"10-S", 10}, {"1000-H", 1000.0 / 3600}, {"100-M", 100.0 / 60}, {"5-D", 5.0 / 86400}, {"10-s", 10},
		{"2.5", 2.5}, {"1e3/s", 1000},
		{"", 0}, {"0/s", 0}, {"-1/s", 0}, {"x/s", 0}, {"100/y", 0}, {"100/0s", 0}, {"100/-1s", 0},
		{"NaN", 0}, {"Inf/s", 0}, {"10-X", 0}, {"1e308/1ns", 0},
	} {
		lims, err := limitconf.Parse(fmt.Appendf(nil, `{"limits": [{"name": "a", "rate": %q, "burst": 1, "policy": "open"}]}`, tc.in))
		if tc.want == 0 {
			if !errors.Is(err, limitconf.ErrInvalid) {
				t.Errorf("rate %q: %v, %v; want ErrInvalid", tc.in, lims, err)
			}
			continue
		}
		if err != nil || math.Abs(lims[0].Rate-tc.want) > 1e-12*tc.want {
			t.Errorf("rate %q: %v, %v; want %v", tc.in, lims, err, tc.want)
		}
	}
}

const doc = `{
  "limits": [
    {"name": "api", "rate": "100/s", "burst": 200, "policy": "local", "max_wait": "10ms",
     "pre_rate": "50/s", "pre_burst": 60, "max_cost": 40,
     "tiers": [{"name": "paid", "rate": "1000/s", "burst": 2000, "pre_rate": "500/s", "pre_burst": 600}]},
    {"name": "signup", "rate": "5/h", "burst": 5, "policy": "closed", "dry_run": true, "version": 3},
    {"name": "per-client", "rate": "20/s", "burst": 20, "policy": "open", "mode": "windowed 50ms"},
    {"name": "batch", "rate": "10-S", "burst": 10, "policy": "Open", "mode": "charge-later 100ms",
     "lease": {"refill_interval": "20ms", "lifetime": "2s", "low_watermark": 0.5}, "max_keys": 1000}
  ]
}`

func TestParse(t *testing.T) {
	got, err := limitconf.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := []hybrid.Limit{
		{Name: "api", Rate: 100, Burst: 200, Policy: breaker.FailLocal(), MaxWait: 10 * time.Millisecond,
			PreRate: 50, PreBurst: 60, MaxCost: 40,
			Tiers: []hybrid.Tier{{Name: "paid", Rate: 1000, Burst: 2000, PreRate: 500, PreBurst: 600}}},
		{Name: "signup", Rate: 5.0 / 3600, Burst: 5, Policy: breaker.FailClosed, DryRun: true, Version: 3},
		{Name: "per-client", Rate: 20, Burst: 20, Policy: breaker.FailOpen, Mode: hybrid.Windowed(50 * time.Millisecond)},
		{Name: "batch", Rate: 10, Burst: 10, Policy: breaker.FailOpen, Mode: hybrid.ChargeLater(100 * time.Millisecond),
			Lease: hybrid.LeaseTuning{RefillInterval: 20 * time.Millisecond, Lifetime: 2 * time.Second, LowWatermark: 0.5}, MaxKeys: 1000},
	}
	if len(got) != len(want) {
		t.Fatalf("%d limits, want %d", len(got), len(want))
	}
	for i := range want { // every field: one the parser drops is a limit that does not hold
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("limit %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	// What it reads is a configuration hybrid.New runs.
	_, c := redistest.Mini(t)
	store, err := global.New(c)
	if err != nil {
		t.Fatal(err)
	}
	l, err := hybrid.New(store, hybrid.Config{FleetSize: 1, Limits: got})
	if err != nil {
		t.Fatalf("hybrid.New refused the parsed limits: %v", err)
	}
	_ = l.Close(context.Background())
}

// TestParseErrors: each error wraps ErrInvalid and names the line (and the limit) it
// is about.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"bad rate", "{\"limits\": [\n{\"name\": \"a\", \"rate\": \"1/s\", \"burst\": 1, \"policy\": \"open\"},\n{\"name\": \"b\", \"rate\": \"1/y\", \"burst\": 1, \"policy\": \"open\"}]}",
			`line 3: limit "b": rate "1/y"`},
		{"unknown field", "{\"limits\": [\n{\"name\": \"a\", \"rate\": \"1/s\",\n \"brust\": 1, \"policy\": \"open\"}]}", `line 2: limit "a": json: unknown field "brust"`},
		{"wrong type", "{\"limits\": [\n{\"name\": \"a\", \"rate\": \"1/s\",\n \"burst\": \"1\", \"policy\": \"open\"}]}", `line 3: limit "a": burst: want a whole number`},
		{"syntax", "{\"limits\": [\n{\"name\": \"a\",,}]}", "line 2:"},
		{"no policy", "{\"limits\": [{\"name\": \"a\", \"rate\": \"1/s\", \"burst\": 1}]}", `line 1: limit "a": no policy`},
		{"bad policy", "{\"limits\": [{\"name\": \"a\", \"rate\": \"1/s\", \"burst\": 1, \"policy\": \"fail-open\"}]}", `policy "fail-open"`},
		{"bad mode", "{\"limits\": [{\"name\": \"a\", \"rate\": \"1/s\", \"burst\": 1, \"policy\": \"open\", \"mode\": \"windowed\"}]}", `mode "windowed"`},
		{"bad duration", "{\"limits\": [{\"name\": \"a\", \"rate\": \"1/s\", \"burst\": 1, \"policy\": \"open\", \"max_wait\": 10}]}", `line 1: limit "a": max_wait: want a string`},
		{"bad duration text", "{\"limits\": [{\"name\": \"a\", \"rate\": \"1/s\", \"burst\": 1, \"policy\": \"open\",\n \"lease\": {\"lifetime\": \"10 ms\"}}]}",
			`line 1: limit "a": lease.lifetime "10 ms": a duration as Go writes it`},
		{"limits not an array", `{"limits": {}}`, "limits: want an array"},
		{"a tier's wrong type", "{\"limits\": [{\"name\": \"a\", \"rate\": \"1/s\", \"burst\": 1, \"policy\": \"open\",\n \"tiers\": [{\"name\": \"t\", \"burst\": \"2\"}]}]}",
			`line 2: limit "a": tiers.burst: want a whole number`},
		{"no name", "{\"limits\": [{\"rate\": \"1/s\", \"burst\": 1, \"policy\": \"open\"}]}", "line 1: no name"},
		{"no limits", `{"limits": []}`, "no limits"},
		{"unknown top-level field", `{"limit": []}`, `unknown field "limit"`},
		{"trailing text", `{"limits": [{"name": "a", "rate": "1/s", "burst": 1, "policy": "open"}]} x`, "more after the document"},
		{"bad tier", "{\"limits\": [{\"name\": \"a\", \"rate\": \"1/s\", \"burst\": 1, \"policy\": \"open\",\n \"tiers\": [{\"name\": \"t\", \"rate\": \"fast\"}]}]}", `tier "t": rate "fast"`},
	} {
		_, err := limitconf.Parse([]byte(tc.doc))
		if !errors.Is(err, limitconf.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want ErrInvalid saying %q", tc.name, err, tc.want)
		}
	}
}

// TestLoad: a file with ${VAR} from the environment, and a document in a variable; an
// unset variable is an error.
func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.json")
	if err := os.WriteFile(path, []byte(`{"limits": [{"name": "api", "rate": "${API_RATE}", "burst": ${API_BURST}, "policy": "open"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("API_RATE", "50/s")
	t.Setenv("API_BURST", "100")
	got, err := limitconf.Load(path)
	if err != nil || len(got) != 1 || got[0].Rate != 50 || got[0].Burst != 100 {
		t.Fatalf("Load = %+v, %v", got, err)
	}
	t.Setenv("LIMITS", `{"limits": [{"name": "api", "rate": "1/s", "burst": 1, "policy": "closed"}]}`)
	if got, err := limitconf.LoadEnv("LIMITS"); err != nil || len(got) != 1 || got[0].Policy != breaker.FailClosed {
		t.Fatalf("LoadEnv = %+v, %v", got, err)
	}
	os.Unsetenv("API_BURST")
	if _, err := limitconf.Load(path); !errors.Is(err, limitconf.ErrInvalid) || !strings.Contains(err.Error(), "API_BURST") {
		t.Fatalf("Load with API_BURST unset: %v, want ErrInvalid naming it", err)
	}
	if _, err := limitconf.LoadEnv("FLEETLIMIT_NOT_SET_ANYWHERE"); !errors.Is(err, limitconf.ErrInvalid) {
		t.Fatalf("LoadEnv of an unset variable: %v", err)
	}
}

// FuzzParse: whatever the document, Parse returns limits or an error wrapping
// ErrInvalid, and never panics.
func FuzzParse(f *testing.F) {
	f.Add(doc)
	f.Add(`{"limits": [{"name": "a", "rate": "10-S", "burst": 1, "policy": "open", "mode": "charge-later 1s"}]}`)
	f.Add(`{"limits": [{}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		limits, err := limitconf.Parse([]byte(s))
		if err != nil {
			if !errors.Is(err, limitconf.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for _, l := range limits {
			if l.Name == "" || !(l.Rate > 0) || math.IsInf(l.Rate, 0) {
				t.Fatalf("parsed %+v: no name or a bad rate", l)
			}
		}
	})
}
