package volumemanager

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
)

// The reconciler on a fake client: nothing is placed until enough nodes qualify, then one PV and
// claim; a lost node keeps the data where it was. The real API server flow is in test/workloads.
func TestReconcilerPlacement(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = datav1alpha1.AddToScheme(scheme)
	vm := &datav1alpha1.VolumeManager{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"},
		Spec: datav1alpha1.VolumeManagerSpec{VolumeConfigs: []datav1alpha1.VolumeConfig{
			{ID: "d", Replicas: 2, SourceType: "S3", SourceURL: "s3://b/p"}}},
	}
	n1, n2 := node("n1", nil), node("n2", nil)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vm, &n1).WithStatusSubresource(vm).Build()
	r := &Reconciler{Client: c}
	ctx := context.Background()
	reconcile := func() *datav1alpha1.VolumeManager {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(vm)}); err != nil {
			t.Fatal(err)
		}
		var got datav1alpha1.VolumeManager
		if err := c.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	count := func() (int, int) {
		var pvs corev1.PersistentVolumeList
		var pvcs corev1.PersistentVolumeClaimList
		_ = c.List(ctx, &pvs)
		_ = c.List(ctx, &pvcs)
		return len(pvs.Items), len(pvcs.Items)
	}

	got := reconcile()
	if pv, pvc := count(); pv != 0 || pvc != 0 || got.Status.State != datav1alpha1.StatePending ||
		!strings.Contains(got.Status.Message, "only 1 of 2 nodes eligible") {
		t.Fatalf("one node: %d PVs, %d claims, status %+v", pv, pvc, got.Status)
	}
	if len(got.Finalizers) != 1 {
		t.Errorf("finalizers %v", got.Finalizers)
	}

	if err := c.Create(ctx, &n2); err != nil {
		t.Fatal(err)
	}
	got = reconcile()
	if pv, pvc := count(); pv != 1 || pvc != 1 {
		t.Fatalf("two nodes: %d PVs, %d claims", pv, pvc)
	}
	v := got.Status.Volumes[0]
	if strings.Join(v.Nodes, ",") != "n1,n2" || v.VolumeSource.PersistentVolumeClaim == nil {
		t.Fatalf("status volume %+v", v)
	}

	// n2 goes away: the data stays on the claim it has, and the status says why.
	if err := c.Delete(ctx, &n2); err != nil {
		t.Fatal(err)
	}
	got = reconcile()
	if pv, pvc := count(); pv != 1 || pvc != 1 || got.Status.Volumes[0].VolumeSource.PersistentVolumeClaim.ClaimName != v.VolumeSource.PersistentVolumeClaim.ClaimName ||
		!strings.Contains(got.Status.Volumes[0].Message, "keeping the data where it is") {
		t.Fatalf("lost node: %d PVs, %d claims, %+v", pv, pvc, got.Status.Volumes[0])
	}
}
