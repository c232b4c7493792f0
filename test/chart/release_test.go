package chart

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// secretDataLimit is the API server's limit on a Secret's data, where Helm keeps each release.
const secretDataLimit = 1 << 20

// TestChartReleaseFitsInASecret: Helm stores each release (the chart with all its files, and the
// rendered manifest) gzipped in one Secret. The LeaderWorkerSet CRD with the field docs of its
// embedded pod templates once took the release over the limit, and helm install failed on the
// real node; this measures the Secret Helm's own storage driver writes, with every switch on.
func TestChartReleaseFitsInASecret(t *testing.T) {
	for _, values := range []string{"", "snapshots: {enabled: true}\nleaderWorkerSet: {upstreamAPI: true}"} {
		chrt, err := loader.Load(filepath.Join(repoRoot(), "charts", "cistern"))
		if err != nil {
			t.Fatal(err)
		}
		files := renderFiles(t, namespace, values)
		var manifest strings.Builder
		for _, name := range slices.Sorted(maps.Keys(files)) {
			manifest.WriteString(files[name])
		}
		rls := &release.Release{Name: "cistern", Namespace: namespace, Version: 1, Chart: chrt,
			Manifest: manifest.String(), Info: &release.Info{Status: release.StatusDeployed}}
		secrets := fake.NewClientset().CoreV1().Secrets(namespace)
		if err := driver.NewSecrets(secrets).Create("sh.helm.release.v1.cistern.v1", rls); err != nil {
			t.Fatal(err)
		}
		stored, err := secrets.Get(context.Background(), "sh.helm.release.v1.cistern.v1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		size := 0
		for _, v := range stored.Data {
			size += len(v)
		}
		t.Logf("values %q: the release Secret holds %d bytes (limit %d)", values, size, secretDataLimit)
		if size > secretDataLimit {
			t.Errorf("values %q: the release Secret would hold %d bytes, over the API server's %d", values, size, secretDataLimit)
		}
	}
}
