// Package snapshots_test runs the workload-controller's snapshot parts on a real control plane
// (kube-apiserver with etcd, kube-controller-manager, kube-scheduler) with the VolumeSnapshot CRDs
// of external-snapshotter's client: deploy/csi with the snapshots component rendered by kubectl,
// its RBAC installed, the controller in this process as its ServiceAccount with the flag the
// component sets, its webhooks self-registered. No snapshot-controller, sidecar or kubelet runs:
// what is tested is what the workload-controller writes (a content's label, a pod's affinity)
// and where the real scheduler then puts the pod's claims.
package snapshots_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/ids"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/pkg/workloads/placement"
	"github.com/cistern-csi/cistern/pkg/workloads/snapshotnode"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

func TestMain(m *testing.M) {
	os.Exit(framework.RunShared(m, testutil.ControlPlane))
}

var (
	rendered testutil.Rendered
	// cl is an admin client with the controller's scheme.
	cl client.Client
)

// install renders deploy/csi with the snapshots component, installs Cistern's and the
// VolumeSnapshot CRDs and the rendered RBAC, and starts the controller with --snapshot-contents
// when the rendered Deployment has it; once per binary.
func install(t *testing.T) *framework.ControlPlane {
	t.Helper()
	return framework.SharedSetup(t, func(cp *framework.ControlPlane) error {
		var err error
		if rendered, err = testutil.RenderWithRBAC(t, cp, "snapshots"); err != nil {
			return err
		}
		snapshotCRDs, err := testutil.SnapshotCRDs(framework.RepoRoot())
		if err != nil {
			return err
		}
		for _, dir := range []string{filepath.Join(framework.RepoRoot(), "deploy", "csi", "crds"), snapshotCRDs} {
			if err := testutil.InstallCRDs(cp.Config, dir); err != nil {
				return err
			}
		}
		if cl, err = client.New(cp.Config, client.Options{Scheme: workloads.Scheme()}); err != nil {
			return err
		}
		wc, err := testutil.ControllerConfig(func(wc *workloads.Config) {
			wc.SnapshotContents = slices.Contains(controllerArgs(), "--snapshot-contents")
		})
		if err != nil {
			return err
		}
		return testutil.StartController(framework.ServiceAccountConfig(t, cp, testutil.ControllerNamespace, testutil.ControllerSA), wc)
	})
}

// controllerArgs are the args of the rendered workload-controller Deployment.
func controllerArgs() []string {
	var args []string
	for _, d := range rendered["Deployment"] {
		if d["metadata"].(map[string]any)["name"] != "cistern-workload-controller" {
			continue
		}
		spec := d["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		for _, c := range spec["containers"].([]any) {
			for _, a := range c.(map[string]any)["args"].([]any) {
				args = append(args, a.(string))
			}
		}
	}
	return args
}

// TestComponentTurnsOnSnapshotContents: the component sets the flag; the base alone does not.
func TestComponentTurnsOnSnapshotContents(t *testing.T) {
	install(t)
	if !slices.Contains(controllerArgs(), "--snapshot-contents") {
		t.Errorf("rendered workload-controller args %v lack --snapshot-contents", controllerArgs())
	}
	base, err := testutil.Render(framework.Binary(t, "kubectl"), framework.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range base["ClusterRole"] {
		name := role["metadata"].(map[string]any)["name"].(string)
		if strings.HasPrefix(name, "cistern-workload-controller") && strings.Contains(fmt.Sprint(role["rules"]), "snapshot.storage.k8s.io") {
			t.Errorf("the base alone grants the workload-controller snapshot permissions (ClusterRole %s)", name)
		}
	}
	s, err := base.YAML("Deployment")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s, "--snapshot-contents") {
		t.Errorf("the base alone turns on --snapshot-contents")
	}
}

func handMade(name, driver, handle string) *snapv1.VolumeSnapshotContent {
	return &snapv1.VolumeSnapshotContent{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: snapv1.VolumeSnapshotContentSpec{
			Driver: driver, DeletionPolicy: snapv1.VolumeSnapshotContentRetain,
			Source:            snapv1.VolumeSnapshotContentSource{SnapshotHandle: ptr.To(handle)},
			VolumeSnapshotRef: corev1.ObjectReference{Namespace: "default", Name: name},
		},
	}
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := cl.Create(testutil.Context(t), o); err != nil {
		t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), o) })
}

