package hybridtest_test

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid/hybridtest"
)

// TestBusyMakesEveryKind: the fixture's Limiter has decided through every tier, its
// counters agree with the Tally, and its breaker is open, as Busy promises.
func TestBusyMakesEveryKind(t *testing.T) {
	l, seen := hybridtest.Busy(t)
	heard := seen.Counts()
	for _, k := range hybridtest.BusyOutcomes {
		if heard[k] == 0 {
			t.Errorf("no decision %+v; heard %v", k, heard)
		}
	}
	st := l.Stats()
	var counted int64
	for _, ls := range st.Limits {
		counted += ls.Allowed() + ls.Denied()
	}
	var total int64
	for _, n := range heard {
		total += n
	}
	if counted != total || st.Breaker != breaker.StateOpen {
		t.Errorf("Stats count %d decisions, the Tally %d; breaker %v (want open)", counted, total, st.Breaker)
	}
	if len(hybridtest.Metrics) == 0 {
		t.Error("no metrics listed")
	}
}

// TestMetricsAreTheDocs: Metrics, which the adapters' tests check their output against,
// is the table of docs/metrics.md: names, types and labels.
func TestMetricsAreTheDocs(t *testing.T) {
	text, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	values := regexp.MustCompile(`\([^)]*\)`)
	names := regexp.MustCompile("`([a-z_]+)`")
	var doc []hybridtest.Metric
	for _, line := range strings.Split(string(text), "\n") {
		if !strings.HasPrefix(line, "| `fleetlimit_") {
			continue
		}
		cols := strings.Split(line, "|")
		m := hybridtest.Metric{Name: strings.Trim(strings.TrimSpace(cols[1]), "`"), Type: strings.TrimSpace(cols[2])}
		for _, n := range names.FindAllStringSubmatch(values.ReplaceAllString(cols[3], ""), -1) {
			m.Labels = append(m.Labels, n[1])
		}
		doc = append(doc, m)
	}
	if !reflect.DeepEqual(doc, hybridtest.Metrics) {
		t.Errorf("docs/metrics.md has\n %v\nhybridtest.Metrics has\n %v", doc, hybridtest.Metrics)
	}
}
