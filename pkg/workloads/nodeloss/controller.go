// Package nodeloss releases the node-local claims of LeaderWorkerSet groups whose node is lost, so
// that the groups come back on other nodes with fresh claims. A claim bound to a volume that only
// one node can reach (a local or pool volume: its PersistentVolume's required node affinity names
// that node alone) pins its pod to that node; when the node is gone, the pod the StatefulSet
// recreates stays Pending forever. sig-storage's local-static-provisioner has a node-cleanup
// controller for the same reason.
//
// A PersistentVolume's claimRef is only the volume's word: node plugins create volumes (the
// provisioner in node-deployment mode) and a compromised one could write a volume pinned to itself
// that names any claim. So a claim is released only when it is bound to the volume (its
// spec.volumeName, which the PV controller writes) with the UID the volume names, and only for
// volumes of the driver: never a claim of another namespace or driver that a forged volume names.
package nodeloss

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
)

// KeepAnnotation, set to "true" on a claim, keeps it through the loss of its node: the group then
// waits for the node to come back.
const KeepAnnotation = "workloads.cistern.dev/keep-on-node-loss"

// Reconciler watches Nodes (and the PersistentVolumes pinned to them, so that a node deleted while
// the controller was down is seen at start). When a node is lost — deleted, or not Ready for longer
// than GracePeriod — each claim of a LeaderWorkerSet bound to a volume pinned to it is deleted,
// with the group's pods that hold it and are not running elsewhere; the StatefulSet controller then
// recreates the pods and, from the claim template, new claims, which bind on a live node.
type Reconciler struct {
	client.Client
	Recorder events.EventRecorder
	// DriverName is the CSI driver whose volumes count; consts.DriverName when empty.
	DriverName string
	// GracePeriod is how long a node may be not Ready (or unreachable: Unknown) before it counts
	// as lost; 0 counts only a deleted Node.
	GracePeriod time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile handles one node, by name.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lost, wait, why, err := r.lost(ctx, req.Name)
	if err != nil || !lost {
		return ctrl.Result{RequeueAfter: wait}, err
	}
	var pvs corev1.PersistentVolumeList
	if err := r.List(ctx, &pvs); err != nil {
		return ctrl.Result{}, err
	}
	pending := false
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		if !r.ours(pv) || PinnedNode(pv) != req.Name {
			continue
		}
		held, err := r.release(ctx, pv, req.Name, why)
		if err != nil {
			return ctrl.Result{}, err
		}
		pending = pending || held
	}
	if pending {
		// A claim being deleted stays while a pod uses it, and the StatefulSet controller may
		// have made the group's pod again, Pending on that claim, before it went: look again
		// (nothing else brings back a deleted Node) until every released claim is gone.
		return ctrl.Result{RequeueAfter: releaseRecheck}, nil
	}
	return ctrl.Result{}, nil
}

// ours says whether pv is a volume of the driver bound (by its claimRef) to a claim.
func (r *Reconciler) ours(pv *corev1.PersistentVolume) bool {
	driver := r.DriverName
	if driver == "" {
		driver = consts.DriverName
	}
	return pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driver && pv.Spec.ClaimRef != nil
}

// releaseRecheck is how soon a lost node is looked at again while a claim it released is still
// there.
const releaseRecheck = 2 * time.Second

// lost says whether the node is lost, and if not yet but it may become so, when to look again.
func (r *Reconciler) lost(ctx context.Context, name string) (bool, time.Duration, string, error) {
	var node corev1.Node
	err := r.Get(ctx, types.NamespacedName{Name: name}, &node)
	if apierrors.IsNotFound(err) {
		return true, 0, "deleted", nil
	}
	if err != nil || r.GracePeriod <= 0 {
		return false, 0, "", err
	}
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeReady || c.Status == corev1.ConditionTrue {
			continue
		}
		since := r.now().Sub(c.LastTransitionTime.Time)
		if since < r.GracePeriod {
			return false, r.GracePeriod - since, "", nil
		}
		return true, 0, fmt.Sprintf("Ready=%s (%s) for %s, more than the grace period %s", c.Status, c.Reason, since.Round(time.Second), r.GracePeriod), nil
	}
	return false, 0, "", nil
}

