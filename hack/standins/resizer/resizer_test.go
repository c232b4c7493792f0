package resizer

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
)

const (
	driver = "test.csi.dev"
	topo   = "topology.test.csi.dev/node"
)

// expander answers ControllerExpandVolume with the next of errs (nil: success), counting calls.
type expander struct {
	mu           sync.Mutex
	calls        []*csi.ControllerExpandVolumeRequest
	errs         []error
	nodeRequired bool
}

func (e *expander) ControllerExpandVolume(_ context.Context, req *csi.ControllerExpandVolumeRequest, _ ...grpc.CallOption) (*csi.ControllerExpandVolumeResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, req)
	if len(e.errs) > 0 {
		err := e.errs[0]
		e.errs = e.errs[1:]
		if err != nil {
			return nil, err
		}
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), NodeExpansionRequired: e.nodeRequired}, nil
}

func (e *expander) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.calls)
}

type fixture struct {
	class    *storagev1.StorageClass
	pv       *corev1.PersistentVolume
	pvc      *corev1.PersistentVolumeClaim
	nodes    []*corev1.Node
	nodeName string
}

// newFixture is a 1 GiB claim of an expandable class, bound to a volume of the driver on node-a,
// asking for 2 GiB.
func newFixture() fixture {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "claim-uid"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To("expandable"),
			VolumeName:       "pv-1",
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}},
		},
		Status: corev1.PersistentVolumeClaimStatus{
			Phase:      corev1.ClaimBound,
			Capacity:   corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			Conditions: []corev1.PersistentVolumeClaimCondition{{Type: "Other", Status: corev1.ConditionTrue}},
		},
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: "vol-1", FSType: "xfs"}},
			ClaimRef: &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "claim-uid"},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: topo, Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}},
			}}}},
		},
	}
	return fixture{
		class: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "expandable"}, Provisioner: driver, AllowVolumeExpansion: ptr.To(true)},
		pv:    pv,
		pvc:   pvc,
		nodes: []*corev1.Node{
			{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{topo: "node-a"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "node-b", Labels: map[string]string{topo: "node-b"}}},
		},
	}
}

// start builds the controller over a fake clientset holding the fixture, its informers synced,
// with a fake event recorder.
func (f fixture) start(t *testing.T, e *expander) (*Controller, *fake.Clientset, *record.FakeRecorder) {
	t.Helper()
	objs := []runtime.Object{f.class, f.pv, f.pvc}
	for _, n := range f.nodes {
		objs = append(objs, n)
	}
	client := fake.NewClientset(objs...)
	c, err := New(Config{Client: client, DriverName: driver, Expander: e, NodeName: f.nodeName, RetryStart: time.Millisecond, RetryMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(20)
	c.recorder = rec
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.factory.Start(ctx.Done())
	if c.nodes != nil {
		c.nodes.Start(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		t.Fatal("informers not synced")
	}
	return c, client, rec
}

func events(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func reasons(evs []string) string {
	var r []string
	for _, e := range evs {
		if f := strings.Fields(e); len(f) > 1 {
			r = append(r, f[1])
		}
	}
	return strings.Join(r, ",")
}

func get(t *testing.T, client *fake.Clientset) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	t.Helper()
	pvc, err := client.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), "pv-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pvc, pv
}

func conditionTypes(pvc *corev1.PersistentVolumeClaim) string {
	var ts []string
	for _, c := range pvc.Status.Conditions {
		ts = append(ts, string(c.Type))
	}
	return strings.Join(ts, ",")
}

// waitSynced waits until the informers' caches hold the claim and volume as written (the fake
// clientset keeps no resource versions: their content is compared).
func waitSynced(t *testing.T, c *Controller, client *fake.Clientset) {
	t.Helper()
	pvc, pv := get(t, client)
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		cpvc, err := c.claims.PersistentVolumeClaims(pvc.Namespace).Get(pvc.Name)
		if err != nil {
			return false, nil
		}
		cpv, err := c.volumes.Get(pv.Name)
		return err == nil && equality.Semantic.DeepEqual(cpvc.Status, pvc.Status) && equality.Semantic.DeepEqual(cpv.Spec, pv.Spec), nil
	}); err != nil {
		t.Fatalf("the informers never saw the last writes: %v", err)
	}
}

