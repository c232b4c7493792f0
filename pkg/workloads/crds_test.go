package workloads

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// Every field of every Cistern CRD carries a description (its Go doc comment), so that kubectl
// explain documents it; test/workloads runs kubectl explain against the API server. The only
// fields without one are those of embedded ObjectMeta (pod and claim template metadata), for which
// controller-gen writes none (upstream LWS's CRD has the same gaps), and those inside the
// LeaderWorkerSet's pod templates, which are Kubernetes' own.
func TestCRDsDescribeEveryField(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "deploy", "csi", "crds", "*.cistern.dev_*.yaml"))
	if err != nil || len(files) != 3 {
		t.Fatalf("CRDs %v %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatal(err)
		}
		var missing []string
		fields := 0
		var walk func(path string, s *apiextensionsv1.JSONSchemaProps)
		walk = func(path string, s *apiextensionsv1.JSONSchemaProps) {
			for name, p := range s.Properties {
				fields++
				child := path + "." + name
				if p.Description == "" && !embeddedMeta(child) && !inPodTemplate(child) {
					missing = append(missing, child)
				}
				walk(child, &p)
			}
			if s.Items != nil && s.Items.Schema != nil {
				walk(path+"[]", s.Items.Schema)
			}
			if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
				walk(path+"{}", s.AdditionalProperties.Schema)
			}
		}
		walk("", crd.Spec.Versions[0].Schema.OpenAPIV3Schema)
		if len(missing) > 0 || fields < 10 {
			t.Errorf("%s: %d of %d fields without a description: %s", crd.Name, len(missing), fields, strings.Join(missing, ", "))
		}
	}
}

// embeddedMeta says whether a field path is the object's metadata or inside an embedded
// ObjectMeta (a template's metadata).
func embeddedMeta(path string) bool {
	return path == ".metadata" || strings.HasSuffix(path, ".metadata") && strings.Contains(path, "emplate") ||
		strings.Contains(path, "emplate.metadata.") || strings.Contains(path, "emplates[].metadata")
}

// inPodTemplate says whether a field path is inside the LeaderWorkerSet's pod templates, whose
// field docs are Kubernetes' own (kubectl explain pod.spec): make generate-workloads drops them
// (hack/crddocs) so that the CRD fits a Helm release. The template fields themselves keep theirs.
func inPodTemplate(path string) bool {
	for _, t := range []string{".spec.leaderWorkerTemplate.leaderTemplate.", ".spec.leaderWorkerTemplate.workerTemplate."} {
		if strings.HasPrefix(path, t) {
			return true
		}
	}
	return false
}
