package volumemanager

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
)

// Reconciler makes each VolumeManager's datasets present on their nodes.
type Reconciler struct {
	client.Client
	Config Config
}

// +kubebuilder:rbac:groups=data.cistern.dev,resources=volumemanagers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=data.cistern.dev,resources=volumemanagers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=data.cistern.dev,resources=volumemanagers/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// Reconcile brings one VolumeManager's volumes and claims to its spec.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := klog.FromContext(ctx).WithValues("volumemanager", req.NamespacedName)
	ctx = klog.NewContext(ctx, logger)
	var vm datav1alpha1.VolumeManager
	if err := r.Get(ctx, req.NamespacedName, &vm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	pvs, pvcs, err := r.owned(ctx, &vm)
	if err != nil {
		return ctrl.Result{}, err
	}
	if vm.DeletionTimestamp != nil {
		return ctrl.Result{}, r.release(ctx, &vm, pvs, pvcs)
	}
	if controllerutil.AddFinalizer(&vm, Finalizer) {
		if err := r.Update(ctx, &vm); err != nil {
			return ctrl.Result{}, err
		}
	}
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes); err != nil {
		return ctrl.Result{}, err
	}

	// Where each volume is now comes from the volumes themselves, not from the status, which the
	// cache may show a step behind.
	previous := map[string][]string{}
	for _, v := range vm.Status.Volumes {
		previous[v.ID] = v.Nodes
	}
	for i := range vm.Spec.VolumeConfigs {
		vc := &vm.Spec.VolumeConfigs[i]
		if placed := currentPlacement(vc, pvs, nodes.Items); placed != nil {
			previous[vc.ID] = placed
		}
	}
	status := datav1alpha1.VolumeManagerStatus{ObservedGeneration: vm.Generation, State: datav1alpha1.StateRunning}
	keep := map[string]bool{} // names of PVs and PVCs still wanted
	var problems []string
	for i := range vm.Spec.VolumeConfigs {
		vc := &vm.Spec.VolumeConfigs[i]
		v, state, err := r.reconcileVolume(ctx, &vm, vc, nodes.Items, previous[vc.ID], pvcs, keep)
		if err != nil {
			return ctrl.Result{}, err
		}
		status.Volumes = append(status.Volumes, v)
		if state != datav1alpha1.StateRunning {
			problems = append(problems, fmt.Sprintf("%s: %s", vc.ID, v.Message))
			if status.State != datav1alpha1.StateFailed {
				status.State = state
			}
		}
	}
	if len(problems) > 0 {
		status.Message = strings.Join(problems, "; ")
	} else {
		status.Message = fmt.Sprintf("%d volumes ready", len(status.Volumes))
	}
	if err := r.deleteUnwanted(ctx, pvs, pvcs, keep); err != nil {
		return ctrl.Result{}, err
	}
	if apiequality.Semantic.DeepEqual(status, vm.Status) {
		return ctrl.Result{}, nil
	}
	vm.Status = status
	if err := r.Status().Update(ctx, &vm); err != nil && !apierrors.IsConflict(err) {
		return ctrl.Result{}, err
	}
	logger.V(4).Info("status", "state", status.State, "message", status.Message)
	return ctrl.Result{}, nil
}

func (r *Reconciler) reconcileVolume(ctx context.Context, vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig,
	nodes []corev1.Node, previous []string, pvcs []corev1.PersistentVolumeClaim, keep map[string]bool,
) (datav1alpha1.Volume, datav1alpha1.State, error) {
	attrs, err := DatasetAttributes(vc, r.Config)
	if err != nil {
		return datav1alpha1.Volume{ID: vc.ID, Message: err.Error()}, datav1alpha1.StateFailed, nil
	}
	chosen := SelectNodes(vc, nodes, previous)
	if len(chosen) < int(vc.Replicas) {
		// Too few nodes: make nothing new (each node set is its own claim, so growing one node at
		// a time would churn claims), and keep what an earlier node set already placed.
		msg := fmt.Sprintf("only %d of %d nodes eligible", len(chosen), vc.Replicas)
		if len(previous) == 0 {
			return datav1alpha1.Volume{ID: vc.ID, Message: msg}, datav1alpha1.StatePending, nil
		}
		keep[pvName(vm, vc.ID, previous)], keep[objectName(vm, vc.ID, previous)] = true, true
		return StatusVolume(vc, objectName(vm, vc.ID, previous), previous, msg+"; keeping the data where it is"), datav1alpha1.StatePending, nil
	}
	pv := PersistentVolume(vm, vc, chosen, attrs, r.Config)
	pvc := PersistentVolumeClaim(vm, vc, chosen)
	if err := controllerutil.SetControllerReference(vm, pvc, r.Scheme()); err != nil {
		return datav1alpha1.Volume{}, "", err
	}
	keep[pv.Name], keep[pvc.Name] = true, true
	for _, obj := range []client.Object{pv, pvc} {
		err := r.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
		if apierrors.IsNotFound(err) {
			klog.FromContext(ctx).V(3).Info("creating", "kind", obj.GetObjectKind().GroupVersionKind().Kind, "name", obj.GetName(), "nodes", chosen)
			err = r.Create(ctx, obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return datav1alpha1.Volume{}, "", err
		}
	}
	state, msg := datav1alpha1.StateRunning, ""
	bound := false
	for _, c := range pvcs {
		if c.Name == pvc.Name && c.Status.Phase == corev1.ClaimBound {
			bound = true
		}
	}
	if !bound {
		state, msg = datav1alpha1.StatePending, "waiting for claim "+pvc.Name+" to bind"
	}
	return StatusVolume(vc, pvc.Name, chosen, msg), state, nil
}

// currentPlacement is the node set of the live PersistentVolume of vc that has the most nodes still
// eligible (nil when there is none).
func currentPlacement(vc *datav1alpha1.VolumeConfig, pvs []corev1.PersistentVolume, nodes []corev1.Node) []string {
	eligible := map[string]bool{}
	for i := range nodes {
		if EligibleNode(vc, &nodes[i]) {
			eligible[nodes[i].Labels[consts.TopologyKey]] = true
		}
	}
	var best []string
	bestScore := -1
	for i := range pvs {
		pv := &pvs[i]
		if pv.Labels[LabelVolumeID] != vc.ID || pv.DeletionTimestamp != nil {
			continue
		}
		placed := NodesOf(pv)
		score := 0
		for _, n := range placed {
			if eligible[n] {
				score++
			}
		}
		if score > bestScore {
			best, bestScore = placed, score
		}
	}
	return best
}

// NodesOf reads the nodes a PersistentVolume made by PersistentVolume is pinned to.
func NodesOf(pv *corev1.PersistentVolume) []string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return nil
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == consts.TopologyKey && e.Operator == corev1.NodeSelectorOpIn {
				return e.Values
			}
		}
	}
	return nil
}

