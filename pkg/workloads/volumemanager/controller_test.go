package volumemanager

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/params"
)

// fixture is a reconciler on a fake client, with helpers to play the nodes' part.
type fixture struct {
	t   *testing.T
	c   client.Client
	r   *Reconciler
	vm  *datav1alpha1.VolumeManager
	ds  string // the volume's dataset ID
	ctx context.Context
}

func newFixture(t *testing.T, vc datav1alpha1.VolumeConfig, objs ...client.Object) *fixture {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = datav1alpha1.AddToScheme(scheme)
	_ = spapi.AddToScheme(scheme)
	vm := &datav1alpha1.VolumeManager{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"},
		Spec:       datav1alpha1.VolumeManagerSpec{VolumeConfigs: []datav1alpha1.VolumeConfig{vc}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(append(objs, vm)...).WithStatusSubresource(vm).Build()
	attrs, err := DatasetAttributes(&vc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := params.Parse(attrs, params.StaticPV)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, c: c, r: &Reconciler{Client: c, Config: Config{StagerImage: "stager:1"}}, vm: vm, ds: pl.Dataset.ID(), ctx: context.Background()}
}

func (f *fixture) reconcile() *datav1alpha1.VolumeManager {
	f.t.Helper()
	if _, err := f.r.Reconcile(f.ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(f.vm)}); err != nil {
		f.t.Fatal(err)
	}
	var got datav1alpha1.VolumeManager
	if err := f.c.Get(f.ctx, client.ObjectKeyFromObject(f.vm), &got); err != nil {
		f.t.Fatal(err)
	}
	return &got
}

func (f *fixture) count() (pvs, pvcs int, stagers map[string]*corev1.Pod) {
	var pvl corev1.PersistentVolumeList
	var pvcl corev1.PersistentVolumeClaimList
	var pods corev1.PodList
	_ = f.c.List(f.ctx, &pvl)
	_ = f.c.List(f.ctx, &pvcl)
	_ = f.c.List(f.ctx, &pods, client.MatchingLabels{LabelStager: "true"})
	stagers = map[string]*corev1.Pod{}
	for i := range pods.Items {
		stagers[pods.Items[i].Annotations[AnnotationStagerNode]] = &pods.Items[i]
	}
	return len(pvl.Items), len(pvcl.Items), stagers
}

// nodeDone plays kubelet and the node's StoragePool publisher: the stager pod ran, and the
// node's cache holds the dataset Ready.
func (f *fixture) nodeDone(node string) {
	f.t.Helper()
	_, _, stagers := f.count()
	pod := stagers[node]
	if pod == nil {
		f.t.Fatalf("no stager pod on %s", node)
	}
	pod.Status.Phase = corev1.PodSucceeded
	if err := f.c.Status().Update(f.ctx, pod); err != nil {
		f.t.Fatal(err)
	}
	if err := f.c.Create(f.ctx, storagePool(node, 10<<30, f.ds, spapi.DatasetReady)); err != nil {
		f.t.Fatal(err)
	}
}

func storagePool(node string, free int64, ds string, state spapi.DatasetState) *spapi.StoragePool {
	sp := &spapi.StoragePool{
		ObjectMeta: metav1.ObjectMeta{Name: "fast." + node, Labels: map[string]string{consts.LabelNode: node}},
		Spec:       spapi.StoragePoolSpec{Driver: consts.DriverName},
		Status: spapi.StoragePoolStatus{AccessibleNodes: []string{node},
			Capacity: &spapi.PoolCapacity{Available: resource.NewQuantity(free, resource.BinarySI)}},
	}
	if ds != "" {
		sp.Status.Cache = &spapi.DatasetCache{Datasets: []spapi.CachedDataset{{ID: ds, State: state, BytesDone: 5, BytesTotal: 10, Reason: "TooLarge"}}}
		if state == spapi.DatasetReady {
			sp.Labels[consts.LabelDatasetPrefix+ds] = "true"
			sp.Status.Cache.Datasets[0].BytesDone = 10
		}
	}
	return sp
}

func nodeStates(v datav1alpha1.Volume) string {
	var out []string
	for _, n := range v.Nodes {
		out = append(out, n.Name+"="+string(n.State))
	}
	return strings.Join(out, ",")
}

// TestReconcilerStagesAhead: the reconciler on a fake client. Nothing is placed until enough
// nodes qualify; then one PV and claim and a stager pod per node; the VolumeManager is Ready only
// once each stager ran and each node's inventory holds the data; the stagers are then deleted and
// later reconciles write nothing. The real API server flow is in test/workloads.
func TestReconcilerStagesAhead(t *testing.T) {
	n1, n2 := node("n1", nil), node("n2", nil)
	f := newFixture(t, datav1alpha1.VolumeConfig{ID: "d", Replicas: 2, SourceType: "S3", SourceURL: "s3://b/p"}, &n1)

	got := f.reconcile()
	if pv, pvc, _ := f.count(); pv != 0 || pvc != 0 || got.Status.State != datav1alpha1.StatePending ||
		!strings.Contains(got.Status.Message, "only 1 of 2 nodes eligible") {
		t.Fatalf("one node: %d PVs, %d claims, status %+v", pv, pvc, got.Status)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionPlaced); c == nil || c.Status != metav1.ConditionFalse || c.Reason != datav1alpha1.ReasonTooFewNodes {
		t.Errorf("Placed: %+v", c)
	}
	if len(got.Finalizers) != 1 {
		t.Errorf("finalizers %v", got.Finalizers)
	}

	if err := f.c.Create(f.ctx, &n2); err != nil {
		t.Fatal(err)
	}
	got = f.reconcile()
	pv, pvc, stagers := f.count()
	if pv != 1 || pvc != 1 || len(stagers) != 2 {
		t.Fatalf("two nodes: %d PVs, %d claims, %d stager pods", pv, pvc, len(stagers))
	}
	v := got.Status.Volumes[0]
	if nodeStates(v) != "n1=Pending,n2=Pending" || got.Status.State != datav1alpha1.StatePending || v.VolumeSource.PersistentVolumeClaim == nil {
		t.Fatalf("status %+v", got.Status)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionDataReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != datav1alpha1.ReasonStaging {
		t.Errorf("DataReady: %+v", c)
	}
	if claim := stagers["n1"].Spec.Volumes[0].PersistentVolumeClaim.ClaimName; claim != v.VolumeSource.PersistentVolumeClaim.ClaimName {
		t.Errorf("stager mounts %s", claim)
	}

	// The data on n1 only: not Ready yet.
	f.nodeDone("n1")
	got = f.reconcile()
	if nodeStates(got.Status.Volumes[0]) != "n1=Ready,n2=Pending" || got.Status.State != datav1alpha1.StatePending {
		t.Fatalf("one node staged: %+v", got.Status)
	}
	f.nodeDone("n2")
	got = f.reconcile()
	if nodeStates(got.Status.Volumes[0]) != "n1=Ready,n2=Ready" || got.Status.State != datav1alpha1.StateRunning {
		t.Fatalf("both staged: %+v", got.Status)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionDataReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("DataReady: %+v", c)
	}
	got = f.reconcile()
	if _, _, stagers := f.count(); len(stagers) != 0 {
		t.Errorf("stager pods left once Ready: %d", len(stagers))
	}
	rv := got.ResourceVersion
	if got = f.reconcile(); got.ResourceVersion != rv || got.Status.State != datav1alpha1.StateRunning {
		t.Errorf("a reconcile at rest wrote the VolumeManager (%s -> %s) or changed its state %s", rv, got.ResourceVersion, got.Status.State)
	}

	// n2 is drained and n3 comes: n3 is staged first on a new claim while the old one serves.
	oldClaim := got.Status.Volumes[0].VolumeSource.PersistentVolumeClaim.ClaimName
	n3 := node("n3", nil)
	if err := f.c.Create(f.ctx, &n3); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Get(f.ctx, client.ObjectKeyFromObject(&n2), &n2); err != nil {
		t.Fatal(err)
	}
	n2.Spec.Unschedulable = true
	if err := f.c.Update(f.ctx, &n2); err != nil {
		t.Fatal(err)
	}
	got = f.reconcile()
	v = got.Status.Volumes[0]
	pv, pvc, stagers = f.count()
	if pv != 2 || pvc != 2 || len(stagers) != 1 || stagers["n3"] == nil || v.VolumeSource.PersistentVolumeClaim.ClaimName != oldClaim ||
		nodeStates(v) != "n1=Ready,n3=Pending,n2=Ready" || !strings.Contains(v.Message, "moving from n1,n2 to n1,n3") {
		t.Fatalf("replacing n2: %d PVs, %d claims, stagers %v, %+v", pv, pvc, stagers, v)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionPlaced); c == nil || c.Reason != datav1alpha1.ReasonReplacingNodes {
		t.Errorf("Placed while replacing: %+v", c)
	}
	f.nodeDone("n3")
	got = f.reconcile()
	v = got.Status.Volumes[0]
	if v.VolumeSource.PersistentVolumeClaim.ClaimName == oldClaim || nodeStates(v) != "n1=Ready,n3=Ready" || got.Status.State != datav1alpha1.StateRunning {
		t.Fatalf("n3 ready: %+v", got.Status)
	}
	f.reconcile() // the old claim went with the switch; its PV goes once the claim is gone
	if pv, pvc, stagers := f.count(); pvc != 1 || pv != 1 || len(stagers) != 0 {
		t.Fatalf("after the move: %d PVs, %d claims, %d stager pods", pv, pvc, len(stagers))
	}
}

// TestReconcilerNoRoom: a node whose pools cannot hold the capacity is never chosen.
func TestReconcilerNoRoom(t *testing.T) {
	n1, n2 := node("n1", nil), node("n2", nil)
	capacity := resource.MustParse("20Gi")
	f := newFixture(t, datav1alpha1.VolumeConfig{ID: "d", Replicas: 2, SourceType: "S3", SourceURL: "s3://b/p", Capacity: &capacity},
		&n1, &n2, storagePool("n1", 100<<30, "", ""), storagePool("n2", 1<<30, "", ""))
	got := f.reconcile()
	if pv, _, _ := f.count(); pv != 0 || !strings.Contains(got.Status.Message, "only 1 of 2 nodes eligible") {
		t.Fatalf("%d PVs, status %+v", pv, got.Status)
	}
}

// TestNodeStatusOf: what each combination of inventory, stager pod and kubelet event says.
func TestNodeStatusOf(t *testing.T) {
	inv := func(st spapi.DatasetState) *NodeInventory {
		return Inventories([]spapi.StoragePool{*storagePool("n", 1<<30, "ds", st)}, consts.DriverName)["n"]
	}
	scheduled := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	done := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}
	tooLarge := "MountVolume.MountDevice failed for volume \"x\" : rpc error: code = OutOfRange desc = dataset s3://b/p: it holds 2 GiB (2 GiB on disk), more than the 1 GiB the volume has room for"
	for _, tc := range []struct {
		name      string
		o         NodeObservation
		want      datav1alpha1.NodeState
		wantInMsg string
	}{
		{name: "nothing yet", o: NodeObservation{}, want: datav1alpha1.NodePending},
		{name: "stager mounting", o: NodeObservation{Stager: scheduled}, want: datav1alpha1.NodeStaging, wantInMsg: "mounting"},
		// Before its stager ran, nothing of the node's cache shows: another tenant may be
		// staging or holding the same source there.
		{name: "failure case - another staging's progress not shown", o: NodeObservation{Stager: scheduled, Inventory: inv(spapi.DatasetStaging)}, want: datav1alpha1.NodeStaging, wantInMsg: "mounting"},
		{name: "re-staging with progress once proved", o: NodeObservation{Proved: true, Inventory: inv(spapi.DatasetStaging)}, want: datav1alpha1.NodeStaging, wantInMsg: "staging: 5 B of 10 B, 50%"},
		{name: "progress is not failure", o: NodeObservation{Stager: scheduled, MountMessage: "rpc error: code = Unavailable desc = staging; retry later"}, want: datav1alpha1.NodeStaging},
		{name: "failure case - cached for someone else: neither Ready nor said before the stager ran", o: NodeObservation{Stager: scheduled, Inventory: inv(spapi.DatasetReady)}, want: datav1alpha1.NodeStaging, wantInMsg: "mounting"},
		{name: "stager ran and data cached", o: NodeObservation{Stager: done, Inventory: inv(spapi.DatasetReady)}, want: datav1alpha1.NodeReady},
		{name: "proved earlier", o: NodeObservation{Proved: true, Inventory: inv(spapi.DatasetReady)}, want: datav1alpha1.NodeReady},
		{name: "evicted since", o: NodeObservation{Proved: true}, want: datav1alpha1.NodePending},
		{name: "stager ran, inventory behind", o: NodeObservation{Stager: done}, want: datav1alpha1.NodeStaging, wantInMsg: "inventory"},
		{name: "failure case - too large, with kubelet's message", o: NodeObservation{Stager: scheduled, Inventory: inv(spapi.DatasetFailed), MountMessage: tooLarge},
			want: datav1alpha1.NodeFailed, wantInMsg: "more than the 1 GiB"},
		{name: "failure case - inventory reason alone, once proved", o: NodeObservation{Proved: true, Inventory: inv(spapi.DatasetFailed)}, want: datav1alpha1.NodeFailed, wantInMsg: "TooLarge"},
		{name: "failure case - another staging's failure not shown", o: NodeObservation{Stager: scheduled, Inventory: inv(spapi.DatasetFailed)}, want: datav1alpha1.NodeStaging, wantInMsg: "mounting"},
		{name: "failure case - secret missing", o: NodeObservation{Stager: scheduled, MountMessage: `MountVolume.MountDevice failed: fetching NodeStageSecretRef ns/creds failed: secrets "creds" not found`},
			want: datav1alpha1.NodeFailed, wantInMsg: "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.ID = "n"
			got := NodeStatusOf("ds", tc.o)
			if got.State != tc.want || !strings.Contains(got.Message, tc.wantInMsg) {
				t.Errorf("got %+v, want %s with %q", got, tc.want, tc.wantInMsg)
			}
		})
	}
}

