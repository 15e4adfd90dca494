package metricstest_test

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetlimit/fleetlimit/hybrid/hybridtest"
	"github.com/fleetlimit/fleetlimit/internal/metricstest"
)

// TestBusyOutcomes: hybridtest.Busy's Limiter has made every decision BusyOutcomes names.
func TestBusyOutcomes(t *testing.T) {
	_, seen := hybridtest.Busy(t)
	heard := seen.Counts()
	for _, k := range metricstest.BusyOutcomes {
		if heard[k] == 0 {
			t.Errorf("no decision %+v; heard %v", k, heard)
		}
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
	var doc []metricstest.Metric
	for _, line := range strings.Split(string(text), "\n") {
		if !strings.HasPrefix(line, "| `fleetlimit_") {
			continue
		}
		cols := strings.Split(line, "|")
		m := metricstest.Metric{Name: strings.Trim(strings.TrimSpace(cols[1]), "`"), Type: strings.TrimSpace(cols[2])}
		for _, n := range names.FindAllStringSubmatch(values.ReplaceAllString(cols[3], ""), -1) {
			m.Labels = append(m.Labels, n[1])
		}
		doc = append(doc, m)
	}
	if !reflect.DeepEqual(doc, metricstest.Metrics) {
		t.Errorf("docs/metrics.md has\n %v\nmetricstest.Metrics has\n %v", doc, metricstest.Metrics)
	}
}
