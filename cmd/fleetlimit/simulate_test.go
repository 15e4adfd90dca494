package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSimulate runs a small scenario file through the simulator, as an operator would,
// and opens the page it writes: a table row per strategy, the simulator's own table and
// both plots (admissions and, with an outage, the breakers) inlined.
func TestSimulate(t *testing.T) {
	out := filepath.Join(t.TempDir(), "page")
	var stdout, stderr bytes.Buffer
	// FILE after the flags here, before them in TestSimulateRejects.
	code := run(context.Background(), []string{"simulate", "-out", out, "testdata/tiny.json"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	index := filepath.Join(out, "index.html")
	if got := strings.TrimSpace(stdout.String()); got != index {
		t.Errorf("printed %q, want the page's path %q", got, index)
	}
	b, err := os.ReadFile(index)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	if n := strings.Count(page, "<svg"); n != 2 {
		t.Errorf("%d plots in the page, want 2 (admissions and breakers)", n)
	}
	for _, s := range []string{
		`<section id="tiny">`, "<td>hybrid fail-local</td>", "<td>local-only</td>",
		"4 servers, one key, limit 200/s and burst 50 per key",
		"adm/limit", // the simulator's own table, under the HTML one
		"Redis down 800ms-1.3s",
		"tiny: admitted per second",
	} {
		if !strings.Contains(page, s) {
			t.Errorf("the page does not hold %q", s)
		}
	}
	// The page reads the report into types of its own: its field names must be the
	// simulator's, which a row of zeros would hide.
	rb, err := os.ReadFile(filepath.Join(out, "report.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var first map[string]any
	if err := json.Unmarshal(bytes.SplitN(rb, []byte("\n"), 2)[0], &first); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"admitted_over_limit", "hottest_key_over_bound", "redis_calls_per_request", "redis_round_trips_per_request"} {
		v, ok := first[field].(float64)
		if cell := fmt.Sprintf(`<td class="n">%.4f</td>`, v); !ok || v == 0 || !strings.Contains(page, cell) {
			t.Errorf("report field %s = %v: the page has no cell %s", field, first[field], cell)
		}
	}
	for _, f := range []string{"report.jsonl", "tiny.svg", "tiny-breakers.svg"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}

// TestSimulateRejects: what is not a scenario, and a call without what it needs, end with
// a message that says which, and a usage error with status 2.
func TestSimulateRejects(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	notJSON := write("notjson.json", "Servers: 4\n")
	array := write("array.json", `[{"Servers": 4}]`)
	unknown := write("unknown.json", `{"Servers": 4, "Duration": "1s", "Rate": 10, "Burst": 10, "Demand": 20, "Serverz": 3}`)
	notSource := t.TempDir()
	out := filepath.Join(dir, "out")
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no file", []string{"-out", out}, 2, "usage: fleetlimit simulate FILE"},
		{"no -out", []string{unknown}, 2, "usage: fleetlimit simulate FILE"},
		{"two files", []string{unknown, "-out", out, array}, 2, "usage: fleetlimit simulate FILE"},
		{"no time", []string{unknown, "-out", out, "-timeout", "0s"}, 2, "want a positive duration"},
		{"missing file", []string{filepath.Join(dir, "none.json"), "-out", out}, 1, "no such file"},
		{"not JSON", []string{notJSON, "-out", out}, 1, "is not a scenario"},
		{"a JSON array", []string{array, "-out", out}, 1, "is not a scenario"},
		{"not the source", []string{unknown, "-out", out, "-src", notSource}, 1, "is not fleetlimit's source"},
		{"unknown field", []string{unknown, "-out", out}, 1, "Serverz"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"simulate"}, tc.args...), &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr.String(), tc.code, tc.want)
			}
			if _, err := os.Stat(filepath.Join(out, "index.html")); err == nil {
				t.Error("a refused scenario wrote a page")
			}
		})
	}
}