// TestReconcilerNodeDeleted: the only node holding the data is deleted; the next node is staged
// first, the status says the old one is gone, and the claim moves once the new node is Ready.
func TestReconcilerNodeDeleted(t *testing.T) {
	n1 := node("n1", nil)
	f := newFixture(t, datav1alpha1.VolumeConfig{ID: "d", Replicas: 1, SourceType: "S3", SourceURL: "s3://b/p"}, &n1)
	f.reconcile()
	f.nodeDone("n1")
	f.reconcile()
	got := f.reconcile()
	oldClaim := got.Status.Volumes[0].VolumeSource.PersistentVolumeClaim.ClaimName
	if got.Status.State != datav1alpha1.StateRunning {
		t.Fatalf("status %+v", got.Status)
	}
	n2 := node("n2", nil)
	if err := f.c.Create(f.ctx, &n2); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Delete(f.ctx, &n1); err != nil {
		t.Fatal(err)
	}
	got = f.reconcile()
	v := got.Status.Volumes[0]
	if v.VolumeSource.PersistentVolumeClaim.ClaimName != oldClaim || nodeStates(v) != "n2=Pending,n1=Pending" ||
		v.Nodes[1].Message != "the node is gone" || got.Status.State != datav1alpha1.StatePending {
		t.Fatalf("n1 deleted: %+v", got.Status)
	}
	f.nodeDone("n2")
	got = f.reconcile()
	if v := got.Status.Volumes[0]; v.VolumeSource.PersistentVolumeClaim.ClaimName == oldClaim || nodeStates(v) != "n2=Ready" || got.Status.State != datav1alpha1.StateRunning {
		t.Fatalf("moved to n2: %+v", got.Status)
	}
}

