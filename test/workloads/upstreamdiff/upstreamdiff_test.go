// Package upstreamdiff_test is the differential test against upstream LeaderWorkerSet: upstream's
// controller manager (sigs.k8s.io/lws, built by make lws-tools, with its admission webhooks) on one
// control plane and Cistern's drop-in (--leaderworkerset-api=leaderworkerset.x-k8s.io/v1) on
// another, the same manifests applied to both (upstream's samples and testdata/e2e-cases.yaml),
// and the LeaderWorkerSets, StatefulSets, Services, pods, claims and ControllerRevisions they
// lead to compared field by field. Every difference must be one of knownDifferences, whose
// reasons docs/workloads.md lists.
package upstreamdiff_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

const (
	// lwsVersion is what hack/tools/lws builds; keep it in step with hack/make/40-workloads.mk.
	lwsVersion = "v0.8.0"
	lwsBinEnv  = "CISTERN_LWS_BIN"
	nodePool   = "cloud.google.com/gke-nodepool" // the exclusive-placement sample's topology
)

// side is one control plane and the controller serving LeaderWorkerSet on it.
type side struct {
	name string
	cp   *framework.ControlPlane
	cl   client.Client
}

func newSide(t *testing.T, name string) *side {
	t.Helper()
	cp := framework.StartControlPlane(t, testutil.ControlPlane)
	cl, err := client.New(cp.Config, client.Options{Scheme: workloads.SchemeFor(v1alpha1.UpstreamGroupVersion)})
	if err != nil {
		t.Fatal(err)
	}
	return &side{name: name, cp: cp, cl: cl}
}

// startUpstream runs upstream's controller manager on s (testutil.StartPeerManager).
func startUpstream(t *testing.T, s *side, bin, config string) {
	t.Helper()
	testutil.StartPeerManager(t, s.cp, s.cl, testutil.PeerManager{
		Name:          "lws-upstream",
		Config:        config,
		APIVersion:    "config.lws.x-k8s.io/v1alpha1",
		WebhookPrefix: "lws-",
		Command: func(configFile, _ string) *exec.Cmd {
			return exec.Command(bin, "--config", configFile, "--kubeconfig", s.cp.Kubeconfig, "--zap-log-level=2")
		},
	})
}

// startDropIn installs deploy/csi with the lws-upstream component and runs the drop-in as its
// ServiceAccount.
func startDropIn(t *testing.T, s *side) {
	t.Helper()
	if _, err := testutil.InstallDropIn(t, s.cp); err != nil {
		t.Fatal(err)
	}
	if err := testutil.StartDropIn(t, s.cp); err != nil {
		t.Fatal(err)
	}
}

// addNodes registers the same nodes on a side, three pools of four (the exclusive-placement
// sample puts each of its three groups of four in a pool of its own), run by a fake kubelet.
func addNodes(t *testing.T, s *side) {
	t.Helper()
	var nodes []string
	for _, pool := range []string{"a", "b", "c", "d"} {
		for i := range 4 {
			n := fmt.Sprintf("node-%s-%d", pool, i)
			framework.CreateNode(t, s.cp, n, map[string]string{nodePool: "pool-" + pool})
			nodes = append(nodes, n)
		}
	}
	framework.FakeKubelet(t, s.cp.Client, fields.Everything(), nodes...)
}

// manifests are the cases: upstream's samples, then testdata's.
func manifests(t *testing.T, config string) []string {
	t.Helper()
	samples, err := filepath.Glob(filepath.Join(config, "samples", "lws*.yaml"))
	if err != nil || len(samples) == 0 {
		t.Fatalf("no upstream samples in %s: %v", config, err)
	}
	return append(samples, filepath.Join("testdata", "e2e-cases.yaml"))
}

// apply creates namespace ns on s and applies the manifest there with kubectl.
func apply(t *testing.T, s *side, ns, path string) {
	t.Helper()
	framework.ApplyYAML(t, s.cp, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+ns+"}\n")
	out, err := framework.KubectlOutput(s.cp, "", "apply", "-n", ns, "-f", path)
	if err != nil {
		t.Fatalf("%s: kubectl apply %s: %v\n%s", s.name, path, err, out)
	}
}

var lwsGVK = schema.GroupVersionKind{Group: "leaderworkerset.x-k8s.io", Version: "v1", Kind: "LeaderWorkerSet"}

// settled is nil once every LeaderWorkerSet in ns has all its groups Ready, or, for one whose
// groups cannot start (claims of a class no provisioner serves), all its pods.
func settled(ctx context.Context, s *side, ns string) func() error {
	return func() error {
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(lwsGVK.GroupVersion().WithKind("LeaderWorkerSetList"))
		if err := s.cl.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, l := range list.Items {
			replicas, _, _ := unstructured.NestedInt64(l.Object, "spec", "replicas")
			ready, _, _ := unstructured.NestedInt64(l.Object, "status", "readyReplicas")
			if ready == replicas {
				continue
			}
			if vct, _, _ := unstructured.NestedSlice(l.Object, "spec", "leaderWorkerTemplate", "volumeClaimTemplates"); len(vct) == 0 {
				return fmt.Errorf("%s: %s/%s has %d of %d groups ready", s.name, ns, l.GetName(), ready, replicas)
			}
			size, _, _ := unstructured.NestedInt64(l.Object, "spec", "leaderWorkerTemplate", "size")
			var pods unstructured.UnstructuredList
			pods.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "PodList"})
			if err := s.cl.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.SetNameLabelKey: l.GetName()}); err != nil {
				return err
			}
			if int64(len(pods.Items)) != replicas*size {
				return fmt.Errorf("%s: %s/%s has %d of %d pods", s.name, ns, l.GetName(), len(pods.Items), replicas*size)
			}
		}
		return nil
	}
}

// TestUpstreamDifferential applies each manifest to both sides, waits until both settle, and
// compares what each made.
func TestUpstreamDifferential(t *testing.T) {
	bin, config := testutil.PeerTool(t, lwsBinEnv, "lws-"+lwsVersion, "manager", "lws-tools")
	up, cis := newSide(t, "upstream"), newSide(t, "cistern")
	startUpstream(t, up, bin, config)
	startDropIn(t, cis)
	for _, s := range []*side{up, cis} {
		addNodes(t, s)
	}
	counts := map[string]int{}
	for i, path := range manifests(t, config) {
		ns := fmt.Sprintf("case-%d", i)
		t.Run(strings.TrimSuffix(filepath.Base(path), ".yaml"), func(t *testing.T) {
			ctx := testutil.Context(t)
			for _, s := range []*side{up, cis} {
				apply(t, s, ns, path)
			}
			for _, s := range []*side{up, cis} {
				testutil.Eventually(t, 3*time.Minute, s.name+" settled", settled(ctx, s, ns))
			}
			counts[filepath.Base(path)] = compareSides(t, ctx, up, cis, ns)
		})
	}
	t.Logf("fields compared per case: %v", counts)
}
