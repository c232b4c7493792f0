package chart

import (
	"strings"
	"testing"
)

// TestChartCRDsKept: `helm uninstall` leaves every CRD the chart installs (Helm skips an object
// annotated helm.sh/resource-policy: keep), unless crds.keep is false; with every switch on, so
// that the LeaderWorkerSet drop-in's CRD is among them.
func TestChartCRDsKept(t *testing.T) {
	const all = "snapshots: {enabled: true}\nleaderWorkerSet: {upstreamAPI: true}\n"
	for _, tc := range []struct {
		name   string
		values string
		keep   bool
	}{
		{name: "default", values: all, keep: true},
		{name: "crds.keep false", values: all + "crds: {keep: false}\n", keep: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			for k, o := range helmObjects(t, tc.values) {
				if !strings.HasPrefix(k, "CustomResourceDefinition ") {
					continue
				}
				n++
				annotations, _ := nested(o, "metadata", "annotations").(map[string]any)
				if got := annotations["helm.sh/resource-policy"] == "keep"; got != tc.keep {
					t.Errorf("%s: helm.sh/resource-policy %v, want keep: %v", k, annotations["helm.sh/resource-policy"], tc.keep)
				}
				// The generator's own annotation stays.
				if annotations["controller-gen.kubebuilder.io/version"] == nil {
					t.Errorf("%s lost its controller-gen annotation: %v", k, annotations)
				}
			}
			// StoragePool, LeaderWorkerSet, NotebookValidationJob, VolumeManager, upstream's
			// LeaderWorkerSet.
			if n != 5 {
				t.Errorf("the chart renders %d CRDs, want 5", n)
			}
		})
	}
}
