// Package kueue_test runs Kueue (its controller manager and admission webhooks, built by `make
// kueue-tools` from the version hack/tools/kueue pins) next to the workload-controller as the
// cluster's LeaderWorkerSet controller (deploy/csi/lws-upstream), on a control plane of their own
// (kube-apiserver, etcd, kube-controller-manager, kube-scheduler): Kueue's pod webhook holds every
// pod of the cluster, so no other suite shares it. A fake kubelet runs the pods.
package kueue_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

const (
	// kueueVersion is what hack/tools/kueue builds; keep it in step with hack/make/40-workloads.mk.
	kueueVersion = "v0.17.0"
	kueueBinEnv  = "CISTERN_KUEUE_BIN"
)

var workloadGVK = schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "Workload"}

// startKueue runs Kueue's controller manager (testutil.StartPeerManager) with the LeaderWorkerSet
// integration, its webhooks named and scoped as Kueue's install names and scopes them: the kueue-
// prefix; kube-system and kueue-system left out of the pod, Deployment and StatefulSet hooks.
func startKueue(t *testing.T, cp *framework.ControlPlane, c client.Client) {
	t.Helper()
	bin, config := testutil.PeerTool(t, kueueBinEnv, "kueue-"+kueueVersion, "kueue", "kueue-tools")
	notSystem := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "kueue-system"}}}}
	framework.ApplyYAML(t, cp, "apiVersion: v1\nkind: Namespace\nmetadata: {name: kueue-system}\n")
	// Ready once the webhook server answers: Kueue starts it after its certificates and before its
	// controllers need it.
	testutil.StartPeerManager(t, cp, c, testutil.PeerManager{
		Name:       "kueue",
		Config:     config,
		APIVersion: "config.kueue.x-k8s.io/v1beta2",
		Settings: `namespace: kueue-system
integrations:
  frameworks: [leaderworkerset.x-k8s.io/leaderworkerset, pod]
`,
		WebhookPrefix: "kueue-",
		WebhookScope: func(webhook string) *metav1.LabelSelector {
			if strings.HasSuffix(webhook, "pod.kb.io") || strings.HasSuffix(webhook, "deployment.kb.io") || strings.HasSuffix(webhook, "statefulset.kb.io") {
				return notSystem
			}
			return nil
		},
		Command: func(configFile, certDir string) *exec.Cmd {
			return exec.Command("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", metricsCertsScript, "kueue",
				certDir, t.TempDir(), bin, "--config", configFile, "--kubeconfig", cp.Kubeconfig,
				"--feature-gates=VisibilityOnDemand=false", "--zap-log-level=2")
		},
	})
}

// metricsCertsScript runs Kueue ($3 and on) with its certificates ($1) at the metrics
// certificate path it reads without internal certificate management (/etc/kueue/metrics/certs,
// not a setting in v0.17.0): in a mount namespace of its own, /etc is an overlay whose upper
// layer is in $2, so the host's /etc is never written.
const metricsCertsScript = `set -eu
certs=$1 scratch=$2
shift 2
mkdir -p "$scratch/upper" "$scratch/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
mkdir -p /etc/kueue/metrics/certs
cp "$certs/tls.crt" "$certs/tls.key" /etc/kueue/metrics/certs/
exec "$@"`

// TestKueueAdmitsGroups: with Kueue's webhooks in place the drop-in starts (they are a peer's, not
// a rival controller's); an upstream LeaderWorkerSet labelled with a queue is held, all its pods
// gated, while its ClusterQueue cannot fit the whole group, runs once the quota can, and a second
// one waits while the first uses the quota and runs when it is freed.
func TestKueueAdmitsGroups(t *testing.T) {
	cp := framework.Shared(t)
	c, err := client.New(cp.Config, client.Options{Scheme: workloads.SchemeFor(v1alpha1.UpstreamGroupVersion)})
	if err != nil {
		t.Fatal(err)
	}
	// The LeaderWorkerSet CRD before Kueue, which sets up its integration for the APIs it finds;
	// Kueue before the drop-in, so that its LeaderWorkerSet webhooks are there when the drop-in
	// looks for rival controllers.
	if _, err := testutil.InstallDropIn(t, cp); err != nil {
		t.Fatal(err)
	}
	startKueue(t, cp, c)
	if err := testutil.StartDropIn(t, cp); err != nil {
		t.Fatal(err)
	}

	ns := framework.CreateNamespace(t, cp, "kueue")
	ctx := testutil.Context(t)
	var nodes []string
	for i := range 2 {
		n := fmt.Sprintf("%s-%d", ns, i)
		framework.CreateNode(t, cp, n, nil)
		nodes = append(nodes, n)
	}
	framework.FakeKubelet(t, cp.Client, fields.OneTermEqualSelector("metadata.namespace", ns), nodes...)

	// A queue of 2 CPUs: less than one group of 3 pods x 1 CPU.
	framework.ApplyYAML(t, cp, fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: %[1]s}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu]
    flavors:
    - name: default
      resources: [{name: cpu, nominalQuota: "2"}]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team, namespace: %[1]s}
