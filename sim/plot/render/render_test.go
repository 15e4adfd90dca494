package render

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// reportLine is one line of a report as the simulator writes it, with a timeline of ten
// 100 ms bins and the fields the plots do not use left in.
func reportLine(scenario, strategy, policy string, keys int, outage bool, open int) string {
	var bins []string
	for i := range 10 {
		bins = append(bins, fmt.Sprintf(`{"at_s":%g,"admitted_per_s":%d,"demand_per_s":1500,"servers":20,"fallback_share":%g,"breakers_open":%d}`,
			float64(i)/10, 900+10*i, float64(i%3)/4, open*(i%2)))
	}
	extra := ""
	if policy != "" {
		extra += fmt.Sprintf(`"policy":%q,`, policy)
	}
	if outage {
		extra += `"outage":{"start_s":0.3,"end_s":0.6,"requests":450,"sources":{"fallback+":12}},`
	}
	return fmt.Sprintf(`{"scenario":%q,"strategy":%q,%s"servers":20,"limit_per_s":1000,"burst":100,"demand_per_s":1500,"keys":%d,"duration_s":1,"bin_s":0.1,"requests":1500,"p99_decision_us":512.5,"sources":{"lease":1400},"timeline":[%s]}`,
		scenario, strategy, extra, keys, strings.Join(bins, ","))
}

// TestRender draws a small report: one plot per scenario, and the breaker plot only for
// the scenario with an outage and hybrid runs.
func TestRender(t *testing.T) {
	report := strings.Join([]string{
		reportLine("steady", "script", "", 1, false, 0),
		reportLine("steady", "hybrid fail-local", "fail-local", 1, false, 0),
		reportLine("outage", "hybrid fail-open", "fail-open", 1, true, 20),
		reportLine("outage", "hybrid fail-closed", "fail-closed", 1, true, 7),
		reportLine("outage", "local-only", "", 1, true, 0),
		"",
		reportLine("keys", "naive", "", 50, false, 0),
		reportLine("keys", "script", "", 50, true, 0),
	}, "\n")
	dir := t.TempDir()
	in := filepath.Join(dir, "report.jsonl")
	if err := os.WriteFile(in, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "plots")
	files, err := SVG(in, out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	want := []string{"steady.svg", "outage.svg", "outage-breakers.svg", "keys.svg"}
	if !slices.Equal(names, want) {
		t.Fatalf("wrote %v, want %v", names, want)
	}
	contains := map[string][]string{
		"steady.svg":          {"steady: admitted per second, 20 servers, limit 1,000/s, burst 100", "hybrid fail-local", "limit"},
		"outage.svg":          {"hybrid fail-closed", "local-only"},
		"outage-breakers.svg": {"Redis down 300ms-600ms", "hybrid fail-open", "hybrid fail-closed", "failure policy"},
		"keys.svg":            {"keys: admitted per second, all 50 keys, 20 servers", "naive"},
	}
	for name, texts := range contains {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("<?xml")) || !bytes.Contains(b, []byte("<svg")) {
			t.Errorf("%s is not an SVG document", name)
		}
		for _, s := range texts {
			if !bytes.Contains(b, []byte(s)) {
				t.Errorf("%s does not mention %q", name, s)
			}
		}
	}
}

// TestBreakerPlotDrawsIdenticalPoliciesOnce: the breakers do not depend on the policy, so
// runs whose curves agree are drawn as one line.
func TestBreakerPlotDrawsIdenticalPoliciesOnce(t *testing.T) {
	report := reportLine("o", "hybrid fail-open", "fail-open", 1, true, 5) + "\n" +
		reportLine("o", "hybrid fail-local", "fail-local", 1, true, 5)
	scs, err := readReport(strings.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if _, err := render(out, scs); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "o-breakers.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("every policy (identical)")) || bytes.Contains(b, []byte("hybrid fail-local")) {
		t.Error("identical breaker curves are not drawn as one line")
	}
}

func TestReadReportRejects(t *testing.T) {
	cases := map[string]string{
		"empty":         "\n",
		"not JSON":      "{",
		"slash in name": reportLine("../up", "script", "", 1, false, 0),
		"no name":       reportLine("", "script", "", 1, false, 0),
		"no timeline":   `{"scenario":"x","strategy":"script","duration_s":1,"bin_s":0.1}`,
		"no bin width":  strings.Replace(reportLine("x", "script", "", 1, false, 0), `"bin_s":0.1`, `"bin_s":0`, 1),
		"wrong type":    strings.Replace(reportLine("x", "script", "", 1, false, 0), `"servers":20,"limit`, `"servers":"20","limit`, 1),
	}
	for name, report := range cases {
		if _, err := readReport(strings.NewReader(report)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := SVG(filepath.Join(t.TempDir(), "none.jsonl"), t.TempDir()); err == nil {
		t.Error("a missing report: no error")
	}
}

// TestHTML writes the page of a small report: a table row per run, the text given for a
// scenario, and every plot inlined.
func TestHTML(t *testing.T) {
	report := strings.Join([]string{
		reportLine("steady", "script", "", 1, false, 0),
		reportLine("outage", "hybrid fail-open", "fail-open", 1, true, 20),
		reportLine("outage", "local-only", "", 1, true, 0),
	}, "\n")
	dir := t.TempDir()
	in := filepath.Join(dir, "report.jsonl")
	if err := os.WriteFile(in, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "page")
	files, err := HTML(in, out, Page{Title: "t <1>", Text: map[string]string{"outage": "strategy  admitted/s\n<b>"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 4 || filepath.Base(files[3]) != "index.html" {
		t.Fatalf("wrote %v, want three plots and index.html", files)
	}
	b, err := os.ReadFile(files[3])
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	if n := strings.Count(page, "<svg"); n != 3 {
		t.Errorf("%d inline SVG plots, want 3", n)
	}
	for _, s := range []string{
		"<title>t &lt;1&gt;</title>", `<section id="steady">`, `<section id="outage">`,
		"<td>hybrid fail-open</td>", "<td>local-only</td>", "strategy  admitted/s\n&lt;b&gt;",
		"20 servers, one key, limit 1,000/s and burst 100 per key, demand 1,500/s, 1s of virtual time",
		"Redis down 300ms-600ms",
	} {
		if !strings.Contains(page, s) {
			t.Errorf("the page does not hold %q", s)
		}
	}
	if strings.Contains(page, "<?xml") {
		t.Error("an inlined plot kept its XML declaration")
	}
}
