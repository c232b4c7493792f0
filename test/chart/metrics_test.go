package chart

import (
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"
)

// TestChartLoggingFormat: logging.format reaches every container that runs a Cistern binary (the
// node plugin, its storagepool-sidecar, the FUSE keeper, the controller); the schema refuses a
// format the binaries do not know.
func TestChartLoggingFormat(t *testing.T) {
	got := renderChart(t, namespace, "logging: {format: json}")
	n := 0
	for k, o := range got {
		spec, _ := nested(o, "spec", "template", "spec").(map[string]any)
		cs, _ := spec["containers"].([]any)
		for _, c := range cs {
			c := c.(map[string]any)
			if image, _ := c["image"].(string); !strings.HasPrefix(image, "registry.example.com/cistern/") {
				continue
			}
			n++
			b, _ := yaml.Marshal(c["args"])
			if !strings.Contains(string(b), "--logging-format=json") {
				t.Errorf("%s container %s has no --logging-format=json:\n%s", k, c["name"], b)
			}
		}
	}
	if n != 4 {
		t.Errorf("%d containers run Cistern's images, want 4 (driver, storagepool-sidecar, keeper, controller)", n)
	}
	if out, err := helmLint(t, testImages, "logging: {format: yaml}"); err == nil || !strings.Contains(out, "format") {
		t.Errorf("helm lint --strict with logging.format yaml: %v, want refused:\n%s", err, out)
	}
}

// TestChartServiceMonitor: the node plugin serves its metrics over HTTPS on metrics.nodePort,
// which the peer NetworkPolicy opens (to the peers metrics.serviceMonitor.from names, else to
// any). metrics.serviceMonitor is off by default (no metrics Service, no ServiceMonitor); on, it
// adds a Service for the node plugin's and the controller's metrics, and a ServiceMonitor for
// each, both scraping over HTTPS with a token, only where the cluster serves
// monitoring.coreos.com/v1.
func TestChartServiceMonitor(t *testing.T) {
	const on = `metrics: {nodePort: 9443, serviceMonitor: {enabled: true, labels: {release: prom},
  from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]}}`
	const (
		nodeSvc  = "Service cistern-system/cistern-node-metrics"
		ctrlSvc  = "Service cistern-system/cistern-workload-controller-metrics"
		nodeSM   = "ServiceMonitor cistern-system/cistern-node"
		ctrlSM   = "ServiceMonitor cistern-system/cistern-workload-controller"
		netpol   = "NetworkPolicy cistern-system/cistern-node-peers"
		monitors = "monitoring.coreos.com/v1/ServiceMonitor"
	)
	for _, tc := range []struct {
		name, values string
		apis         []string
		want, absent []string
	}{
		{name: "defaults", apis: []string{monitors}, absent: []string{nodeSvc, ctrlSvc, nodeSM, ctrlSM}},
		{name: "enabled without the API", values: on, want: []string{nodeSvc, ctrlSvc}, absent: []string{nodeSM, ctrlSM}},
		{name: "enabled", values: on, apis: []string{monitors}, want: []string{nodeSvc, ctrlSvc, nodeSM, ctrlSM}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := renderWithAPIs(t, tc.values, tc.apis...)
			for _, k := range tc.want {
				if got[k] == nil {
					t.Errorf("no %s in %v", k, keys(got))
				}
			}
			for _, k := range tc.absent {
				if got[k] != nil {
					t.Errorf("%s rendered", k)
				}
			}
			port := "port: 8443"
			if tc.values != "" {
				port = "port: 9443"
			}
			b, _ := yaml.Marshal(got[netpol])
			if !strings.Contains(string(b), port) {
				t.Errorf("NetworkPolicy does not open the metrics port (%s):\n%s", port, b)
			}
		})
	}
	got := renderWithAPIs(t, on, monitors)
	for k, want := range map[string][]string{
		nodeSvc: {"clusterIP: None", "app.kubernetes.io/name: cistern-node", "port: 9443", "targetPort: metrics"},
		ctrlSvc: {"app.kubernetes.io/name: cistern-workload-controller", "targetPort: metrics"},
		nodeSM:  {"release: prom", "port: https-metrics", "scheme: https", "bearerTokenFile:", "app.kubernetes.io/component: node-metrics"},
		ctrlSM:  {"release: prom", "port: https-metrics", "scheme: https", "bearerTokenFile:"},
		netpol:  {"kubernetes.io/metadata.name: monitoring"},
	} {
		b, _ := yaml.Marshal(got[k])
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s has no %q:\n%s", k, w, b)
			}
		}
	}
	b, _ := yaml.Marshal(got["DaemonSet cistern-system/cistern-node"])
	for _, w := range []string{"--metrics-secure-address=:9443", "--http-endpoint=127.0.0.1:9809", "containerPort: 9443"} {
		if !strings.Contains(string(b), w) {
			t.Errorf("the DaemonSet has no %q:\n%s", w, b)
		}
	}
}

// renderWithAPIs renders the chart as renderChart does, for a cluster that also serves apis
// (group/version/kind, as helm's --api-versions).
func renderWithAPIs(t *testing.T, values string, apis ...string) objects {
	t.Helper()
	chrt, err := loader.Load(filepath.Join(repoRoot(), "charts", "cistern"))
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValues([]byte(testImages + values))
	if err != nil {
		t.Fatal(err)
	}
	caps := *chartutil.DefaultCapabilities
	caps.APIVersions = append(append(chartutil.VersionSet{}, caps.APIVersions...), apis...)
	opts := chartutil.ReleaseOptions{Name: "cistern", Namespace: namespace, Revision: 1, IsInstall: true}
	renderVals, err := chartutil.ToRenderValues(chrt, vals, opts, &caps)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(chrt, renderVals)
	if err != nil {
		t.Fatal(err)
	}
	all := objects{}
	for name, content := range files {
		if strings.HasSuffix(name, ".yaml") {
			for k, o := range parse(t, name, content) {
				all[k] = o
			}
		}
	}
	return all
}
