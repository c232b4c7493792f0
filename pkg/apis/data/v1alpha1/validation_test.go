package v1alpha1_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apivalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apimachinery/pkg/runtime"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

const crdFile = "../../../../deploy/csi/crds/data.cistern.dev_volumemanagers.yaml"

// volumeManagerSchema loads the generated CRD, checks it as the API server would on create
// (CEL rules compile and fit the cost limits) and returns its structural schema.
func volumeManagerSchema(t *testing.T) *structuralschema.Structural {
	t.Helper()
	data, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatal(err)
	}
	var internal apiextensions.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&crd, &internal, nil); err != nil {
		t.Fatal(err)
	}
	internal.Status.StoredVersions = []string{internal.Spec.Versions[0].Name} // the API server's to set
	if errs := apivalidation.ValidateCustomResourceDefinition(context.Background(), &internal); len(errs) > 0 {
		t.Fatalf("the API server would refuse the CRD: %v", errs.ToAggregate())
	}
	// One version: the conversion keeps its schema as the CRD-wide one.
	s, err := structuralschema.NewStructural(internal.Spec.Validation.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestVolumeManagerValidation runs the CRD's CEL rules on objects, as the API server does.
func TestVolumeManagerValidation(t *testing.T) {
	s := volumeManagerSchema(t)
	validator := cel.NewValidator(s, true, celconfig.PerCallLimit)
	base := func() map[string]any {
		return map[string]any{
			"apiVersion": "data.cistern.dev/v1alpha1", "kind": "VolumeManager",
			"metadata": map[string]any{"name": "models", "namespace": "ml"},
			"spec": map[string]any{"volumes": []any{map[string]any{
				"id": "llama", "replicas": int64(2), "sourceType": "S3", "sourceURL": "s3://models/llama",
				"capacity": "10Gi", "labels": map[string]any{"team": "nlp"},
				"options": map[string]any{"endpoint": "https://minio:9000", "secretName": "reader"},
			}}},
		}
	}
	volume := func(o map[string]any) map[string]any {
		return o["spec"].(map[string]any)["volumes"].([]any)[0].(map[string]any)
	}
	for _, tc := range []struct {
		name   string
		change func(o map[string]any)
		want   string
	}{
		{"valid", func(map[string]any) {}, ""},
		{"valid NFS", func(o map[string]any) {
			v := volume(o)
			v["sourceType"], v["sourceURL"], v["options"] = "NFS", "nfs://server/export", map[string]any{"include": "*.bin"}
		}, ""},
		{"valid NFSv4", func(o map[string]any) {
			v := volume(o)
			v["sourceType"], v["sourceURL"], v["options"] = "NFS", "nfs://server/export", map[string]any{"nfsVersion": "4"}
		}, ""},
		{"failure case - S3 type with an NFS URL", func(o map[string]any) { volume(o)["sourceURL"] = "nfs://server/export" }, "sourceURL must start"},
		{"failure case - Local type with an S3 URL", func(o map[string]any) {
			volume(o)["sourceType"] = "Local"
			delete(volume(o), "options")
		}, "sourceURL must start"},
		{"failure case - endpoint on an NFS source", func(o map[string]any) {
			volume(o)["sourceType"], volume(o)["sourceURL"] = "NFS", "nfs://server/export"
		}, "apply to S3 sources only"},
		{"failure case - unknown option", func(o map[string]any) { volume(o)["options"] = map[string]any{"endpoints": "x"} }, "options are"},
		{"failure case - reserved label", func(o map[string]any) {
			volume(o)["labels"] = map[string]any{"data.cistern.dev/volumemanager": "other"}
		}, "label"},
		{"failure case - label value too long", func(o map[string]any) {
			volume(o)["labels"] = map[string]any{"team": strings.Repeat("a", 64)}
		}, "label"},
		{"failure case - name too long for a label", func(o map[string]any) {
			o["metadata"].(map[string]any)["name"] = strings.Repeat("m", 64)
		}, "at most 63 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := base()
			tc.change(obj)
			u := runtime.DeepCopyJSON(obj)
			errs, _ := validator.Validate(context.Background(), nil, s, u, nil, celconfig.RuntimeCELCostBudget)
			switch {
			case tc.want == "" && len(errs) > 0:
				t.Fatalf("refused: %v", errs.ToAggregate())
			case tc.want != "" && (len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.want)):
				t.Fatalf("errors %v, want one containing %q", errs.ToAggregate(), tc.want)
			}
		})
	}
}

// TestVolumeManagerCompletedIsFinal: spec.state Completed, once set, cannot be changed or removed
// (the transition rule the API server runs on updates).
func TestVolumeManagerCompletedIsFinal(t *testing.T) {
	s := volumeManagerSchema(t)
	validator := cel.NewValidator(s, true, celconfig.PerCallLimit)
	obj := func(state string) map[string]any {
		spec := map[string]any{"volumes": []any{map[string]any{
			"id": "llama", "replicas": int64(1), "sourceType": "S3", "sourceURL": "s3://models/llama"}}}
		if state != "" {
			spec["state"] = state
		}
		return runtime.DeepCopyJSON(map[string]any{"apiVersion": "data.cistern.dev/v1alpha1", "kind": "VolumeManager",
			"metadata": map[string]any{"name": "models", "namespace": "ml"}, "spec": spec})
	}
	for _, tc := range []struct {
		name, from, to string
		refused        bool
	}{
		{"unset to Completed", "", "Completed", false},
		{"Running to Completed", "Running", "Completed", false},
		{"Completed stays", "Completed", "Completed", false},
		{"Running to unset", "Running", "", false},
		{"failure case - Completed to Running", "Completed", "Running", true},
		{"failure case - Completed removed", "Completed", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := validator.Validate(context.Background(), nil, s, obj(tc.to), obj(tc.from), celconfig.RuntimeCELCostBudget)
			switch {
			case !tc.refused && len(errs) > 0:
				t.Fatalf("refused: %v", errs.ToAggregate())
			case tc.refused && (len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), "Completed is final")):
				t.Fatalf("errors %v, want the Completed rule", errs.ToAggregate())
			}
		})
	}
}
