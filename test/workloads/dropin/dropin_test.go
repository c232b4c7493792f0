// Package dropin_test runs the workload-controller as the cluster's LeaderWorkerSet controller:
// the kustomize component deploy/csi/lws-upstream rendered by kubectl, its CRD and RBAC installed
// on a control plane of its own (kube-apiserver, etcd, kube-controller-manager, kube-scheduler),
// the controller in this process with --leaderworkerset-api=leaderworkerset.x-k8s.io/v1 as its
// ServiceAccount, and upstream-style manifests (apiVersion leaderworkerset.x-k8s.io/v1) applied
// with kubectl. A fake kubelet runs the pods on the test's nodes.
package dropin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

func TestMain(m *testing.M) {
	os.Exit(framework.RunShared(m, testutil.ControlPlane))
}

const poolKey = "test.cistern.dev/pool"

var (
	rendered testutil.Rendered // the rendered base + component
	// cl is an admin client whose scheme serves LeaderWorkerSet as leaderworkerset.x-k8s.io/v1.
	cl client.Client
)

// install renders deploy/csi with the component, installs its CRDs, namespace, ServiceAccount and
// RBAC (not the Deployment or the Service-mode webhook configurations: the controller runs here,
// self-registered), once per binary.
func install(t *testing.T) *framework.ControlPlane {
	t.Helper()
	return framework.SharedSetup(t, func(cp *framework.ControlPlane) error {
		var err error
		if rendered, err = testutil.InstallDropIn(t, cp); err != nil {
			return err
		}
		cl, err = client.New(cp.Config, client.Options{Scheme: workloads.SchemeFor(v1alpha1.UpstreamGroupVersion)})
		return err
	})
}

// TestComponentRendersDropIn: the component sets the flag and points the LeaderWorkerSet webhooks
// at upstream's group, and the base alone stays on workloads.cistern.dev.
func TestComponentRendersDropIn(t *testing.T) {
	install(t)
	dep := rendered["Deployment"]
	if len(dep) != 1 || !strings.Contains(fmt.Sprint(dep[0]), "--leaderworkerset-api=leaderworkerset.x-k8s.io/v1") {
		t.Errorf("Deployment args lack the flag: %v", dep)
	}
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		b, _ := yaml.Marshal(rendered[kind])
		var hooks []struct {
			Webhooks []admissionregistrationv1.MutatingWebhook `json:"webhooks"`
		}
		if err := yaml.Unmarshal(b, &hooks); err != nil || len(hooks) != 1 {
			t.Fatalf("%s: %v", kind, err)
		}
		r := hooks[0].Webhooks[0].Rules[0]
		if !slices.Equal(r.APIGroups, []string{"leaderworkerset.x-k8s.io"}) || !slices.Equal(r.APIVersions, []string{"v1"}) || r.Resources[0] != "leaderworkersets" {
			t.Errorf("%s first webhook rule %+v", kind, r.Rule)
		}
	}
	var names []string
	for _, crd := range rendered["CustomResourceDefinition"] {
		names = append(names, crd["metadata"].(map[string]any)["name"].(string))
	}
	if !slices.Contains(names, "leaderworkersets.leaderworkerset.x-k8s.io") || !slices.Contains(names, "leaderworkersets.workloads.cistern.dev") {
		t.Errorf("CRDs %v", names)
	}
}

// TestDropInRefusesWhenGroupServed: with another controller's webhook admitting
// leaderworkerset.x-k8s.io LeaderWorkerSets (as upstream LWS installs), the controller does not
// start in drop-in mode and says why.
func TestDropInRefusesWhenGroupServed(t *testing.T) {
	cp := install(t)
	ctx := testutil.Context(t)
	other := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "lws-mutating-webhook-configuration"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "mleaderworkerset.kb.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/mutate")},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{"leaderworkerset.x-k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"leaderworkersets"}}}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if err := cl.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cl.Delete(context.Background(), other); err != nil {
			t.Error(err)
		}
	}()
	err := testutil.StartDropIn(t, cp)
	want := "refusing to serve LeaderWorkerSet as leaderworkerset.x-k8s.io/v1: MutatingWebhookConfiguration lws-mutating-webhook-configuration " +
		"(webhook mleaderworkerset.kb.io) admits leaderworkerset.x-k8s.io LeaderWorkerSets"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("start: %v, want %q", err, want)
	}
}