// TestReconcilerLifecycle: Pending while staging, Running once the data is on its node (condition
// Ready true), InUse while a pod uses the claim; spec.state Completed makes nothing new, deletes
// the claim and then the volume, and turns Completed once nothing is left. The fake client has no
// claim protection: test/workloads shows a claim kept while its pod runs.
func TestReconcilerLifecycle(t *testing.T) {
	n1 := node("n1", nil)
	f := newFixture(t, datav1alpha1.VolumeConfig{ID: "d", Replicas: 1, SourceType: "S3", SourceURL: "s3://b/p"}, &n1)
	condition := func(vm *datav1alpha1.VolumeManager, typ string) string {
		c := meta.FindStatusCondition(vm.Status.Conditions, typ)
		if c == nil {
			return "none"
		}
		return string(c.Status) + "/" + c.Reason
	}
	got := f.reconcile()
	if got.Status.State != datav1alpha1.StatePending || condition(got, datav1alpha1.ConditionReady) != "False/Pending" {
		t.Fatalf("staging: %s, Ready %s", got.Status.State, condition(got, datav1alpha1.ConditionReady))
	}
	f.nodeDone("n1")
	got = f.reconcile()
	if got.Status.State != datav1alpha1.StateRunning || condition(got, datav1alpha1.ConditionReady) != "True/Running" ||
		condition(got, datav1alpha1.ConditionInUse) != "False/NotInUse" {
		t.Fatalf("staged: %s, Ready %s, InUse %s", got.Status.State, condition(got, datav1alpha1.ConditionReady), condition(got, datav1alpha1.ConditionInUse))
	}
	claim := got.Status.Volumes[0].VolumeSource.PersistentVolumeClaim.ClaimName
	user := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "train"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "c", Image: "i"}},
		Volumes:    []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	if err := f.c.Create(f.ctx, user); err != nil {
		t.Fatal(err)
	}
	got = f.reconcile()
	if c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionInUse); c == nil || c.Status != metav1.ConditionTrue ||
		!strings.Contains(c.Message, "claim "+claim+" by pod train") || got.Status.State != datav1alpha1.StateRunning {
		t.Fatalf("in use: %s %+v", got.Status.State, c)
	}

	got.Spec.State = datav1alpha1.RequestCompleted
	if err := f.c.Update(f.ctx, got); err != nil {
		t.Fatal(err)
	}
	got = f.reconcile()
	if got.Status.State != datav1alpha1.StateRunning || condition(got, datav1alpha1.ConditionReady) != "False/Completing" ||
		condition(got, datav1alpha1.ConditionCompleted) != "False/Completing" || !strings.Contains(got.Status.Message, "pod train") {
		t.Fatalf("completing: %s (%s), Ready %s, Completed %s", got.Status.State, got.Status.Message,
			condition(got, datav1alpha1.ConditionReady), condition(got, datav1alpha1.ConditionCompleted))
	}
	if err := f.c.Delete(f.ctx, user); err != nil {
		t.Fatal(err)
	}
	for range 3 { // the claim, then its volume (once the claim is gone), then the status
		got = f.reconcile()
	}
	pv, pvc, stagers := f.count()
	if pv != 0 || pvc != 0 || len(stagers) != 0 {
		t.Fatalf("left: %d PVs, %d claims, %d stager pods", pv, pvc, len(stagers))
	}
	if got.Status.State != datav1alpha1.StateCompleted || condition(got, datav1alpha1.ConditionCompleted) != "True/Released" ||
		condition(got, datav1alpha1.ConditionReady) != "False/Completed" || condition(got, datav1alpha1.ConditionDataReady) != "False/Released" ||
		len(got.Status.Volumes) != 1 || got.Status.Volumes[0].VolumeSource.PersistentVolumeClaim != nil {
		t.Fatalf("completed: %+v", got.Status)
	}
	rv := got.ResourceVersion
	if got = f.reconcile(); got.ResourceVersion != rv {
		t.Errorf("a Completed VolumeManager written again: %s -> %s", rv, got.ResourceVersion)
	}
	if pv, pvc, stagers := f.count(); pv+pvc+len(stagers) != 0 {
		t.Errorf("a Completed VolumeManager made objects again: %d PVs, %d claims, %d stager pods", pv, pvc, len(stagers))
	}
}

