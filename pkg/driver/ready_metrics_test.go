package driver

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// readyObservations scrapes the driver's /metrics, as Prometheus does, and returns the count of
// cistern_volume_ready_seconds by mode.
func readyObservations(t *testing.T, d *Driver) map[string]uint64 {
	t.Helper()
	mux := http.NewServeMux()
	d.Metrics().RegisterToServer(mux, "/metrics")
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	out := map[string]uint64{}
	for _, m := range families["cistern_volume_ready_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "mode" {
				out[l.GetValue()] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	return out
}

// wantReady checks the count of cistern_volume_ready_seconds of each mode: want's, none of others.
func wantReady(t *testing.T, d *Driver, want map[string]uint64) {
	t.Helper()
	got := readyObservations(t, d)
	for m, c := range got {
		if c != want[m] {
			t.Errorf("cistern_volume_ready_seconds{mode=%q} count %d, want %d", m, c, want[m])
		}
	}
	for m, c := range want {
		if _, ok := got[m]; !ok && c != 0 {
			t.Errorf("no cistern_volume_ready_seconds{mode=%q}, want count %d", m, c)
		}
	}
}
