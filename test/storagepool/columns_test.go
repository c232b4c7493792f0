package storagepool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/units"
	"github.com/cistern-csi/cistern/pkg/workloads/volumemanager"
	"github.com/cistern-csi/cistern/test/framework"
)

// TestPrinterColumns: the API server's tables (what kubectl get prints) show sizes in human
// units: a StoragePool the real sidecar published has Total, Available and Cached as
// units.HumanBytes of its exact quantities, and a VolumeManager's Progress column is its
// status.progress ("3.1 GiB of 12.5 GiB, 24%"), never raw bytes or 65795028Ki.
func TestPrinterColumns(t *testing.T) {
	cp := framework.Shared(t)
	c := adminClient(t, cp)
	node := uniqueNode(t, "n1")
	startSidecar(t, cp, startDriver(t, node, poolConfig{name: "fast", path: poolDir(t, 48)}))
	obj := waitPool(t, c, "fast."+node, "published with its printed sizes", func(o *spapi.StoragePool) bool {
		return o.Status.Capacity != nil && o.Status.Printed != nil && o.Status.Printed.Cached != ""
	})
	cells := tableRow(t, cp, "/apis/storagepool.storage.k8s.io/v1alpha1/storagepools/"+obj.Name)
	for col, want := range map[string]string{
		"Total":     units.HumanBytes(obj.Status.Capacity.Total.Value()),
		"Available": units.HumanBytes(obj.Status.Capacity.Available.Value()),
		"Cached":    units.HumanBytes(obj.Status.Cache.Bytes.Value()),
	} {
		if cells[col] != want {
			t.Errorf("StoragePool column %s = %v, want %q (row %v)", col, cells[col], want, cells)
		}
	}
	if cells["Total"] != "48.0 MiB" {
		t.Errorf("StoragePool Total = %v, want the tmpfs size 48.0 MiB", cells["Total"])
	}

	root := framework.RepoRoot()
	framework.ApplyManifests(t, cp, filepath.Join(root, "deploy/csi/crds/data.cistern.dev_volumemanagers.yaml"))
	framework.ApplyYAML(t, cp, `apiVersion: data.cistern.dev/v1alpha1
kind: VolumeManager
metadata: {name: columns, namespace: `+sidecarNamespace+`}
spec:
  volumes:
  - {id: models, replicas: 1, sourceType: S3, sourceURL: "s3://datasets/models"}
`)
	vols := []datav1alpha1.Volume{{ID: "models", Nodes: []datav1alpha1.NodeStatus{
		{Name: node, State: datav1alpha1.NodeStaging, BytesDone: 3328599654, BytesTotal: 12800 << 20}}}}
	status := datav1alpha1.VolumeManagerStatus{State: datav1alpha1.StatePending, Volumes: vols, Progress: volumemanager.Progress(vols)}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		t.Fatal(err)
	}
	path := "/apis/data.cistern.dev/v1alpha1/namespaces/" + sidecarNamespace + "/volumemanagers/columns"
	do(t, cp.Config, http.MethodPatch, path+"/status", "application/merge-patch+json", patch)
	cells = tableRow(t, cp, path)
	if want := "3.1 GiB of 12.5 GiB, 24%"; cells["Progress"] != want || cells["State"] != "Pending" {
		t.Errorf("VolumeManager columns %v, want Progress %q and State Pending", cells, want)
	}
}

// tableRow GETs path as a Table, as kubectl get does, and returns its one row by column name.
func tableRow(t *testing.T, cp *framework.ControlPlane, path string) map[string]any {
	t.Helper()
	var table metav1.Table
	if err := json.Unmarshal(do(t, cp.Config, http.MethodGet, path, "", nil), &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Rows) != 1 || len(table.Rows[0].Cells) != len(table.ColumnDefinitions) {
		t.Fatalf("table of %s: %d rows, %d columns: %+v", path, len(table.Rows), len(table.ColumnDefinitions), table)
	}
	out := map[string]any{}
	for i, col := range table.ColumnDefinitions {
		out[col.Name] = table.Rows[0].Cells[i]
	}
	return out
}

// do sends one request as admin and returns the body of its 2xx answer.
func do(t *testing.T, cfg *rest.Config, method, path, contentType string, body []byte) []byte {
	t.Helper()
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, cfg.Host+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Accept", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode/100 != 2 {
		t.Fatal(fmt.Errorf("%s %s: HTTP %d %v: %s", method, path, resp.StatusCode, err, b))
	}
	return b
}