// TestClaimUsersMessage: the InUse message names at most five pods and counts the rest.
func TestClaimUsersMessage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		users claimUsers
		want  string
	}{
		{"one pod", claimUsers{"c": {"a"}}, "used: claim c by pod a"},
		{"two claims, sorted", claimUsers{"d": {"x"}, "c": {"a", "b"}}, "used: claim c by pod a, b; claim d by pod x"},
		{"more than five pods", claimUsers{"c": {"p1", "p2", "p3", "p4", "p5", "p6", "p7"}}, "used: claim c by pod p1, p2, p3, p4, p5 and 2 more pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.users.String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestProgress: the Progress column sums every volume's nodes in human units; a Ready node counts
// in full, one not listed yet (no size) not at all.
func TestProgress(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name    string
		volumes []datav1alpha1.Volume
		want    string
	}{
		{name: "nothing listed", volumes: []datav1alpha1.Volume{{ID: "a", Nodes: []datav1alpha1.NodeStatus{{Name: "n1", State: datav1alpha1.NodePending}}}}, want: ""},
		{name: "one node staging", volumes: []datav1alpha1.Volume{{ID: "a", Nodes: []datav1alpha1.NodeStatus{
			{Name: "n1", State: datav1alpha1.NodeStaging, BytesDone: 3328599654, BytesTotal: 12800 << 20}}}},
			want: "3.1 GiB of 12.5 GiB, 24%"},
		{name: "volumes and nodes summed, ready in full", volumes: []datav1alpha1.Volume{
			{ID: "a", Nodes: []datav1alpha1.NodeStatus{
				{Name: "n1", State: datav1alpha1.NodeReady, BytesTotal: 2 * gib},
				{Name: "n2", State: datav1alpha1.NodeStaging, BytesDone: gib, BytesTotal: 2 * gib}}},
			{ID: "b", Nodes: []datav1alpha1.NodeStatus{
				{Name: "n1", State: datav1alpha1.NodeStaging},
				{Name: "n3", State: datav1alpha1.NodeStaging, BytesDone: 0, BytesTotal: 4 * gib}}},
		}, want: "3.0 GiB of 8.0 GiB, 37%"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Progress(tc.volumes); got != tc.want {
				t.Errorf("Progress = %q, want %q", got, tc.want)
			}
		})
	}
}