// release deletes a LeaderWorkerSet claim bound to pv, and the pods of its group that hold it and
// do not run on a live node (bound to the lost node: at once, with no grace period; or Pending
// unscheduled), so the StatefulSet controller makes both again. The claim must be bound to pv both
// ways: pv's claimRef names it with its UID, and its volumeName is pv. It says whether the claim is
// still there.
func (r *Reconciler) release(ctx context.Context, pv *corev1.PersistentVolume, node, why string) (bool, error) {
	ref := pv.Spec.ClaimRef
	var pvc corev1.PersistentVolumeClaim
	if err := r.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, &pvc); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if !boundTo(&pvc, pv) {
		return false, nil
	}
	lws, ok := pvc.Labels[v1alpha1.SetNameLabelKey]
	if !ok || pvc.Annotations[KeepAnnotation] == "true" {
		return false, nil
	}
	logger := klog.FromContext(ctx).WithValues("node", node, "claim", klog.KObj(&pvc), "leaderworkerset", lws)
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(pvc.Namespace), client.MatchingLabels{v1alpha1.SetNameLabelKey: lws}); err != nil {
		return false, err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !usesClaim(pod, pvc.Name) || pod.Spec.NodeName != "" && pod.Spec.NodeName != node {
			continue
		}
		opts := []client.DeleteOption{client.Preconditions{UID: &pod.UID}}
		if pod.Spec.NodeName == node {
			// No kubelet will confirm a graceful deletion on a lost node: the pod would stay
			// Terminating (also one a taint eviction began) and the StatefulSet controller waits
			// for it before it makes the pod again. So it goes at once, as kube-controller-manager
			// removes the pods of a node with the out-of-service taint.
			opts = append(opts, client.GracePeriodSeconds(0))
		} else if pod.DeletionTimestamp != nil {
			continue
		}
		if err := r.Delete(ctx, pod, opts...); err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		logger.Info("deleted pod holding a claim pinned to a lost node", "pod", klog.KObj(pod))
	}
	if pvc.DeletionTimestamp != nil {
		return true, nil
	}
	if err := r.Delete(ctx, &pvc, client.Preconditions{UID: &pvc.UID}); err != nil && !apierrors.IsNotFound(err) {
		return false, err
	}
	logger.Info("released claim pinned to a lost node", "volume", pv.Name, "why", why)
	if r.Recorder != nil {
		r.Recorder.Eventf(&pvc, pv, corev1.EventTypeWarning, "NodeLost", "ReleaseClaim",
			"node %s is lost (%s): claim released so that group of LeaderWorkerSet %s starts again on another node with a new claim; the data on volume %s stays with that node",
			node, why, lws, pv.Name)
	}
	return true, nil
}

// boundTo says whether pvc and pv name each other: pv's claimRef the claim with its UID (a claim
// made again under the name is another claim), the claim's volumeName pv.
func boundTo(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) bool {
	ref := pv.Spec.ClaimRef
	return ref != nil && ref.UID != "" && ref.UID == pvc.UID && ref.Namespace == pvc.Namespace && ref.Name == pvc.Name &&
		pvc.Spec.VolumeName == pv.Name
}

func usesClaim(pod *corev1.Pod, claim string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
			return true
		}
	}
	return false
}

// PinnedNode is the one node a volume's required node affinity allows — every term names it alone
// by kubernetes.io/hostname or the driver's topology key (whose values are node names, as kubelet
// and the driver set them) — or "".
func PinnedNode(pv *corev1.PersistentVolume) string {
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) == 0 {
		return ""
	}
	node := ""
	for _, term := range na.Required.NodeSelectorTerms {
		found := ""
		for _, e := range term.MatchExpressions {
			if (e.Key == corev1.LabelHostname || e.Key == consts.TopologyKey) && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				found = e.Values[0]
			}
		}
		if found == "" || node != "" && node != found {
			return ""
		}
		node = found
	}
	return node
}

// SetupWithManager registers the reconciler on Nodes and on the PersistentVolumes pinned to one.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	byPinnedNode := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		pv, ok := o.(*corev1.PersistentVolume)
		if !ok {
			return nil
		}
		if n := PinnedNode(pv); n != "" && r.ours(pv) {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: n}}}
		}
		return nil
	})
	// Only what can make a node lost: its Ready condition, and its deletion.
	readyChanged := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return readyStatus(e.ObjectOld) != readyStatus(e.ObjectNew)
	}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodeloss").
		For(&corev1.Node{}, builder.WithPredicates(readyChanged)).
		Watches(&corev1.PersistentVolume{}, byPinnedNode, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(event.UpdateEvent) bool { return false }})).
		Complete(r)
}

func readyStatus(o client.Object) corev1.ConditionStatus {
	n, ok := o.(*corev1.Node)
	if !ok {
		return ""
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}
