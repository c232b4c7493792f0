package workloads_test

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/workloads/volumemanager"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

// datasetID is the ID the driver gives a volume config's dataset.
func datasetID(t *testing.T, vc *datav1alpha1.VolumeConfig) string {
	t.Helper()
	attrs, err := volumemanager.DatasetAttributes(vc, volumemanager.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := params.Parse(attrs, params.StaticPV)
	if err != nil {
		t.Fatal(err)
	}
	return pl.Dataset.ID()
}

// stagers lists the VolumeManager's stager pods by the node they stage on.
func stagers(t *testing.T, ns string) map[string]corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := cl.List(testutil.Context(t), &pods, client.InNamespace(ns), client.MatchingLabels{volumemanager.LabelStager: "true"}); err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Annotations[volumemanager.AnnotationStagerNode]] = p
		}
	}
	return out
}

// publishInventory plays the node's storagepool-sidecar: the node's pool and what its cache
// holds (labelled Ready as the sidecar labels it).
func publishInventory(t *testing.T, node, ds string, state spapi.DatasetState, reason string) {
	t.Helper()
	ctx := testutil.Context(t)
	sp := &spapi.StoragePool{
		ObjectMeta: metav1.ObjectMeta{Name: "fast." + node, Labels: map[string]string{consts.LabelNode: node}},
		Spec:       spapi.StoragePoolSpec{Driver: consts.DriverName},
	}
	if state == spapi.DatasetReady {
		sp.Labels[consts.LabelDatasetPrefix+ds] = "true"
	}
	var cur spapi.StoragePool
	if err := cl.Get(ctx, client.ObjectKeyFromObject(sp), &cur); err == nil {
		cur.Labels = sp.Labels
		if err := cl.Update(ctx, &cur); err != nil {
			t.Fatal(err)
		}
		sp = &cur
	} else {
		if err := cl.Create(ctx, sp); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Delete(testutil.Context(t), sp) })
	}
	done := int64(64 << 20)
	if state != spapi.DatasetReady {
		done = 1 << 20
	}
	sp.Status = spapi.StoragePoolStatus{
		AccessibleNodes: []string{node},
		Capacity:        &spapi.PoolCapacity{Total: resource.NewQuantity(100<<30, resource.BinarySI), Available: resource.NewQuantity(50<<30, resource.BinarySI)},
		Cache: &spapi.DatasetCache{Total: 1, Datasets: []spapi.CachedDataset{{ID: ds, State: state, Reason: reason,
			Tenant: true, BytesDone: done, BytesTotal: 64 << 20}}},
	}
	if err := cl.Status().Update(ctx, sp); err != nil {
		t.Fatal(err)
	}
}

// stagerRan plays kubelet: the node's stager pod mounted its volume and exited 0.
func stagerRan(t *testing.T, ns, node string) {
	t.Helper()
	var pod corev1.Pod
	testutil.Eventually(t, time.Minute, "stager pod scheduled on "+node, func() error {
		p, ok := stagers(t, ns)[node]
		if !ok || p.Spec.NodeName == "" {
			return fmt.Errorf("stager pods %v", stagers(t, ns))
		}
		pod = p
		return nil
	})
	now := metav1.Now()
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.StartTime = &now
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "stage", Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}}}}
	if err := cl.Status().Update(testutil.Context(t), &pod); err != nil {
		t.Fatal(err)
	}
}

func nodeStates(v datav1alpha1.Volume) map[string]datav1alpha1.NodeState {
	out := map[string]datav1alpha1.NodeState{}
	for _, n := range v.Nodes {
		out[n.Name] = n.State
	}
	return out
}

