package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// readScenario reads a user's scenario from a JSON file (see Scenario.UnmarshalJSON),
// names it after the file when it has no Name, and validates it as Run would.
func readScenario(path string) (Scenario, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !filepath.IsAbs(path) {
		return Scenario{}, fmt.Errorf("%w (a relative path is taken from sim/, the package's directory)", err)
	}
	if err != nil {
		return Scenario{}, err
	}
	var sc Scenario
	if err := json.Unmarshal(b, &sc); err != nil {
		return Scenario{}, fmt.Errorf("%s: %w", path, err)
	}
	if sc.Name == "" {
		sc.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	if _, err := sc.withDefaults(); err != nil {
		return Scenario{}, fmt.Errorf("%s: %w", path, err)
	}
	return sc, nil
}

// userSuite runs a user's scenario under each strategy the simulator compares: the naive
// read-modify-write, the seed script, hybrid under the scenario's policy and local-only.
// With a server whose clock is fast it adds the script that trusts the caller's clock,
// which is what that fault does to it. With a Redis outage it leaves out the per-request
// strategies, as the built-in redis-outage suite does: the simulator gives them no
// deadline and no policy, so their requests would wait out the outage undecided; note
// says so. A partition or a starvation acts on the hybrid strategy's servers only; note
// says that too.
func userSuite(sc Scenario) (s suite, note string) {
	s.name = sc.Name
	switch {
	case sc.Partition.End > sc.Partition.Start:
		note = "only the hybrid strategy's servers are cut off by the partition: naive, script and local-only run as if every server reached Redis"
	case sc.Starve.End > sc.Starve.Start:
		note = "only the hybrid strategy's servers are starved: naive, script and local-only run as if every server had its CPU"
	}
	if w := sc.Outage; w.End > w.Start {
		note = "naive and script are not run: during a Redis outage the simulator gives them no deadline and no failure policy"
	} else {
		s.runs = []run{{sc: sc, st: Naive}, {sc: sc, st: Script}}
		if sc.FastBy != 0 {
			s.runs = append(s.runs, run{sc: sc, st: ScriptCallerClock})
		}
	}
	s.runs = append(s.runs, run{label: "hybrid " + string(sc.Policy), sc: sc, st: Hybrid}, run{sc: sc, st: LocalOnly})
	return s, note
}

// shrink makes a scenario quicker with the same shape: a tenth of the fleet (churn
// included) and a fifth of the time (outage and churn instants included).
func shrink(sc Scenario) Scenario {
	sc.Servers = max(sc.Servers/10, 1)
	t := func(d time.Duration) time.Duration { return d / 5 }
	sc.Duration, sc.Outage.Start, sc.Outage.End = t(sc.Duration), t(sc.Outage.Start), t(sc.Outage.End)
	sc.Churn = slices.Clone(sc.Churn)
	for i := range sc.Churn {
		sc.Churn[i].At, sc.Churn[i].Servers = t(sc.Churn[i].At), max(sc.Churn[i].Servers/10, 1)
	}
	return sc
}

// TestExampleScenario runs the shipped example file as -scenario does, shrunk, and
// checks what the report says of it: one row per strategy, named after the scenario.
func TestExampleScenario(t *testing.T) {
	t.Parallel() // beside the other long tests of the package: two cores stay busy
	sc, err := readScenario("testdata/example.json")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name != "api-keys" || sc.Policy != FailLocal || sc.RTT != 800*time.Microsecond ||
		sc.Outage != (Window{Start: 6 * time.Second, End: 8 * time.Second}) ||
		!slices.Equal(sc.Churn, []Change{{At: 3 * time.Second, Servers: 100}, {At: 4 * time.Second, Servers: 120}}) {
		t.Fatalf("testdata/example.json decoded as %+v", sc)
	}
	s, note := userSuite(shrink(sc))
	if note == "" {
		t.Error("a scenario with an outage runs the per-request strategies without saying they are left out")
	}
	ss := []suite{s}
	all := runFleet(t, ss, false)
	path := filepath.Join(t.TempDir(), "report.jsonl")
	if err := writeReport(path, ss, all); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var strategies []string
	for line := range strings.Lines(string(b)) {
		var r Result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		strategies = append(strategies, r.Strategy)
		if r.Scenario != "api-keys" || r.Requests == 0 || r.Admitted == 0 || r.Outage == nil || r.Keys != 2000 {
			t.Errorf("%s: scenario %q, %d requests, %d admitted, outage %v, %d keys",
				r.Strategy, r.Scenario, r.Requests, r.Admitted, r.Outage, r.Keys)
		}
	}
	if want := []string{"hybrid fail-local", "local-only"}; !slices.Equal(strategies, want) {
		t.Errorf("report rows %v, want %v", strategies, want)
	}
}

// TestUserSuiteStrategies: without an outage a user's scenario runs under every strategy,
// and under the caller-clock script too when a server's clock is fast.
func TestUserSuiteStrategies(t *testing.T) {
	names := func(s suite) []string {
		var out []string
		for _, r := range s.runs {
			out = append(out, r.name())
		}
		return out
	}
	sc := Scenario{Name: "u", Rate: 10, Burst: 10, Policy: FailOpen}
	s, note := userSuite(sc)
	if want := []string{"naive", "script", "hybrid fail-open", "local-only"}; !slices.Equal(names(s), want) || note != "" || s.name != "u" {
		t.Errorf("runs %v (note %q), want %v", names(s), note, want)
	}
	sc.FastBy = time.Second
	s, _ = userSuite(sc)
	if want := []string{"naive", "script", "script-caller-clock", "hybrid fail-open", "local-only"}; !slices.Equal(names(s), want) {
		t.Errorf("with a fast server: runs %v, want %v", names(s), want)
	}
	sc.FastBy = 0
	sc.Starve, sc.StarvedServers = Window{End: time.Second}, 1
	if s, note = userSuite(sc); !strings.Contains(note, "only the hybrid strategy's servers are starved") || len(s.runs) != 4 {
		t.Errorf("with a starvation: runs %v, note %q; want every strategy and a note that only hybrid is starved", names(s), note)
	}
}

// TestScenarioFileRejects: a file that does not describe a valid scenario is an error
// that names the file and what is wrong with it.
func TestScenarioFileRejects(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ name, json, want string }{
		{"unknown field", `{"Rate": 10, "Burst": 10, "Policy": "fail-open", "Limit": 5}`, `unknown field "Limit"`},
		{"nested unknown field", `{"Rate": 10, "Burst": 10, "Policy": "fail-open", "Outage": {"From": "1s"}}`, `Outage: unknown field "From"`},
		{"bad duration", `{"Rate": 10, "Burst": 10, "Policy": "fail-open", "Duration": "ten seconds"}`, `Duration: "ten seconds" is not a duration`},
		{"duration as a number", `{"Rate": 10, "Burst": 10, "Policy": "fail-open", "RTT": 500}`, `RTT: want a duration string`},
		{"bad churn instant", `{"Rate": 10, "Burst": 10, "Policy": "fail-open", "Churn": [{"At": "1s", "Servers": 5}, {"At": "-", "Servers": 5}]}`, `Churn[1].At: "-" is not a duration`},
		{"missing policy", `{"Rate": 10, "Burst": 10}`, `no failure policy: choose`},
		{"unknown policy", `{"Rate": 10, "Burst": 10, "Policy": "fail-maybe"}`, `unknown policy "fail-maybe"`},
		{"invalid", `{"Rate": 10, "Burst": 0, "Policy": "fail-open"}`, `burst 0 must be at least 1`},
		{"not JSON", `{"Rate": 10,`, `unexpected end of JSON input`},
	}
	for _, c := range cases {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".json")
		if err := os.WriteFile(path, []byte(c.json), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := readScenario(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: err = %v, want one naming %s and containing %q", c.name, err, path, c.want)
		}
	}
	if _, err := readScenario("testdata/no-such-file.json"); err == nil || !strings.Contains(err.Error(), "taken from sim/") {
		t.Errorf("a missing relative path: err = %v, want one that says where relative paths start", err)
	}
	unnamed := filepath.Join(dir, "my-fleet.json")
	if err := os.WriteFile(unnamed, []byte(`{"Rate": 10, "Burst": 10, "Policy": "fail-closed"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if sc, err := readScenario(unnamed); err != nil || sc.Name != "my-fleet" {
		t.Errorf("a scenario without a Name: %q, %v; want it named after its file, my-fleet", sc.Name, err)
	}
}

// TestShippedScenariosValid: every scenario file docs/simulation.md points to reads as a
// valid scenario, so its commands run.
func TestShippedScenariosValid(t *testing.T) {
	files, err := filepath.Glob("testdata/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files in testdata (%v)", err)
	}
	for _, f := range files {
		if _, err := readScenario(f); err != nil {
			t.Error(err)
		}
	}
}

// TestScenarioFieldsDocumented: every field a scenario file may set has its row in
// docs/simulation.md's table of them.
func TestScenarioFieldsDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/simulation.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## Modelling your own fleet")
	if start < 0 {
		t.Fatal(`docs/simulation.md has no section "Modelling your own fleet"`)
	}
	section, _, _ := strings.Cut(doc[start+1:], "\n## ")
	documented := map[string]bool{} // the fields named in the first cell of a row
	for _, line := range strings.Split(section, "\n") {
		if first, ok := strings.CutPrefix(line, "| "); ok {
			first, _, _ = strings.Cut(first, " |")
			for _, name := range strings.Split(first, ", ") {
				documented[strings.Trim(name, "`")] = true
			}
		}
	}
	for _, f := range fieldsOf(scenarioType) {
		if !documented[f.name] {
			t.Errorf("Scenario.%s has no row in docs/simulation.md, Modelling your own fleet", f.name)
		}
	}
}