// TestDropInBesideKueueWebhooks: Kueue's LeaderWorkerSet integration registers webhooks named as
// upstream LWS's (mleaderworkerset.kb.io, vleaderworkerset.kb.io) in the configurations of its own
// objects; the drop-in starts beside them. (TestKueueAdmitsGroups runs real Kueue.)
func TestDropInBesideKueueWebhooks(t *testing.T) {
	cp := install(t)
	ctx := testutil.Context(t)
	rule := func(group, resource string) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"*"}, Resources: []string{resource}}}}
	}
	// Nothing serves them: Ignore, and a namespace selector no namespace matches, keep them out of
	// the other tests' way.
	hook := func(name, path string, rules []admissionregistrationv1.RuleWithOperations) admissionregistrationv1.MutatingWebhook {
		return admissionregistrationv1.MutatingWebhook{
			Name: name, ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1" + path)},
			Rules: rules, FailurePolicy: ptr.To(admissionregistrationv1.Ignore), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"test.cistern.dev/never": "true"}},
		}
	}
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kueue-mutating-webhook-configuration"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			hook("mclusterqueue.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-clusterqueue", rule("kueue.x-k8s.io", "clusterqueues")),
			hook("mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", rule("leaderworkerset.x-k8s.io", "leaderworkersets")),
		},
	}
	vh := hook("vleaderworkerset.kb.io", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", rule("leaderworkerset.x-k8s.io", "leaderworkersets"))
	wh := hook("vworkload.kb.io", "/validate-kueue-x-k8s-io-v1beta2-workload", rule("kueue.x-k8s.io", "workloads"))
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kueue-validating-webhook-configuration"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: vh.Name, ClientConfig: vh.ClientConfig, Rules: vh.Rules, FailurePolicy: vh.FailurePolicy, SideEffects: vh.SideEffects,
				AdmissionReviewVersions: vh.AdmissionReviewVersions, NamespaceSelector: vh.NamespaceSelector},
			{Name: wh.Name, ClientConfig: wh.ClientConfig, Rules: wh.Rules, FailurePolicy: wh.FailurePolicy, SideEffects: wh.SideEffects,
				AdmissionReviewVersions: wh.AdmissionReviewVersions, NamespaceSelector: wh.NamespaceSelector},
		},
	}
	for _, o := range []client.Object{mutating, validating} {
		if err := cl.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := cl.Delete(context.Background(), o); err != nil {
				t.Error(err)
			}
		}()
	}
	// The suite's one drop-in controller starts here (tests run in source order), beside them.
	startDropIn(t, cp)
}

var startOnce sync.Once

// startDropIn starts the controller in drop-in mode as its ServiceAccount, once.
func startDropIn(t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	var err error
	startOnce.Do(func() { err = testutil.StartDropIn(t, cp) })
	if err != nil {
		t.Fatal(err)
	}
}

