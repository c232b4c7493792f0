package framework

import (
	"context"
	"maps"
	"runtime"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
)

const (
	// As kubelet's defaults: renew every 10s, the lease lasting 40s.
	nodeLeaseDuration = 40
	nodeLeaseRenew    = 10 * time.Second
)

// CreateNode registers a Node the way kubelet does when it starts: labels, capacity, a Ready
// condition, and a Lease in kube-node-lease renewed every 10s until the test ends, so that
// kube-controller-manager keeps it Ready and untainted. It also creates the CSINode that
// node-driver-registrar would, with the Cistern driver, node ID = name, and the topology key,
// and labels the Node with that key as kubelet does. labels are added to the defaults
// (kubernetes.io/hostname, os, arch, topology key) and win over them. taints are set at creation,
// so no pod can be scheduled there before they are in place. No pod ever runs on it.
func CreateNode(t TB, cp *ControlPlane, name string, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()

	node, err := cp.Client.CoreV1().Nodes().Create(ctx, newNode(name, labels, taints), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Node %s: %v", name, err)
	}
	stopHeartbeat := startNodeHeartbeat(cp, node)
	t.Cleanup(func() {
		stopHeartbeat()
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		// Deleted explicitly: without kube-controller-manager nothing collects the dependents.
		_ = cp.Client.StorageV1().CSINodes().Delete(ctx, name, metav1.DeleteOptions{})
		_ = cp.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, name, metav1.DeleteOptions{})
		_ = cp.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	})

	// Status is ignored on create, as for kubelet, which reports it afterwards. Controllers may
	// have touched the Node since (taints, annotations): retry from the current version.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := cp.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		current.Status = newNode(name, labels, taints).Status
		node, err = cp.Client.CoreV1().Nodes().UpdateStatus(ctx, current, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("reporting status of Node %s: %v", name, err)
	}
	csiNode := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{nodeOwner(node)}},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name:         consts.DriverName,
			NodeID:       name,
			TopologyKeys: []string{consts.TopologyKey},
		}}},
	}
	if _, err := cp.Client.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CSINode %s: %v", name, err)
	}
	return node
}

func newNode(name string, labels map[string]string, taints []corev1.Taint) *corev1.Node {
	all := map[string]string{
		corev1.LabelHostname:   name,
		corev1.LabelOSStable:   "linux",
		corev1.LabelArchStable: runtime.GOARCH,
		consts.TopologyKey:     name,
	}
	maps.Copy(all, labels)
	resources := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("8"),
		corev1.ResourceMemory:           resource.MustParse("32Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	now := metav1.Now()
	condition := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: all},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{
			Capacity:    resources,
			Allocatable: resources,
			Conditions: []corev1.NodeCondition{
				condition(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady"),
				condition(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory"),
				condition(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure"),
				condition(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID"),
			},
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
				{Type: corev1.NodeHostName, Address: name},
			},
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion:  k8sVersion,
				OperatingSystem: "linux",
				Architecture:    runtime.GOARCH,
			},
		},
	}
}

func nodeOwner(node *corev1.Node) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
}

// startNodeHeartbeat keeps the node's Lease renewed, which is how kube-controller-manager tells
// a live kubelet; it returns a function that stops it and waits.
func startNodeHeartbeat(cp *ControlPlane, node *corev1.Node) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	leases := cp.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: node.Name, OwnerReferences: []metav1.OwnerReference{nodeOwner(node)}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(node.Name),
			LeaseDurationSeconds: ptr.To[int32](nodeLeaseDuration),
		},
	}
	go func() {
		defer close(done)
		for {
			lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			if lease.ResourceVersion == "" {
				if created, err := leases.Create(ctx, lease, metav1.CreateOptions{}); err == nil {
					lease = created
				}
			} else if updated, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err == nil {
				lease = updated
			} else if current, err := leases.Get(ctx, node.Name, metav1.GetOptions{}); err == nil {
				lease = current // conflict: retry on the next tick from the current version
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(nodeLeaseRenew):
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
