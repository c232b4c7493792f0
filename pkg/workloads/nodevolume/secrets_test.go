package nodevolume

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSecretReferences: the references a class's parameters give a volume, as external-provisioner
// resolves them (pkg/controller getSecretReference and its tests).
func TestSecretReferences(t *testing.T) {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "data",
		Annotations: map[string]string{"example.com/secret": "from-annotation"}}}
	ref := func(name, ns string) corev1.SecretReference { return corev1.SecretReference{Name: name, Namespace: ns} }
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   map[string]corev1.SecretReference
		err    string
	}{
		{name: "no Secret", params: map[string]string{"pool": "fast"}, want: map[string]corev1.SecretReference{}},
		{name: "the dataset example: a fixed name in the claim's namespace", params: map[string]string{
			"csi.storage.k8s.io/node-stage-secret-name": "imagenet-s3", "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}"},
			want: map[string]corev1.SecretReference{"nodeStage": ref("imagenet-s3", "team")}},
		{name: "tokens of the claim and the volume", params: map[string]string{
			"csi.storage.k8s.io/node-publish-secret-name": "${pvc.name}-${pv.name}", "csi.storage.k8s.io/node-publish-secret-namespace": "creds",
			"csi.storage.k8s.io/node-expand-secret-name": "${pvc.annotations['example.com/secret']}", "csi.storage.k8s.io/node-expand-secret-namespace": "${pvc.namespace}"},
			want: map[string]corev1.SecretReference{"nodePublish": ref("data-pvc-1", "creds"), "nodeExpand": ref("from-annotation", "team")}},
		{name: "the default names every reference a class names none for", params: map[string]string{
			"csi.storage.k8s.io/secret-name": "all", "csi.storage.k8s.io/secret-namespace": "${pvc.namespace}",
			"csi.storage.k8s.io/node-stage-secret-name": "stage", "csi.storage.k8s.io/node-stage-secret-namespace": "creds"},
			want: map[string]corev1.SecretReference{"controllerPublish": ref("all", "team"), "nodeStage": ref("stage", "creds"),
				"nodePublish": ref("all", "team"), "controllerExpand": ref("all", "team"), "nodeExpand": ref("all", "team")}},
		{name: "the older keys", params: map[string]string{"csiNodeStageSecretName": "old", "csiNodeStageSecretNamespace": "creds"},
			want: map[string]corev1.SecretReference{"nodeStage": ref("old", "creds")}},
		{name: "failure case - both keys", params: map[string]string{"csiNodeStageSecretName": "old", "csiNodeStageSecretNamespace": "creds",
			"csi.storage.k8s.io/node-stage-secret-name": "new", "csi.storage.k8s.io/node-stage-secret-namespace": "creds"}, err: "both"},
		{name: "failure case - a name alone", params: map[string]string{"csi.storage.k8s.io/node-stage-secret-name": "s"}, err: "both must be set"},
		{name: "failure case - the claim's name in the namespace", params: map[string]string{
			"csi.storage.k8s.io/node-stage-secret-name": "s", "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.name}"}, err: "unknown tokens pvc.name"},
		{name: "failure case - an annotation the claim lacks", params: map[string]string{
			"csi.storage.k8s.io/node-stage-secret-name": "${pvc.annotations['other']}", "csi.storage.k8s.io/node-stage-secret-namespace": "creds"}, err: "unknown tokens"},
		{name: "failure case - not a Secret name", params: map[string]string{
			"csi.storage.k8s.io/node-stage-secret-name": "Not_A_Name", "csi.storage.k8s.io/node-stage-secret-namespace": "creds"}, err: "not a valid Secret name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SecretReferences(tc.params, "pvc-1", pvc)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("references (-want +got):\n%s", d)
			}
		})
	}
}
