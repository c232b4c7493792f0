package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChartValuesSchema: values.schema.json refuses a value the chart does not know at any level
// (helm lint --strict and helm template both fail, naming it), and passes the defaults and every
// example values file of the repository (charts/cistern/examples).
func TestChartValuesSchema(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		if out, err := helmLint(t, testImages); err != nil {
			t.Errorf("helm lint --strict of the defaults: %v\n%s", err, out)
		}
		helmObjects(t)
	})
	examples, err := filepath.Glob(filepath.Join(chartDir(), "examples", "*.yaml"))
	if err != nil || len(examples) == 0 {
		t.Fatalf("no example values files: %v", err)
	}
	for _, f := range examples {
		t.Run("example "+filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if out, err := helmLint(t, string(b)); err != nil {
				t.Errorf("helm lint --strict -f %s: %v\n%s", f, err, out)
			}
			helmObjects(t, string(b))
		})
	}
	for _, tc := range []struct {
		values string
		wrong  string // the misspelt name the error must give
	}{
		{values: "node: {limts: {maxDatasetBytes: 1}}", wrong: "limts"},
		{values: "node: {limits: {maxDatasetByte: 1}}", wrong: "maxDatasetByte"},
		{values: "imagePullSecret: [{name: x}]", wrong: "imagePullSecret"},
		{values: "workloadController: {podDisruptionBudget: {minAvaliable: 1}}", wrong: "minAvaliable"},
		{values: "workloadController: {resources: {request: {cpu: 1}}}", wrong: "request"},
		{values: "pools: {profiles: {default: {pools: [{name: fast, path: /mnt/fast, lables: {a: b}}]}}}", wrong: "lables"},
		{values: "sidecars: {provisioner: {image: x, args: [--v=5]}}", wrong: "args"},
		{values: "crds: {kept: false}", wrong: "kept"},
		{values: "workloadController: {webhook: {certManger: {enabled: true}}}", wrong: "certManger"},
		{values: "metrics: {grafanaDashboard: {enbled: true}}", wrong: "enbled"},
		{values: "workloadController: {webhook: {certManager: {enabled: true, issuerRef: {nmae: corp-ca}}}}", wrong: "nmae"},
	} {
		t.Run("misspelt "+tc.wrong, func(t *testing.T) {
			out, err := helmLint(t, testImages, tc.values)
			if err == nil || !strings.Contains(out, tc.wrong) {
				t.Errorf("helm lint --strict with %q: %v, want a failure naming %s:\n%s", tc.values, err, tc.wrong, out)
			}
			out, err = helmTemplate(t, tc.values)
			if err == nil || !strings.Contains(out, tc.wrong) {
				t.Errorf("helm template with %q: %v, want a failure naming %s:\n%s", tc.values, err, tc.wrong, out)
			}
		})
	}
	t.Run("image.registry required", func(t *testing.T) {
		out, err := helmTemplate(t, "image: {registry: \"\"}")
		if err == nil || !strings.Contains(out, "image.registry is required") {
			t.Errorf("helm template without image.registry: %v, want \"image.registry is required\":\n%s", err, out)
		}
	})
}