func TestExpandNeedingNodeExpansion(t *testing.T) {
	e := &expander{nodeRequired: true}
	c, client, rec := newFixture().start(t, e)
	if err := c.Sync(context.Background(), "ns/data"); err != nil {
		t.Fatal(err)
	}
	pvc, pv := get(t, client)
	if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("PV capacity = %s, want 2Gi", got.String())
	}
	if got := pvc.Status.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("claim capacity = %s, want 1Gi until kubelet grows the filesystem", got.String())
	}
	if got := conditionTypes(pvc); got != "Other,FileSystemResizePending" {
		t.Errorf("conditions = %s", got)
	}
	if got := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; got != corev1.PersistentVolumeClaimNodeResizePending {
		t.Errorf("allocatedResourceStatuses = %v", pvc.Status.AllocatedResourceStatuses)
	}
	if got := pvc.Status.AllocatedResources[corev1.ResourceStorage]; got.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("allocatedResources = %v", pvc.Status.AllocatedResources)
	}
	if got := reasons(events(rec)); got != "Resizing,FileSystemResizeRequired" {
		t.Errorf("events = %s", got)
	}
	req := e.calls[0]
	if req.VolumeId != "vol-1" || req.CapacityRange.RequiredBytes != 2<<30 || req.VolumeCapability.GetMount().GetFsType() != "xfs" ||
		req.VolumeCapability.AccessMode.Mode != csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER {
		t.Errorf("request = %v", req)
	}
	// Kubelet's turn: a later sync calls nothing.
	waitSynced(t, c, client)
	if err := c.Sync(context.Background(), "ns/data"); err != nil {
		t.Fatal(err)
	}
	if n := e.count(); n != 1 {
		t.Errorf("%d ControllerExpandVolume calls, want 1", n)
	}
}

func TestExpandWithoutNodeExpansion(t *testing.T) {
	e := &expander{}
	c, client, rec := newFixture().start(t, e)
	if err := c.Sync(context.Background(), "ns/data"); err != nil {
		t.Fatal(err)
	}
	pvc, pv := get(t, client)
	for what, q := range map[string]resource.Quantity{"PV capacity": pv.Spec.Capacity[corev1.ResourceStorage], "claim capacity": pvc.Status.Capacity[corev1.ResourceStorage]} {
		if q.Cmp(resource.MustParse("2Gi")) != 0 {
			t.Errorf("%s = %s, want 2Gi", what, q.String())
		}
	}
	if got := conditionTypes(pvc); got != "Other" {
		t.Errorf("conditions = %s, want only the unrelated one", got)
	}
	if pvc.Status.AllocatedResourceStatuses != nil {
		t.Errorf("allocatedResourceStatuses = %v, want none", pvc.Status.AllocatedResourceStatuses)
	}
	if got := reasons(events(rec)); got != "Resizing,VolumeResizeSuccessful" {
		t.Errorf("events = %s", got)
	}
	waitSynced(t, c, client)
	if err := c.Sync(context.Background(), "ns/data"); err != nil {
		t.Fatal(err)
	}
	if n := e.count(); n != 1 {
		t.Errorf("%d ControllerExpandVolume calls, want 1", n)
	}
}

// Claims that are not this controller's, or ask for nothing, are left alone.
func TestNotExpanded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*fixture)
	}{
		{"class without allowVolumeExpansion", func(f *fixture) { f.class.AllowVolumeExpansion = nil }},
		{"another driver's volume", func(f *fixture) { f.pv.Spec.CSI.Driver = "other.csi.dev" }},
		{"volume bound to another claim", func(f *fixture) { f.pv.Spec.ClaimRef.UID = "other" }},
		{"claim not bound", func(f *fixture) { f.pvc.Status.Phase = corev1.ClaimPending }},
		{"request not above capacity", func(f *fixture) {
			f.pvc.Status.Capacity[corev1.ResourceStorage] = resource.MustParse("2Gi")
		}},
		{"node expansion pending", func(f *fixture) {
			f.pv.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse("2Gi")
			f.pvc.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: corev1.PersistentVolumeClaimNodeResizePending}
		}},
		{"node deployment: another node's volume", func(f *fixture) { f.nodeName = "node-b" }},
		{"node deployment: volume without node affinity", func(f *fixture) { f.nodeName = "node-a"; f.pv.Spec.NodeAffinity = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture()
			tc.change(&f)
			e := &expander{}
			c, _, rec := f.start(t, e)
			if err := c.Sync(context.Background(), "ns/data"); err != nil {
				t.Fatal(err)
			}
			if n := e.count(); n != 0 {
				t.Errorf("%d ControllerExpandVolume calls, want 0", n)
			}
			if evs := events(rec); len(evs) != 0 {
				t.Errorf("events %v", evs)
			}
		})
	}
}

func TestNodeDeploymentExpandsItsOwnVolume(t *testing.T) {
	f := newFixture()
	f.nodeName = "node-a"
	e := &expander{nodeRequired: true}
	c, _, _ := f.start(t, e)
	if err := c.Sync(context.Background(), "ns/data"); err != nil {
		t.Fatal(err)
	}
	if n := e.count(); n != 1 {
		t.Errorf("%d ControllerExpandVolume calls, want 1", n)
	}
}