spec: {clusterQueue: %[1]s}
`, ns))
	apply := func(name string) {
		b, err := os.ReadFile(filepath.Join("testdata", "group.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		manifest := strings.Replace(string(b), "name: NAME", "name: "+name, 1)
		if out, err := framework.KubectlOutput(cp, manifest, "apply", "-n", ns, "-f", "-"); err != nil {
			t.Fatalf("kubectl apply %s: %v\n%s", name, err, out)
		}
	}

	apply("first")
	// Held: Kueue has looked at the group's Workload and found no room for all of it, and every
	// pod of the group exists, gated and unscheduled.
	testutil.Eventually(t, 3*time.Minute, "first held for quota", held(ctx, c, ns, "first", "insufficient quota"))
	if st := lwsStatus(t, ctx, c, ns, "first"); st.ReadyReplicas != 0 {
		t.Errorf("first ready while held: %+v", st)
	}

	// Room for the whole group: admitted, ungated, scheduled and Ready.
	var cq unstructured.Unstructured
	cq.SetGroupVersionKind(schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "ClusterQueue"})
	patch := []byte(`[{"op":"replace","path":"/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota","value":"3"}]`)
	cq.SetName(ns)
	if err := c.Patch(ctx, &cq, client.RawPatch("application/json-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 3*time.Minute, "first admitted and Ready", running(ctx, c, ns, "first"))

	// A second group waits while the first uses the quota...
	apply("second")
	testutil.Eventually(t, 3*time.Minute, "second held while first runs", held(ctx, c, ns, "second", "insufficient unused quota"))
	// ...and runs once it is freed.
	first := &v1alpha1.LeaderWorkerSet{}
	first.Namespace, first.Name = ns, "first"
	if err := c.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 3*time.Minute, "second admitted and Ready", running(ctx, c, ns, "second"))
}

func lwsStatus(t *testing.T, ctx context.Context, c client.Client, ns, name string) v1alpha1.LeaderWorkerSetStatus {
	t.Helper()
	var l v1alpha1.LeaderWorkerSet
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &l); err != nil {
		t.Fatal(err)
	}
	return l.Status
}

// groupWorkload is the Workload Kueue made for group 0 of a LeaderWorkerSet.
func groupWorkload(ctx context.Context, c client.Client, ns, name string) (*unstructured.Unstructured, error) {
	var l v1alpha1.LeaderWorkerSet
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &l); err != nil {
		return nil, err
	}
	var list unstructured.UnstructuredList
	list.SetGroupVersionKind(workloadGVK.GroupVersion().WithKind("WorkloadList"))
	if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{"kueue.x-k8s.io/job-uid": string(l.UID)}); err != nil {
		return nil, err
	}
	if len(list.Items) != 1 {
		return nil, fmt.Errorf("%d Workloads for %s, want 1 (one per group)", len(list.Items), name)
	}
	return &list.Items[0], nil
}

func workloadCondition(wl *unstructured.Unstructured, typ string) *metav1.Condition {
	raw, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	var conds []metav1.Condition
	for _, r := range raw {
		m, _ := r.(map[string]any)
		b, _ := yaml.Marshal(m)
		var cond metav1.Condition
		if yaml.Unmarshal(b, &cond) == nil {
			conds = append(conds, cond)
		}
	}
	return meta.FindStatusCondition(conds, typ)
}

// groupPods returns the pods of the group (a LeaderWorkerSet of one group of 3), an error unless
// all 3 exist.
func groupPods(ctx context.Context, c client.Client, ns, name string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.SetNameLabelKey: name}); err != nil {
		return nil, err
	}
	if len(pods.Items) != 3 {
		return nil, fmt.Errorf("%d pods of %s, want 3", len(pods.Items), name)
	}
	return pods.Items, nil
}

// held: the group's Workload has no quota and Kueue says why (want in its message), and all 3
// pods exist, each gated by Kueue and on no node.
func held(ctx context.Context, c client.Client, ns, name, want string) func() error {
	return func() error {
		wl, err := groupWorkload(ctx, c, ns, name)
		if err != nil {
			return err
		}
		q := workloadCondition(wl, "QuotaReserved")
		if q == nil || q.Status != metav1.ConditionFalse || !strings.Contains(q.Message, want) {
			return fmt.Errorf("Workload %s QuotaReserved %+v, want False with %q", wl.GetName(), q, want)
		}
		pods, err := groupPods(ctx, c, ns, name)
		if err != nil {
			return err
		}
		for _, p := range pods {
			gated := false
			for _, g := range p.Spec.SchedulingGates {
				gated = gated || g.Name == "kueue.x-k8s.io/admission"
			}
			if !gated || p.Spec.NodeName != "" {
				return fmt.Errorf("pod %s gates %v node %q: not held", p.Name, p.Spec.SchedulingGates, p.Spec.NodeName)
			}
		}
		return nil
	}
}

// running: the Workload is admitted, the 3 pods are ungated and scheduled, and the LeaderWorkerSet
// reports its group Ready.
func running(ctx context.Context, c client.Client, ns, name string) func() error {
	return func() error {
		wl, err := groupWorkload(ctx, c, ns, name)
		if err != nil {
			return err
		}
		if a := workloadCondition(wl, "Admitted"); a == nil || a.Status != metav1.ConditionTrue {
			return fmt.Errorf("Workload %s Admitted %+v", wl.GetName(), a)
		}
		pods, err := groupPods(ctx, c, ns, name)
		if err != nil {
			return err
		}
		for _, p := range pods {
			if len(p.Spec.SchedulingGates) != 0 || p.Spec.NodeName == "" {
				return fmt.Errorf("pod %s gates %v node %q", p.Name, p.Spec.SchedulingGates, p.Spec.NodeName)
			}
		}
		var l v1alpha1.LeaderWorkerSet
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &l); err != nil {
			return err
		}
		if l.Status.ReadyReplicas != 1 {
			return errors.New(name + " not Ready: " + fmt.Sprint(l.Status))
		}
		return nil
	}
}
