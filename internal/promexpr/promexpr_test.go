package promexpr

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		name, query string
		want        []string
	}{
		{"a selector with Grafana variables", `max(guestbackup_bsls_ready{namespace="$namespace", bsls="${bsls}"})`, []string{"guestbackup_bsls_ready"}},
		{"a variable as a number", `count((time() - guestbackup_vm_last_snapshot_timestamp_seconds) > $stale_after) or vector(0)`, []string{"guestbackup_vm_last_snapshot_timestamp_seconds"}},
		{"a rate over Grafana's interval", `rate(kopia_blob_upload_bytes_total[$__rate_interval])`, []string{"kopia_blob_upload_bytes_total"}},
		{"two metrics, an offset, by()", `max by (namespace) (a_bytes) > 1.5 * max by (namespace) (b_bytes offset 1d)`, []string{"a_bytes", "b_bytes"}},
		{"a __name__ matcher", `{__name__="guestbackup_vm_snapshots"}`, []string{"guestbackup_vm_snapshots"}},
		{"functions and labels are not metrics", `label_replace(up, "x", "$1", "job", "(.*)")`, []string{"up"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MetricNames(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("MetricNames = %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := MetricNames(`sum(rate(x[5m])`); err == nil {
		t.Fatal("an unbalanced expression parsed")
	}
}

// TestChartFilesParse: every query of the chart's dashboard and alerts is
// PromQL Prometheus accepts and uses at least one metric.
func TestChartFilesParse(t *testing.T) {
	dir := filepath.Join("..", "..", "charts", "guestbackup", "files", "monitoring")
	read := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	dash, err := Dashboard(read("dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := Rules(read("alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dash) < 10 || len(rules) < 8 {
		t.Fatalf("%d dashboard queries and %d rules: the files were not read", len(dash), len(rules))
	}
	for _, e := range append(dash, rules...) {
		names, err := MetricNames(e.Query)
		if err != nil {
			t.Errorf("%s: %v", e.Where, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: %q uses no metric", e.Where, e.Query)
		}
	}
}