// TestVolumeManager: a dataset wanted on two of three GPU nodes gets a static volume of the
// Cistern driver pinned to two eligible nodes, a claim the PV binder binds, and a least-privilege
// stager pod on each node that the real scheduler binds there. The VolumeManager turns Ready only
// once each stager ran and each node's StoragePool says the data is Ready; the stagers are then
// deleted and a StoragePool change writes nothing. A drained node is replaced: the third GPU node
// is staged first, and the claim users were given serves until it is Ready. Deleting the
// VolumeManager releases everything. (kubelet and the node's inventory are played by the test;
// test/e2enode runs the real ones.)
func TestVolumeManager(t *testing.T) {
	cp, ns, ctx := setupNamespace(t, "vm")
	// The taint keeps LeaderWorkerSet pods of other tests off these nodes.
	vmTaint := corev1.Taint{Key: "test.cistern.dev/vm", Effect: corev1.TaintEffectNoSchedule}
	var gpuNodes []string
	for i := range 3 {
		n := fmt.Sprintf("%s-gpu-%d", ns, i)
		framework.CreateNode(t, cp, n, map[string]string{"test.cistern.dev/gpu": "true"}, vmTaint)
		gpuNodes = append(gpuNodes, n)
	}
	framework.CreateNode(t, cp, ns+"-cpu", nil, vmTaint)

	imagenet := datav1alpha1.VolumeConfig{
		ID: "imagenet", Replicas: 2, SourceType: datav1alpha1.SourceS3, SourceURL: "s3://datasets/imagenet",
		Options: map[string]string{"endpoint": "http://127.0.0.1:7070", "pathStyle": "true", "secretName": "s3-creds"},
		NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: "test.cistern.dev/gpu", Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}}}}},
		Tolerations: []corev1.Toleration{{Key: "test.cistern.dev/vm", Operator: corev1.TolerationOpExists}},
	}
	ds := datasetID(t, &imagenet)
	vm := &datav1alpha1.VolumeManager{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data"},
		Spec: datav1alpha1.VolumeManagerSpec{VolumeConfigs: []datav1alpha1.VolumeConfig{
			imagenet,
			{ID: "escape", Replicas: 1, SourceType: datav1alpha1.SourceLocal, SourceURL: "file:///etc"},
		}},
	}
	if err := cl.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	var got datav1alpha1.VolumeManager
	var chosen []string
	testutil.Eventually(t, time.Minute, "imagenet placed on two GPU nodes, stager pods scheduled there; escape refused", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			return err
		}
		if len(got.Status.Volumes) != 2 {
			return fmt.Errorf("status %+v", got.Status)
		}
		v := got.Status.Volumes[0]
		if len(v.Nodes) != 2 || v.VolumeSource.PersistentVolumeClaim == nil {
			return fmt.Errorf("imagenet: %+v", v)
		}
		chosen = nil
		for _, n := range v.Nodes {
			if n.State != datav1alpha1.NodeStaging || !strings.Contains(n.Message, "mounting") {
				return fmt.Errorf("node %+v", n)
			}
			chosen = append(chosen, n.Name)
		}
		return nil
	})
	v, esc := got.Status.Volumes[0], got.Status.Volumes[1]
	for _, n := range chosen {
		if !slices.Contains(gpuNodes, n) {
			t.Errorf("data placed on %s, not a GPU node", n)
		}
		pod := stagers(t, ns)[n]
		if pod.Spec.NodeName != n || pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != v.VolumeSource.PersistentVolumeClaim.ClaimName ||
			*pod.Spec.AutomountServiceAccountToken || len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].Name != "data" {
			t.Errorf("stager pod on %s: %+v", n, pod)
		}
	}
	if got.Status.State != datav1alpha1.StateFailed || !strings.Contains(esc.Message, `path "/etc" is not under an allowed root`) {
		t.Errorf("Local source outside the roots: state %s, %+v", got.Status.State, esc)
	}
	if terms := v.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms; len(terms) != 1 ||
		terms[0].MatchExpressions[0].Key != consts.TopologyKey || !slices.Equal(terms[0].MatchExpressions[0].Values, chosen) {
		t.Errorf("nodeAffinity %+v", v.NodeAffinity)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionPlaced); c == nil || c.Status != metav1.ConditionFalse || c.Reason != datav1alpha1.ReasonInvalid {
		t.Errorf("Placed with an invalid volume: %+v", c)
	}

	var pv corev1.PersistentVolume
	testutil.Eventually(t, time.Minute, "one PV", func() error {
		var pvs corev1.PersistentVolumeList
		if err := cl.List(ctx, &pvs, client.MatchingLabels{volumemanager.LabelManager: "data", volumemanager.LabelNamespace: ns}); err != nil {
			return err
		}
		if len(pvs.Items) != 1 {
			return fmt.Errorf("%d PVs", len(pvs.Items))
		}
		pv = pvs.Items[0]
		return nil
	})
	if pv.Spec.CSI.Driver != consts.DriverName || pv.Spec.CSI.VolumeAttributes[consts.ParamSource] != "s3://datasets/imagenet" ||
		pv.Spec.CSI.VolumeAttributes[consts.ParamEndpoint] != "http://127.0.0.1:7070" || pv.Spec.CSI.VolumeAttributes[consts.ParamPathStyle] != "true" ||
		pv.Spec.CSI.VolumeAttributes[consts.ParamCapacity] != "1Gi" ||
		pv.Spec.CSI.NodeStageSecretRef == nil || pv.Spec.CSI.NodeStageSecretRef.Name != "s3-creds" || pv.Spec.CSI.NodeStageSecretRef.Namespace != ns {
		t.Errorf("PV CSI source %+v", pv.Spec.CSI)
	}

	// Drop the invalid volume; stage imagenet on one node: Pending. Then on the other: Ready.
	mark := markReconciles(t, "volumemanager")
	got.Spec.VolumeConfigs = got.Spec.VolumeConfigs[:1]
	if err := cl.Update(ctx, &got); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "Pending, the node Staging", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			return err
		}
		n := got.Status.Volumes[0].Nodes[0]
		if n.State != datav1alpha1.NodeStaging || got.Status.State != datav1alpha1.StatePending {
			return fmt.Errorf("%s: %+v", got.Status.State, n)
		}
		return nil
	})
	mark.wait(t, "dropping the invalid volume")
	// The node's cache stages the same source: before this VolumeManager's stager mounted its
	// claim there, that may be another tenant's staging, and nothing of it shows. Once the
	// controller has reconciled the StoragePool change, the VolumeManager is as it was: not
	// written at all, so no progress in it.
	if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
		t.Fatal(err)
	}
	rv := got.ResourceVersion
	mark = markReconciles(t, "volumemanager")
	publishInventory(t, chosen[0], ds, spapi.DatasetStaging, "")
	mark.wait(t, "another staging in the node's inventory")
	if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
		t.Fatal(err)
	}
	if n := got.Status.Volumes[0].Nodes[0]; got.ResourceVersion != rv || n.State != datav1alpha1.NodeStaging ||
		n.BytesDone != 0 || n.BytesTotal != 0 || strings.Contains(n.Message, " of ") {
		t.Errorf("another staging's inventory read before the stager ran: written %s -> %s, %+v", rv, got.ResourceVersion, n)
	}
	publishInventory(t, chosen[0], ds, spapi.DatasetReady, "")
	stagerRan(t, ns, chosen[0])
	testutil.Eventually(t, time.Minute, "first node Ready, the VolumeManager not yet", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			return err
		}
		if st := nodeStates(got.Status.Volumes[0]); st[chosen[0]] != datav1alpha1.NodeReady || st[chosen[1]] == datav1alpha1.NodeReady || got.Status.State != datav1alpha1.StatePending {
			return fmt.Errorf("%s %v", got.Status.State, st)
		}
		return nil
	})
	publishInventory(t, chosen[1], ds, spapi.DatasetReady, "")
	stagerRan(t, ns, chosen[1])
	testutil.Eventually(t, time.Minute, "Ready on both nodes; stager pods gone", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			return err
		}
		if got.Status.State != datav1alpha1.StateRunning {
			return fmt.Errorf("%s: %s", got.Status.State, got.Status.Message)
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionDataReady); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("DataReady %+v", c)
		}
		if s := stagers(t, ns); len(s) > 0 {
			return fmt.Errorf("%d stager pods left", len(s))
		}
		return nil
	})

	var third string
	for _, n := range gpuNodes {
		if !slices.Contains(chosen, n) {
			third = n
		}
	}
	// At rest, a StoragePool change reconciles the VolumeManager without writing it. On the node
	// it does not use: publishInventory replaces a node's inventory, and on a chosen node that
	// would take the dataset away.
	rv = got.ResourceVersion
	mark = markReconciles(t, "volumemanager")
	publishInventory(t, third, "other", spapi.DatasetReady, "")
	mark.wait(t, "a StoragePool change")
	if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != rv {
		t.Errorf("VolumeManager written at rest: %s -> %s (%+v)", rv, got.ResourceVersion, got.Status)
	}

	// Drain one node: the third GPU node is staged first while the old claim keeps serving.
	oldClaim := got.Status.Volumes[0].VolumeSource.PersistentVolumeClaim.ClaimName
	var drained corev1.Node
	if err := cl.Get(ctx, client.ObjectKey{Name: chosen[1]}, &drained); err != nil {
		t.Fatal(err)
	}
	drained.Spec.Unschedulable = true
	if err := cl.Update(ctx, &drained); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "staging on "+third+" while the old claim serves", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			return err
		}
		v := got.Status.Volumes[0]
		if _, ok := stagers(t, ns)[third]; !ok || v.VolumeSource.PersistentVolumeClaim.ClaimName != oldClaim ||
			nodeStates(v)[chosen[1]] != datav1alpha1.NodeReady || !strings.Contains(v.Message, "moving from") {
			return fmt.Errorf("%+v", v)
		}
		return nil
	})
	publishInventory(t, third, ds, spapi.DatasetReady, "")
	stagerRan(t, ns, third)
	testutil.Eventually(t, time.Minute, "moved to "+third+"; old claim released", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			return err
		}
		v := got.Status.Volumes[0]
		st := nodeStates(v)
		if v.VolumeSource.PersistentVolumeClaim.ClaimName == oldClaim || len(st) != 2 || st[third] != datav1alpha1.NodeReady || got.Status.State != datav1alpha1.StateRunning {
			return fmt.Errorf("%s %+v", got.Status.State, v)
		}
		var c corev1.PersistentVolumeClaim
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: oldClaim}, &c); err == nil {
			return fmt.Errorf("old claim %s still there", oldClaim)
		}
		return nil
	})

	if err := cl.Delete(ctx, vm); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "VolumeManager, claims and PVs released", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err == nil {
			return fmt.Errorf("VolumeManager still there (finalizers %v)", got.Finalizers)
		}
		var pvs corev1.PersistentVolumeList
		if err := cl.List(ctx, &pvs, client.MatchingLabels{volumemanager.LabelManager: "data", volumemanager.LabelNamespace: ns}); err != nil || len(pvs.Items) > 0 {
			return fmt.Errorf("PVs left: %v %d", err, len(pvs.Items))
		}
		var pvcs corev1.PersistentVolumeClaimList
		if err := cl.List(ctx, &pvcs, client.InNamespace(ns)); err != nil || len(pvcs.Items) > 0 {
			return fmt.Errorf("claims left: %v %d", err, len(pvcs.Items))
		}
		return nil
	})
}

