package workloads_test

import (
	"context"
	"maps"
	"runtime"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
)

// createNode registers a Node as a kubelet with the Cistern driver would (labels, capacity, Ready,
// a renewed Lease, a CSINode), with taints set from the start so no pod can slip onto it before
// they are in place. (framework.CreateNode cannot set taints, and its status report can lose a
// race with kube-controller-manager.)
func createNode(t *testing.T, cp *framework.ControlPlane, name string, labels map[string]string, taints ...corev1.Taint) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	all := map[string]string{corev1.LabelHostname: name, corev1.LabelOSStable: "linux",
		corev1.LabelArchStable: runtime.GOARCH, consts.TopologyKey: name}
	maps.Copy(all, labels)
	node, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: all},
		Spec:       corev1.NodeSpec{Taints: taints},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Node %s: %v", name, err)
	}
	leaseCtx, stopLease := context.WithCancel(context.Background())
	leaseDone := make(chan struct{})
	t.Cleanup(func() {
		stopLease()
		<-leaseDone
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cp.Client.StorageV1().CSINodes().Delete(ctx, name, metav1.DeleteOptions{})
		_ = cp.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, name, metav1.DeleteOptions{})
		_ = cp.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	})
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: name, UID: node.UID}
	go func() {
		defer close(leaseDone)
		leases := cp.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
		for {
			now := metav1.MicroTime{Time: time.Now()}
			l, err := leases.Get(leaseCtx, name, metav1.GetOptions{})
			if err != nil {
				_, _ = leases.Create(leaseCtx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{owner}},
					Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
				}, metav1.CreateOptions{})
			} else {
				l.Spec.RenewTime = &now
				_, _ = leases.Update(leaseCtx, l, metav1.UpdateOptions{})
			}
			select {
			case <-leaseCtx.Done():
				return
			case <-time.After(10 * time.Second):
			}
		}
	}()

	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"),
		corev1.ResourcePods: resource.MustParse("110")}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Capacity, n.Status.Allocatable = res, res
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now}}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: name}}
		_, err = cp.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("reporting status of Node %s: %v", name, err)
	}
	if _, err := cp.Client.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: consts.DriverName, NodeID: name,
			TopologyKeys: []string{consts.TopologyKey}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CSINode %s: %v", name, err)
	}
}