// TestDropInUpstreamManifests: upstream-style manifests applied with kubectl come up as upstream
// would run them: groups, environment, subgroups, exclusive placement, per-group Services,
// status, the scale subresource, and owner references to leaderworkerset.x-k8s.io/v1.
func TestDropInUpstreamManifests(t *testing.T) {
	cp := install(t)
	startDropIn(t, cp)
	ns := framework.CreateNamespace(t, cp, "dropin")
	ctx := testutil.Context(t)
	var nodes []string
	for _, pool := range []string{"p1", "p2", "p3"} {
		for i := range 2 {
			n := fmt.Sprintf("%s-%s-%d", ns, pool, i)
			framework.CreateNode(t, cp, n, map[string]string{poolKey: pool})
			nodes = append(nodes, n)
		}
	}
	framework.FakeKubelet(t, cp.Client, fields.OneTermEqualSelector("metadata.namespace", ns), nodes...)
	apply := func(f string) {
		b, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		if out, err := framework.KubectlOutput(cp, string(b), "apply", "-n", ns, "-f", "-"); err != nil {
			t.Fatalf("kubectl apply %s: %v\n%s", f, err, out)
		}
	}
	ready := func(name string, replicas int32) func() error {
		return func() error {
			var l v1alpha1.LeaderWorkerSet
			if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &l); err != nil {
				return err
			}
			if st := l.Status; st.ReadyReplicas != replicas || st.Replicas != replicas || st.UpdatedReplicas != replicas {
				return fmt.Errorf("%s status %+v", name, st)
			}
			return nil
		}
	}
	// features first: its exclusive placement keeps each group's pool free of any other group's
	// pods, sample's included, so with sample scheduled first and spread over all three pools it
	// could not place both groups. The anti-affinity is symmetric: sample then lands in the third.
	apply("features.yaml")
	testutil.Eventually(t, 3*time.Minute, "features ready", ready("features", 2))
	apply("sample.yaml")
	testutil.Eventually(t, 3*time.Minute, "sample ready", ready("sample", 2))

	// The leader StatefulSet is owned by the upstream-group object.
	var leader appsv1.StatefulSet
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sample"}, &leader); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(&leader); ref == nil || ref.APIVersion != "leaderworkerset.x-k8s.io/v1" || ref.Kind != "LeaderWorkerSet" {
		t.Errorf("leader StatefulSet owner %+v", ref)
	}

	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	pools := map[string]string{} // features group -> pool
	for _, p := range pods.Items {
		env := map[string]string{}
		for _, e := range p.Spec.Containers[0].Env {
			env[e.Name] = e.Value
		}
		lws, group := p.Labels[v1alpha1.SetNameLabelKey], p.Labels[v1alpha1.GroupIndexLabelKey]
		switch lws {
		case "sample":
			if env[v1alpha1.LwsGroupSize] != "3" || env[v1alpha1.LwsLeaderAddress] != fmt.Sprintf("sample-%s.sample.%s", group, ns) ||
				p.Spec.Containers[0].Env[0].Name != v1alpha1.LwsLeaderAddress {
				t.Errorf("pod %s env %v", p.Name, p.Spec.Containers[0].Env)
			}
			if (p.Labels[v1alpha1.WorkerIndexLabelKey] == "0") != (p.Labels["role"] == "leader") {
				t.Errorf("pod %s: leader template not used as it should be (labels %v)", p.Name, p.Labels)
			}
		case "features":
			// LeaderExcluded, size 4 by 3: workers 1-3 form subgroup 0, the leader none.
			want := "0"
			if p.Labels[v1alpha1.WorkerIndexLabelKey] == "0" {
				want = ""
			}
			if got := p.Labels[v1alpha1.SubGroupIndexLabelKey]; got != want {
				t.Errorf("pod %s subgroup %q, want %q", p.Name, got, want)
			}
			if p.Spec.Subdomain != "features-"+group {
				t.Errorf("pod %s subdomain %q", p.Name, p.Spec.Subdomain)
			}
			var node corev1.Node
			if err := cl.Get(ctx, client.ObjectKey{Name: p.Spec.NodeName}, &node); err != nil {
				t.Fatal(err)
			}
			pool := node.Labels[poolKey]
			if prev, ok := pools[group]; ok && prev != pool {
				t.Errorf("group %s spans pools %s and %s", group, prev, pool)
			}
			pools[group] = pool
		}
	}
	if len(pools) != 2 || pools["0"] == pools["1"] {
		t.Errorf("exclusive placement: groups in pools %v", pools)
	}
	for _, svc := range []string{"sample", "features-0", "features-1"} {
		var s corev1.Service
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: svc}, &s); err != nil {
			t.Errorf("Service %s: %v", svc, err)
		}
	}

	// kubectl speaks the upstream API: scale through the scale subresource, as an HPA would.
	if out, err := framework.KubectlOutput(cp, "", "-n", ns, "scale", "leaderworkersets.leaderworkerset.x-k8s.io/sample", "--replicas=3"); err != nil {
		t.Fatalf("kubectl scale: %v\n%s", err, out)
	}
	testutil.Eventually(t, 3*time.Minute, "sample scaled to 3", ready("sample", 3))
	out, err := framework.KubectlOutput(cp, "", "-n", ns, "get", "leaderworkersets.leaderworkerset.x-k8s.io", "sample", "-o", "jsonpath={.status.readyReplicas}/{.spec.replicas}")
	if err != nil || out != "3/3" {
		t.Errorf("kubectl get: %q %v", out, err)
	}

	// Admission runs under the upstream group too.
	bad := strings.Replace(mustRead(t, "testdata/features.yaml"), "subGroupSize: 3", "subGroupSize: 2", 1)
	if out, err := framework.KubectlOutput(cp, bad, "apply", "-n", ns, "-f", "-"); err == nil ||
		!strings.Contains(out, "spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize: Invalid value: 2: field is immutable") {
		t.Errorf("subGroupSize change accepted or wrong message: %v\n%s", err, out)
	}
}

func mustRead(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