// nodeOfOwn creates a node that only the returned volume (one replica of s3://datasets/<id>)
// schedules to: tainted, and named by the volume's node affinity.
func nodeOfOwn(t *testing.T, cp *framework.ControlPlane, ns, id string) (string, datav1alpha1.VolumeConfig) {
	t.Helper()
	label := "test.cistern.dev/" + ns
	node := ns + "-node"
	framework.CreateNode(t, cp, node, map[string]string{label: "true"},
		corev1.Taint{Key: "test.cistern.dev/vm", Effect: corev1.TaintEffectNoSchedule})
	return node, datav1alpha1.VolumeConfig{ID: id, Replicas: 1, SourceType: datav1alpha1.SourceS3, SourceURL: "s3://datasets/" + id,
		NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: label, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}}}}},
		Tolerations: []corev1.Toleration{{Key: "test.cistern.dev/vm", Operator: corev1.TolerationOpExists}}}
}

// TestVolumeManagerTooLarge: a dataset larger than the capacity fails staging on the node; the
// VolumeManager turns Failed with kubelet's message, which carries both sizes, a DataReady
// condition saying StagingFailed, and a Warning Event.
func TestVolumeManagerTooLarge(t *testing.T) {
	cp, ns, ctx := setupNamespace(t, "vmbig")
	node, vc := nodeOfOwn(t, cp, ns, "big")
	capacity := resource.MustParse("1Mi")
	vc.Capacity, vc.AccessMode = &capacity, corev1.ReadWriteOnce
	vm := &datav1alpha1.VolumeManager{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "big"},
		Spec: datav1alpha1.VolumeManagerSpec{VolumeConfigs: []datav1alpha1.VolumeConfig{vc}}}
	if err := cl.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	testutil.Eventually(t, time.Minute, "stager pod scheduled", func() error {
		p, ok := stagers(t, ns)[node]
		if !ok || p.Spec.NodeName == "" {
			return fmt.Errorf("no scheduled stager pod")
		}
		pod = p
		return nil
	})
	// What kubelet reports when NodeStageVolume fails, and what the node's inventory says.
	msg := `MountVolume.MountDevice failed for volume "x" : rpc error: code = OutOfRange desc = dataset s3://datasets/big: it holds 64 MiB (64 MiB on disk), more than the 1 MiB the volume has room for`
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: pod.Name + ".failedmount"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
		Reason:         "FailedMount", Message: msg, Type: corev1.EventTypeWarning, Source: corev1.EventSource{Component: "kubelet", Host: node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := cl.Create(ctx, ev); err != nil {
		t.Fatal(err)
	}
	publishInventory(t, node, datasetID(t, &vc), spapi.DatasetFailed, "TooLarge")
	var got datav1alpha1.VolumeManager
	testutil.Eventually(t, time.Minute, "Failed with both sizes", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionDataReady)
		if got.Status.State != datav1alpha1.StateFailed || !strings.Contains(got.Status.Message, "64 MiB") || !strings.Contains(got.Status.Message, "1 MiB") ||
			c == nil || c.Reason != datav1alpha1.ReasonStagingFailed {
			return fmt.Errorf("%s: %s (%+v)", got.Status.State, got.Status.Message, c)
		}
		return nil
	})
	testutil.Eventually(t, time.Minute, "a Warning Event on the VolumeManager", func() error {
		var evs corev1.EventList
		if err := cl.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "big" && e.Reason == datav1alpha1.ReasonStagingFailed && e.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("no StagingFailed event among %d", len(evs.Items))
	})
	if err := cl.Delete(ctx, vm); err != nil {
		t.Fatal(err)
	}
}