// TestSimulateStopsTheSimulator: when the command gives up (its context ends: -timeout,
// or the caller's), the simulator's process ends with it, not only go test's: a source
// tree whose TestFleet never ends stands in for a long simulation.
func TestSimulateStopsTheSimulator(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads the simulator's state in /proc")
	}
	src := t.TempDir()
	pidFile := filepath.Join(t.TempDir(), "pid")
	t.Setenv("FLEETLIMIT_TEST_PIDFILE", pidFile)
	for name, text := range map[string]string{
		"go.mod": "module " + rootModule + "\n\ngo 1.22\n",
		"sim/sim_test.go": `package sim

import (
	"flag"
	"os"
	"strconv"
	"testing"
	"time"
)

var _, _ = flag.String("scenario", "", ""), flag.String("report", "", "")

func TestFleet(t *testing.T) {
	if err := os.WriteFile(os.Getenv("FLEETLIMIT_TEST_PIDFILE"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Hour) // a simulation that does not end
}
`,
	} {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"simulate", "testdata/tiny.json", "-out", t.TempDir(), "-src", src}, &stdout, &stderr)
	}()
	var pid int
	waitUntil(t, "the simulator to start", func() bool {
		select {
		case code := <-done:
			t.Fatalf("exit %d before the simulator started: %s", code, stderr.String())
		default:
		}
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(string(b))
		return err == nil && pid > 0
	})
	cancel()
	if code := <-done; code != 1 || !strings.Contains(stderr.String(), "did not end") {
		t.Errorf("exit %d, stderr %q; want 1 and that the simulation did not end", code, stderr.String())
	}
	waitUntil(t, "the simulator's process to end", func() bool {
		// Gone, or a zombie its new parent has not reaped yet.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
	})
}

// waitUntil polls cond until it holds, failing the test after 30 s (a compile of the
// stand-in simulator included).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTestLogs: from go test -json, each scenario's text is what TestFleet logged for the
// whole run (its wall time left out: the page is the scenario's, not the machine's) and
// then what the scenario's own subtest logged, without the file:line prefixes or the
// runner's lines; a subtest's subtests are not the scenario's table. Every logged line,
// prefixes kept, and any line that is not JSON (a build error) go to the error text.
func TestTestLogs(t *testing.T) {
	var in strings.Builder
	for _, e := range []testEvent{
		{Action: "start"},
		{Action: "run", Test: "TestFleet"},
		{Action: "output", Test: "TestFleet", Output: "=== RUN   TestFleet\n"},
		{Action: "output", Test: "TestFleet", Output: "    sim_test.go:103: a note for every scenario\n"},
		{Action: "output", Test: "TestFleet", Output: "    sim_test.go:127: 2 runs in 1.5s of wall time\n"},
		{Action: "output", Test: "TestFleet/tiny", Output: "=== RUN   TestFleet/tiny\n"},
		{Action: "output", Test: "TestFleet/tiny", Output: "    sim_test.go:137: \n"},
		{Action: "output", Test: "TestFleet/tiny", Output: "        strategy  admitted/s\n"},
		{Action: "output", Test: "TestFleet/tiny", Output: "        hybrid    200\n"},
		{Action: "output", Test: "TestFleet/tiny/hybrid", Output: "    run.go:9: a run's own line\n"},
		{Action: "output", Test: "TestFleet/other", Output: "    sim_test.go:137: other's table\n"},
		{Action: "output", Test: "TestFleet/tiny", Output: "    --- PASS: TestFleet/tiny (0.50s)\n"},
		{Action: "pass", Test: "TestFleet/tiny", Output: "ignored\n"},
		{Action: "output", Output: "PASS\n"},
		{Action: "output", Output: "ok  \tgithub.com/fleetlimit/fleetlimit/sim\t1.6s\n"},
	} {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		in.Write(b)
		in.WriteString("\n")
	}
	in.WriteString("# github.com/fleetlimit/fleetlimit/sim\n")

	logs, all := testLogs(strings.NewReader(in.String()))
	want := map[string]string{
		"tiny":  "a note for every scenario\n\nstrategy  admitted/s\nhybrid    200\n",
		"other": "a note for every scenario\nother's table\n",
	}
	if !reflect.DeepEqual(logs, want) {
		t.Errorf("logs:\n%q\nwant\n%q", logs, want)
	}
	wantAll := "    sim_test.go:103: a note for every scenario\n" +
		"    sim_test.go:127: 2 runs in 1.5s of wall time\n" +
		"    sim_test.go:137: \n" +
		"        strategy  admitted/s\n" +
		"        hybrid    200\n" +
		"    run.go:9: a run's own line\n" +
		"    sim_test.go:137: other's table\n" +
		"# github.com/fleetlimit/fleetlimit/sim\n"
	if all != wantAll {
		t.Errorf("every line:\n%s\nwant\n%s", all, wantAll)
	}
}