func TestExpandFails(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		conditions string
		status     corev1.ClaimResourceStatus
	}{
		{"final, infeasible", status.Error(codes.OutOfRange, "too big"), "Other,ControllerResizeError", corev1.PersistentVolumeClaimControllerResizeInfeasible},
		{"final", status.Error(codes.Internal, "broken"), "Other,ControllerResizeError", corev1.PersistentVolumeClaimControllerResizeInProgress},
		{"may still go on", status.Error(codes.Unavailable, "restarting"), "Other,Resizing", corev1.PersistentVolumeClaimControllerResizeInProgress},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &expander{errs: []error{tc.err}}
			c, client, rec := newFixture().start(t, e)
			if err := c.Sync(context.Background(), "ns/data"); err == nil || !strings.Contains(err.Error(), status.Convert(tc.err).Message()) {
				t.Fatalf("Sync = %v, want the driver's error", err)
			}
			pvc, pv := get(t, client)
			if got := conditionTypes(pvc); got != tc.conditions {
				t.Errorf("conditions = %s, want %s", got, tc.conditions)
			}
			if got := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; got != tc.status {
				t.Errorf("allocatedResourceStatuses = %v, want %s", pvc.Status.AllocatedResourceStatuses, tc.status)
			}
			if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse("1Gi")) != 0 {
				t.Errorf("PV capacity = %s, want 1Gi", got.String())
			}
			if got := reasons(events(rec)); got != "Resizing,VolumeResizeFailed" {
				t.Errorf("events = %s", got)
			}
		})
	}
}

// Run retries a failed claim through the rate-limited queue until the driver expands it.
func TestRunRetries(t *testing.T) {
	e := &expander{errs: []error{status.Error(codes.Unavailable, "one"), status.Error(codes.Internal, "two")}}
	c, client, _ := newFixture().start(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, 2) }()
	if err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		pvc, _ := get(t, client)
		q := pvc.Status.Capacity[corev1.ResourceStorage]
		return q.Cmp(resource.MustParse("2Gi")) == 0, nil
	}); err != nil {
		t.Fatalf("claim never expanded: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := e.count(); n != 3 {
		t.Errorf("%d ControllerExpandVolume calls, want 3 (two failures, one success)", n)
	}
	pvc, _ := get(t, client)
	if got := conditionTypes(pvc); got != "Other" {
		t.Errorf("conditions = %s after success", got)
	}
}

// A conflict on the claim's status after the driver expanded the volume is retried on the
// claim as it is now, not by expanding again.
func TestStatusConflictRetried(t *testing.T) {
	e := &expander{nodeRequired: true}
	c, client, _ := newFixture().start(t, e)
	updates := 0
	client.PrependReactor("update", "persistentvolumeclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" {
			return false, nil, nil
		}
		updates++
		if updates == 2 { // the write after ControllerExpandVolume
			return true, nil, apierrors.NewConflict(corev1.Resource("persistentvolumeclaims"), "data", errors.New("changed"))
		}
		return false, nil, nil
	})
	if err := c.Sync(context.Background(), "ns/data"); err != nil {
		t.Fatal(err)
	}
	pvc, _ := get(t, client)
	if got := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; got != corev1.PersistentVolumeClaimNodeResizePending {
		t.Errorf("allocatedResourceStatuses = %v", pvc.Status.AllocatedResourceStatuses)
	}
	if n := e.count(); n != 1 {
		t.Errorf("%d ControllerExpandVolume calls, want 1", n)
	}
	if updates != 3 {
		t.Errorf("%d status updates, want 3 (one refused)", updates)
	}
}

// The caches may show the volume already grown but not yet the claim's NodeResizePending: the
// claim and volume as the API server has them decide, and the volume is not expanded again.
func TestStaleCacheNotExpandedAgain(t *testing.T) {
	f := newFixture()
	stale := f.pvc.DeepCopy()
	stale.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: corev1.PersistentVolumeClaimControllerResizeInProgress}
	f.pv.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse("2Gi")
	f.pvc.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: corev1.PersistentVolumeClaimNodeResizePending}
	f.pvc.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue}}
	client := fake.NewClientset(f.class, f.pv, f.pvc)
	e := &expander{}
	c, err := New(Config{Client: client, DriverName: driver, Expander: e})
	if err != nil {
		t.Fatal(err)
	}
	// The informers are not started: their stores hold what the test puts in them.
	for _, add := range []struct {
		inf cache.SharedIndexInformer
		obj runtime.Object
	}{
		{c.factory.Core().V1().PersistentVolumeClaims().Informer(), stale},
		{c.factory.Core().V1().PersistentVolumes().Informer(), f.pv},
		{c.factory.Storage().V1().StorageClasses().Informer(), f.class},
	} {
		if err := add.inf.GetStore().Add(add.obj); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Sync(context.Background(), "ns/data"); err != nil {
		t.Fatal(err)
	}
	if n := e.count(); n != 0 {
		t.Errorf("%d ControllerExpandVolume calls, want 0: kubelet's turn", n)
	}
}