// owned lists the PersistentVolumes and claims made for vm, from the cache.
func (r *Reconciler) owned(ctx context.Context, vm *datav1alpha1.VolumeManager) ([]corev1.PersistentVolume, []corev1.PersistentVolumeClaim, error) {
	sel := client.MatchingLabels{LabelManager: vm.Name, LabelNamespace: vm.Namespace}
	var pvs corev1.PersistentVolumeList
	if err := r.List(ctx, &pvs, sel); err != nil {
		return nil, nil, err
	}
	var pvcs corev1.PersistentVolumeClaimList
	if err := r.List(ctx, &pvcs, sel, client.InNamespace(vm.Namespace)); err != nil {
		return nil, nil, err
	}
	return pvs.Items, pvcs.Items, nil
}

// deleteUnwanted removes claims of node sets no longer wanted (the API server keeps a claim a pod
// still uses until that pod is gone), then their volumes once the claim is gone.
func (r *Reconciler) deleteUnwanted(ctx context.Context, pvs []corev1.PersistentVolume, pvcs []corev1.PersistentVolumeClaim, keep map[string]bool) error {
	claims := map[string]bool{}
	for i := range pvcs {
		c := &pvcs[i]
		if keep[c.Name] {
			continue
		}
		claims[c.Name] = true
		if c.DeletionTimestamp == nil {
			if err := r.Delete(ctx, c); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	for i := range pvs {
		pv := &pvs[i]
		if keep[pv.Name] || pv.DeletionTimestamp != nil {
			continue
		}
		if ref := pv.Spec.ClaimRef; ref != nil && claims[ref.Name] {
			continue // released once its claim is gone; the claim's deletion requeues us
		}
		if err := r.Delete(ctx, pv); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// release deletes everything made for a deleted VolumeManager, then lets it go. The nodes' cache
// keeps the data until the driver evicts it.
func (r *Reconciler) release(ctx context.Context, vm *datav1alpha1.VolumeManager, pvs []corev1.PersistentVolume, pvcs []corev1.PersistentVolumeClaim) error {
	if !controllerutil.ContainsFinalizer(vm, Finalizer) {
		return nil
	}
	if err := r.deleteUnwanted(ctx, pvs, pvcs, nil); err != nil {
		return err
	}
	for _, pv := range pvs {
		if ref := pv.Spec.ClaimRef; ref != nil {
			// Wait for claims in use to go; their deletion events requeue us.
			var c corev1.PersistentVolumeClaim
			if err := r.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, &c); err == nil {
				return nil
			}
		}
		if err := r.Delete(ctx, &pv); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	klog.FromContext(ctx).V(3).Info("released volumes", "persistentVolumes", len(pvs))
	controllerutil.RemoveFinalizer(vm, Finalizer)
	return r.Update(ctx, vm)
}

// SetupWithManager registers the reconciler for VolumeManagers, their claims and volumes, and
// Nodes (a node coming or going changes where data can be).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	byLabels := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		l := o.GetLabels()
		if l[LabelManager] == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: l[LabelNamespace], Name: l[LabelManager]}}}
	})
	allManagers := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list datav1alpha1.VolumeManagerList
		if err := mgr.GetClient().List(ctx, &list); err != nil {
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for _, vm := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&vm)})
		}
		return reqs
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("volumemanager").
		For(&datav1alpha1.VolumeManager{}).
		Watches(&corev1.PersistentVolumeClaim{}, byLabels).
		Watches(&corev1.PersistentVolume{}, byLabels).
		Watches(&corev1.Node{}, allManagers).
		Complete(r)
}