// kubectlWait runs kubectl wait on a VolumeManager, as a client written against the KVC API would.
func kubectlWait(t *testing.T, cp *framework.ControlPlane, ns, name, condition string) {
	t.Helper()
	out, err := exec.Command(framework.Binary(t, "kubectl"), "--kubeconfig", cp.Kubeconfig, "-n", ns, "wait",
		"volumemanager/"+name, "--for="+condition, "--timeout=60s").CombinedOutput()
	if err != nil {
		var got datav1alpha1.VolumeManager
		_ = cl.Get(testutil.Context(t), client.ObjectKey{Namespace: ns, Name: name}, &got)
		t.Fatalf("kubectl wait --for=%s: %v\n%s\nstatus %+v", condition, err, out, got.Status)
	}
}

// TestVolumeManagerLifecycle: a VolumeManager goes Pending -> Running -> Completed, each step
// awaited with kubectl wait on status.state. Running once its data is on its node (condition
// Ready too); InUse while a pod uses its claim; spec.state Completed keeps the claim while that
// pod runs (the API server's claim protection) and the state Running, then releases the claim and
// the volume once the pod is gone: Completed, which is final. Each step is an Event.
func TestVolumeManagerLifecycle(t *testing.T) {
	cp := setup(t)
	ns := framework.CreateNamespace(t, cp, "vmlife")
	ctx := testutil.Context(t)
	node, vc := nodeOfOwn(t, cp, ns, "ckpt")
	vm := &datav1alpha1.VolumeManager{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "life"},
		Spec: datav1alpha1.VolumeManagerSpec{VolumeConfigs: []datav1alpha1.VolumeConfig{vc}}}
	if err := cl.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	kubectlWait(t, cp, ns, "life", "jsonpath={.status.state}=Pending")

	publishInventory(t, node, datasetID(t, &vc), spapi.DatasetReady, "")
	stagerRan(t, ns, node)
	kubectlWait(t, cp, ns, "life", "jsonpath={.status.state}=Running")
	kubectlWait(t, cp, ns, "life", "condition=Ready")

	// A pod uses the claim (kubelet played: bound to the node and running).
	var got datav1alpha1.VolumeManager
	if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
		t.Fatal(err)
	}
	claim := got.Status.Volumes[0].VolumeSource.PersistentVolumeClaim.ClaimName
	user := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "train"}, Spec: corev1.PodSpec{
		NodeName:   node,
		Containers: []corev1.Container{{Name: "train", Image: "train:1"}},
		Volumes: []corev1.Volume{{Name: "ckpt", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	if err := cl.Create(ctx, user); err != nil {
		t.Fatal(err)
	}
	user.Status.Phase = corev1.PodRunning
	if err := cl.Status().Update(ctx, user); err != nil {
		t.Fatal(err)
	}
	kubectlWait(t, cp, ns, "life", "condition=InUse")

	// Completed asked while the pod runs: the claim stays (protected), the state Running.
	patch := exec.Command(framework.Binary(t, "kubectl"), "--kubeconfig", cp.Kubeconfig, "-n", ns, "patch", "volumemanager/life",
		"--type=merge", "-p", `{"spec":{"state":"Completed"}}`)
	if out, err := patch.CombinedOutput(); err != nil {
		t.Fatalf("kubectl patch spec.state Completed: %v\n%s", err, out)
	}
	testutil.Eventually(t, time.Minute, "completing: claim kept while the pod uses it", func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionCompleted)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != datav1alpha1.ReasonCompleting ||
			got.Status.State != datav1alpha1.StateRunning || !strings.Contains(got.Status.Message, "pod train") {
			return fmt.Errorf("%s: %s (%+v)", got.Status.State, got.Status.Message, c)
		}
		var pvc corev1.PersistentVolumeClaim
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: claim}, &pvc); err != nil {
			return fmt.Errorf("claim: %v", err)
		}
		if pvc.DeletionTimestamp == nil {
			return fmt.Errorf("claim %s not being deleted", claim)
		}
		return nil
	})
	if c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Ready while completing: %+v", c)
	}

	// The pod ends (kubelet played: it confirms the deletion at once): everything is released.
	if err := cl.Delete(ctx, user, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	kubectlWait(t, cp, ns, "life", "jsonpath={.status.state}=Completed")
	kubectlWait(t, cp, ns, "life", "condition=Completed")
	var pvs corev1.PersistentVolumeList
	var pvcs corev1.PersistentVolumeClaimList
	if err := cl.List(ctx, &pvs, client.MatchingLabels{volumemanager.LabelManager: "life", volumemanager.LabelNamespace: ns}); err != nil {
		t.Fatal(err)
	}
	if err := cl.List(ctx, &pvcs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(pvs.Items)+len(pvcs.Items)+len(stagers(t, ns)) != 0 {
		t.Errorf("left once Completed: %d PVs, %d claims, %d stager pods", len(pvs.Items), len(pvcs.Items), len(stagers(t, ns)))
	}

	// Completed is final.
	back := exec.Command(framework.Binary(t, "kubectl"), "--kubeconfig", cp.Kubeconfig, "-n", ns, "patch", "volumemanager/life",
		"--type=merge", "-p", `{"spec":{"state":"Running"}}`)
	if out, err := back.CombinedOutput(); err == nil || !strings.Contains(string(out), "Completed is final") {
		t.Errorf("spec.state Completed -> Running: %v\n%s", err, out)
	}

	// Each step an Event, reason the state (condition Ready) or the release (condition Completed).
	testutil.Eventually(t, time.Minute, "an Event per step", func() error {
		var evs corev1.EventList
		if err := cl.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "life" {
				seen[e.Reason+"/"+e.Action] = true
			}
		}
		for _, want := range []string{"Pending/Ready", "Running/Ready", "PodsUsing/InUse", "Completing/Ready", "Completing/Completed",
			"Released/Completed", "Completed/Ready"} {
			if !seen[want] {
				return fmt.Errorf("no %s Event among %v", want, seen)
			}
		}
		return nil
	})
	if err := cl.Delete(ctx, vm); err != nil {
		t.Fatal(err)
	}
}
