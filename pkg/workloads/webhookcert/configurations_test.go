package webhookcert

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	workloadsv1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
)

// The installed webhook configurations are generated from Configurations, so the manifests cannot
// drift from the paths and rules the server serves. UPDATE_GOLDEN=1 rewrites them
// (make generate-workloads does).
func TestWebhookConfigurationsManifest(t *testing.T) {
	m, v := Configurations(ServiceClientConfig("cistern-system", "cistern-workload-webhook", 443), nil, workloadsv1alpha1.GroupVersion,
		&PodPlacement{InstallNamespace: "cistern-system", DriverName: consts.DriverName})
	var buf bytes.Buffer
	buf.WriteString("# Generated from pkg/workloads/webhookcert/configurations.go by `make generate-workloads`.\n" +
		"# The controller injects caBundle at start and on every certificate rotation.\n")
	for _, obj := range []any{m, v} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		buf.WriteString("---\n")
		buf.Write(b)
	}
	path := filepath.Join("..", "..", "..", "deploy", "csi", "workload-controller", "webhooks.yaml")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, buf.Bytes()) {
		t.Errorf("%s is out of date: run make generate-workloads", path)
	}
}
