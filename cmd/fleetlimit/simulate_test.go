package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
