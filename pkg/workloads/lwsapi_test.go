package workloads

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	workloadsv1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads/webhookcert"
)

// The drop-in CRD is derived from the generated one, so it cannot drift from the Go types.
// UPDATE_GOLDEN=1 rewrites it (make generate-workloads does).
func TestDropInCRDManifest(t *testing.T) {
	root := filepath.Join("..", "..", "deploy", "csi")
	generated, err := os.ReadFile(filepath.Join(root, "crds", "workloads.cistern.dev_leaderworkersets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := DropInCRD(generated)
	if err != nil {
		t.Fatal(err)
	}
	got = append([]byte("# Generated from workloads.cistern.dev_leaderworkersets.yaml by `make generate-workloads`; never edit.\n"), got...)
	path := filepath.Join(root, "lws-upstream", "leaderworkerset.x-k8s.io_leaderworkersets.yaml")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run make generate-workloads", path)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(got, &crd); err != nil {
		t.Fatal(err)
	}
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	tpl := spec.Properties["leaderWorkerTemplate"].Properties
	ru := spec.Properties["rolloutStrategy"].Properties["rollingUpdateConfiguration"].Properties
	if crd.Name != "leaderworkersets.leaderworkerset.x-k8s.io" || crd.Spec.Versions[0].Name != "v1" || crd.Labels[DropInLabel] != "cistern" ||
		tpl["subGroupPolicy"].Properties["subGroupSize"].Type == "" || ru["partition"].Type == "" {
		t.Errorf("drop-in CRD %s version %s labels %v lacks upstream fields", crd.Name, crd.Spec.Versions[0].Name, crd.Labels)
	}
}

func TestSchemeForUpstreamAPI(t *testing.T) {
	s := SchemeFor(workloadsv1alpha1.UpstreamGroupVersion)
	for obj, want := range map[client.Object]schema.GroupVersionKind{
		&workloadsv1alpha1.LeaderWorkerSet{}:       workloadsv1alpha1.UpstreamGroupVersion.WithKind("LeaderWorkerSet"),
		&workloadsv1alpha1.NotebookValidationJob{}: workloadsv1alpha1.GroupVersion.WithKind("NotebookValidationJob"),
	} {
		got, err := apiutil.GVKForObject(obj, s)
		if err != nil || got != want {
			t.Errorf("%T: %v %v, want %v", obj, got, err, want)
		}
	}
	// Every kind of the package is registered in drop-in mode too.
	def := Scheme()
	for gvk := range def.AllKnownTypes() {
		if gvk.Group != workloadsv1alpha1.GroupVersion.Group || strings.HasSuffix(gvk.Kind, "Options") || gvk.Kind == "WatchEvent" {
			continue
		}
		if strings.HasPrefix(gvk.Kind, "LeaderWorkerSet") {
			gvk = workloadsv1alpha1.UpstreamGroupVersion.WithKind(gvk.Kind)
		}
		if !s.Recognizes(gvk) {
			t.Errorf("drop-in scheme does not know %v", gvk)
		}
	}
}

func TestParseLeaderWorkerSetAPI(t *testing.T) {
	for in, want := range map[string]string{"": "workloads.cistern.dev/v1alpha1", "leaderworkerset.x-k8s.io/v1": "leaderworkerset.x-k8s.io/v1"} {
		if gv, err := ParseLeaderWorkerSetAPI(in); err != nil || gv.String() != want {
			t.Errorf("%q: %v %v", in, gv, err)
		}
	}
	if _, err := ParseLeaderWorkerSetAPI("leaderworkerset.x-k8s.io/v2"); err == nil {
		t.Error("an unknown version was accepted")
	}
}

func TestCheckSoleLeaderWorkerSetController(t *testing.T) {
	gv := workloadsv1alpha1.UpstreamGroupVersion
	crd := func(labels map[string]string) *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: "leaderworkersets.leaderworkerset.x-k8s.io", Labels: labels},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: gv.Group,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true}}},
		}
	}
	ours := crd(map[string]string{DropInLabel: "cistern"})
	upstreamHook := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "lws-mutating-webhook-configuration"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "mleaderworkerset.kb.io", Rules: []admissionregistrationv1.RuleWithOperations{{
			Rule: admissionregistrationv1.Rule{APIGroups: []string{gv.Group}, APIVersions: []string{"v1"}, Resources: []string{"leaderworkersets"}}}}}},
	}
	m, v := webhookcert.Configurations(webhookcert.URLClientConfig("127.0.0.1:1"), nil, gv, nil)
	m.Name, v.Name = webhookcert.ConfigurationName, webhookcert.ConfigurationName
	rule := func(group, resource string) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{Rule: admissionregistrationv1.Rule{
			APIGroups: []string{group}, APIVersions: []string{"*"}, Resources: []string{resource}}}}
	}
	// Kueue's configurations, as its manifests and Helm chart install them: the LeaderWorkerSet
	// webhooks carry upstream LWS's names, beside those of Kueue's own objects.
	kueueMutating := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kueue-mutating-webhook-configuration"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			{Name: "mclusterqueue.kb.io", Rules: rule("kueue.x-k8s.io", "clusterqueues")},
			{Name: "mleaderworkerset.kb.io", Rules: rule(gv.Group, "leaderworkersets")},
		},
	}
	kueueValidating := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kueue-validating-webhook-configuration"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "vleaderworkerset.kb.io", Rules: rule(gv.Group, "leaderworkersets")},
			{Name: "vworkload.kb.io", Rules: rule("kueue.x-k8s.io", "workloads")},
		},
	}
	gatekeeper := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "gatekeeper-validating-webhook-configuration"},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "validation.gatekeeper.sh", Rules: rule("*", "*")}},
	}
	policy := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "team-policy", Labels: map[string]string{PeerWebhookLabel: "true"}},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "lws.policy.example.com", Rules: rule(gv.Group, "leaderworkersets")}},
	}
	unlabelledPolicy := policy.DeepCopy()
	unlabelledPolicy.Labels = nil
	for _, tc := range []struct {
		name  string
		objs  []client.Object
		want  string
		peers int
	}{
		{name: "our CRD and our own webhooks", objs: []client.Object{ours, m, v}},
		{name: "Kueue's webhooks are a peer's", objs: []client.Object{ours, m, v, kueueMutating, kueueValidating}, peers: 2},
		{name: "a policy engine's wildcard rules name no LeaderWorkerSet", objs: []client.Object{ours, m, v, gatekeeper}},
		{name: "a configuration the administrator labelled a peer", objs: []client.Object{ours, policy}, peers: 1},
		{name: "failure case - no CRD", want: "CustomResourceDefinition leaderworkersets.leaderworkerset.x-k8s.io not found: install it with the kustomize component deploy/csi/lws-upstream"},
		{name: "failure case - upstream's CRD", objs: []client.Object{crd(map[string]string{"app.kubernetes.io/name": "lws"})},
			want: "is not the drop-in component's (no label workloads.cistern.dev/leaderworkerset-controller=cistern): another LeaderWorkerSet controller owns leaderworkerset.x-k8s.io"},
		{name: "failure case - another controller's webhook", objs: []client.Object{ours, m, v, upstreamHook, kueueMutating},
			want: "MutatingWebhookConfiguration lws-mutating-webhook-configuration (webhook mleaderworkerset.kb.io) admits leaderworkerset.x-k8s.io LeaderWorkerSets"},
		{name: "failure case - an unlabelled webhook of unknown origin", objs: []client.Object{ours, unlabelledPolicy},
			want: "label it workloads.cistern.dev/leaderworkerset-peer=true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(SchemeFor(gv)).WithObjects(tc.objs...).Build()
			peers, err := checkSoleLeaderWorkerSetController(context.Background(), c, gv, webhookcert.ConfigurationName)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
			if len(peers) != tc.peers {
				t.Errorf("peers %q, want %d", peers, tc.peers)
			}
		})
	}
}