// TestHandMadeContentsGetTheirNode: a pre-provisioned content of the driver is labelled with the
// node its snapshot handle names; another driver's is not; one whose handle names no node gets a
// Warning Event saying what to do.
func TestHandMadeContentsGetTheirNode(t *testing.T) {
	install(t)
	foreign := handMade("foreign-content", "other.csi.dev", ids.NewSnapshotID("fast", "node-b"))
	nameless := handMade("nameless-content", consts.DriverName, "fast-snap-"+ids.RandomHex())
	ours := handMade("our-content", consts.DriverName, ids.NewSnapshotID("fast", "node-b"))
	for _, c := range []client.Object{foreign, nameless, ours} {
		create(t, c)
	}
	testutil.Eventually(t, 30*time.Second, "content labelled with its node", func() error {
		var got snapv1.VolumeSnapshotContent
		if err := cl.Get(testutil.Context(t), client.ObjectKeyFromObject(ours), &got); err != nil {
			return err
		}
		if l := got.Labels[consts.LabelSnapshotManagedBy]; l != "node-b" {
			return fmt.Errorf("label %q", l)
		}
		return nil
	})
	testutil.Eventually(t, 30*time.Second, "a Warning Event on the content whose handle names no node", func() error {
		var events eventsv1.EventList
		if err := cl.List(testutil.Context(t), &events, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.Regarding.Name == nameless.Name && e.Regarding.Kind == "VolumeSnapshotContent" && e.Type == corev1.EventTypeWarning && e.Reason == snapshotnode.ReasonNoNode {
				t.Logf("event: %s", e.Note)
				return nil
			}
		}
		return fmt.Errorf("none among %d events", len(events.Items))
	})
	for _, c := range []*snapv1.VolumeSnapshotContent{foreign, nameless} {
		var got snapv1.VolumeSnapshotContent
		if err := cl.Get(testutil.Context(t), client.ObjectKeyFromObject(c), &got); err != nil {
			t.Fatal(err)
		}
		if l, ok := got.Labels[consts.LabelSnapshotManagedBy]; ok {
			t.Errorf("%s labelled %q", c.Name, l)
		}
	}
}

// TestRestoresLandOnTheSourceNode: a pod whose claim restores a snapshot of node B, or clones a
// volume of node A, is required to run there by the webhook, and the scheduler picks that node
// for the claim (the node the provisioner then makes the volume on).
func TestRestoresLandOnTheSourceNode(t *testing.T) {
	cp := install(t)
	ns := framework.CreateNamespace(t, cp, "restore")
	nodeA, nodeB := "restore-node-a", "restore-node-b"
	framework.CreateNode(t, cp, nodeA, nil)
	framework.CreateNode(t, cp, nodeB, nil)
	create(t, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "cistern-restore"}, Provisioner: consts.DriverName,
		Parameters: map[string]string{consts.ParamPool: "fast"}, VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)})

	// A pre-provisioned snapshot on node B (no snapshot-controller runs: the snapshot names its
	// content, as a user writes it)...
	content := handMade("restore-content", consts.DriverName, ids.NewSnapshotID("fast", nodeB))
	content.Spec.VolumeSnapshotRef = corev1.ObjectReference{Namespace: ns, Name: "snap"}
	create(t, content)
	create(t, &snapv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "snap"},
		Spec: snapv1.VolumeSnapshotSpec{Source: snapv1.VolumeSnapshotSource{VolumeSnapshotContentName: ptr.To(content.Name)}}})
	// ... and a volume on node A, its claim bound.
	create(t, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "restore-source-" + ns}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		StorageClassName:              "cistern-restore",
		ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: "source"},
		PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: consts.DriverName, VolumeHandle: ids.NewVolumeID("fast")}},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{placement.Requirement([]string{nodeA})}}}}},
	}})
	source := newClaim(ns, "source", nil)
	source.Spec.VolumeName = "restore-source-" + ns
	create(t, source)

	for _, tc := range []struct {
		name, node string
		ref        corev1.TypedObjectReference
	}{
		{"restore of a snapshot on node B", nodeB, corev1.TypedObjectReference{APIGroup: ptr.To(snapv1.GroupName), Kind: "VolumeSnapshot", Name: "snap"}},
		{"clone of a volume on node A", nodeA, corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "source"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("to-%s", tc.node)
			pvc := newClaim(ns, name, &tc.ref)
			create(t, pvc)
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause:test"}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
			}}
			create(t, pod)
			want := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{placement.Requirement([]string{tc.node})}}}}
			if a := pod.Spec.Affinity; a == nil || a.NodeAffinity == nil || !equality.Semantic.DeepEqual(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution, want) {
				t.Fatalf("admitted pod's affinity %+v, want required %+v", a, want)
			}
			testutil.Eventually(t, time.Minute, "the scheduler selecting the source's node for the claim", func() error {
				var got corev1.PersistentVolumeClaim
				if err := cl.Get(testutil.Context(t), client.ObjectKeyFromObject(pvc), &got); err != nil {
					return err
				}
				if n := got.Annotations["volume.kubernetes.io/selected-node"]; n != tc.node {
					return fmt.Errorf("selected node %q", n)
				}
				return nil
			})
		})
	}

	t.Run("generic ephemeral volume restoring the snapshot", func(t *testing.T) {
		ref := corev1.TypedObjectReference{APIGroup: ptr.To(snapv1.GroupName), Kind: "VolumeSnapshot", Name: "snap"}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ephemeral"}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause:test"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
				VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: newClaim(ns, "", &ref).Spec}}}}},
		}}
		create(t, pod)
		if a := pod.Spec.Affinity; a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
			!slices.Equal(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Values, []string{nodeB}) {
			t.Fatalf("admitted pod's affinity %+v, want required %s", a, nodeB)
		}
	})
}

func newClaim(ns, name string, ref *corev1.TypedObjectReference) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
		StorageClassName: ptr.To("cistern-restore"), AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:     corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		DataSourceRef: ref,
	}}
}
