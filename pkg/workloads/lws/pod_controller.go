package lws

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// PodReconciler runs the groups: it creates each leader's worker StatefulSet (and, for
// UniquePerReplica, its headless Service), and applies the restart policy by deleting the leader
// of a group one of whose pods restarted or was deleted, which takes the workers with it.
//
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
type PodReconciler struct {
	client.Client
	Recorder events.EventRecorder
}

// Reconcile handles one LeaderWorkerSet pod.
func (r *PodReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pod corev1.Pod
	if err := r.Get(ctx, req.NamespacedName, &pod); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	lwsName := pod.Labels[v1alpha1.SetNameLabelKey]
	var lws v1alpha1.LeaderWorkerSet
	if err := r.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: lwsName}, &lws); err != nil {
		// Gone: garbage collection removes the pods.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if lws.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	SetDefaults(&lws)
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(&pod), "leaderworkerset", lwsName)
	ctx = klog.NewContext(ctx, logger)

	if restarted, err := r.applyRestartPolicy(ctx, &pod, &lws); err != nil || restarted {
		return ctrl.Result{}, err
	}
	if !IsLeader(&pod) || pod.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	// The group is built from the template revision its leader carries: in the middle of a rolling
	// update, a group below the partition that restarts keeps its old workers.
	group, err := groupTemplate(ctx, r.Client, &lws, pod.Labels[v1alpha1.RevisionKey])
	if err != nil {
		return ctrl.Result{}, err
	}
	if group == nil {
		logger.V(2).Info("template revision not in the cache yet", "revision", pod.Labels[v1alpha1.RevisionKey])
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if subdomainPolicy(group) == v1alpha1.SubdomainUniquePerReplica {
		svc := HeadlessService(group, pod.Name, map[string]string{
			v1alpha1.SetNameLabelKey:    lws.Name,
			v1alpha1.GroupIndexLabelKey: pod.Labels[v1alpha1.GroupIndexLabelKey],
		})
		svc.OwnerReferences = []metav1.OwnerReference{podOwnerRef(&pod)}
		if err := ensureService(ctx, r.Client, svc); err != nil {
			return ctrl.Result{}, err
		}
	}
	if ptr.Deref(group.Spec.LeaderWorkerTemplate.Size, 1) == 1 {
		return ctrl.Result{}, nil
	}
	if lws.Spec.StartupPolicy == v1alpha1.LeaderReadyStartupPolicy && !podReady(&pod) {
		logger.V(4).Info("waiting for the leader to be ready before creating workers")
		return ctrl.Result{}, nil
	}

	var cur appsv1.StatefulSet
	err = r.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, &cur)
	switch {
	case err == nil:
		if !metav1.IsControlledBy(&cur, &pod) {
			// The previous incarnation of this group is still being deleted.
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return ctrl.Result{}, nil
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	}
	topology, ok, err := r.leaderTopology(ctx, group, &pod)
	if err != nil || !ok {
		return ctrl.Result{}, err
	}
	sts := WorkerStatefulSet(group, &pod, topology)
	if err := r.Create(ctx, sts); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		r.Recorder.Eventf(&lws, &pod, corev1.EventTypeWarning, "FailedCreate", "CreateWorkerStatefulSet", "worker StatefulSet %s: %v", pod.Name, err)
		return ctrl.Result{}, err
	}
	logger.V(4).Info("created worker StatefulSet", "statefulset", klog.KObj(sts))
	return ctrl.Result{}, nil
}

// leaderTopology is, under exclusive placement, the topology domain the leader was scheduled
// into ({key: value of the leader's node}), where the workers must go; ok is false while the
// leader is not scheduled yet (its update queues it again).
func (r *PodReconciler) leaderTopology(ctx context.Context, lws *v1alpha1.LeaderWorkerSet, leader *corev1.Pod) (map[string]string, bool, error) {
	key := lws.Annotations[v1alpha1.ExclusiveKeyAnnotationKey]
	if key == "" {
		return nil, true, nil
	}
	if leader.Spec.NodeName == "" {
		klog.FromContext(ctx).V(4).Info("exclusive placement: waiting for the leader to be scheduled")
		return nil, false, nil
	}
	var node corev1.Node
	if err := r.Get(ctx, types.NamespacedName{Name: leader.Spec.NodeName}, &node); err != nil {
		return nil, false, fmt.Errorf("node %s of leader %s: %w", leader.Spec.NodeName, leader.Name, err)
	}
	v, ok := node.Labels[key]
	if !ok {
		// The scheduler only places a pod with affinity on this key on nodes that carry it.
		return nil, false, fmt.Errorf("node %s of leader %s has no label %s", node.Name, leader.Name, key)
	}
	return map[string]string{key: v}, true, nil
}

func podOwnerRef(pod *corev1.Pod) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
}

// applyRestartPolicy deletes the group's leader (foreground, so the worker StatefulSet goes first)
// when a pod of the group was deleted or restarted a container, under the RecreateGroup policies.
// It reports whether the group is being recreated.
func (r *PodReconciler) applyRestartPolicy(ctx context.Context, pod *corev1.Pod, lws *v1alpha1.LeaderWorkerSet) (bool, error) {
	policy := lws.Spec.LeaderWorkerTemplate.RestartPolicy
	if policy != v1alpha1.RecreateGroupOnPodRestart && policy != v1alpha1.RecreateGroupAfterStart {
		return false, nil
	}
	if !containerRestarted(pod) && pod.DeletionTimestamp == nil {
		return false, nil
	}
	leader := pod
	if !IsLeader(pod) {
		name := pod.Annotations[v1alpha1.LeaderPodNameAnnotationKey]
		var l corev1.Pod
		if err := r.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, &l); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		// A worker of an earlier incarnation of the group (its StatefulSet is owned by an older
		// leader) must not restart the new one.
		if l.Labels[v1alpha1.GroupUniqueHashLabelKey] != pod.Labels[v1alpha1.GroupUniqueHashLabelKey] ||
			!ownedByLeader(ctx, r.Client, pod, &l) {
			return false, nil
		}
		leader = &l
	}
	if leader.DeletionTimestamp != nil {
		return true, nil
	}
	if afterStart(lws) {
		pending, err := r.groupNotStarted(ctx, leader, ptr.Deref(lws.Spec.LeaderWorkerTemplate.Size, 1))
		if err != nil || pending {
			return false, err
		}
	}
	if err := r.Delete(ctx, leader, client.PropagationPolicy(metav1.DeletePropagationForeground),
		client.Preconditions{UID: &leader.UID}); err != nil && !apierrors.IsNotFound(err) {
		return false, err
	}
	klog.FromContext(ctx).Info("recreating group", "leader", klog.KObj(leader), "cause", klog.KObj(pod))
	r.Recorder.Eventf(lws, leader, corev1.EventTypeNormal, "RecreateGroup", "DeleteLeader",
		"pod %s restarted or was deleted; deleted leader %s to recreate group %s", pod.Name, leader.Name, leader.Labels[v1alpha1.GroupIndexLabelKey])
	return true, nil
}

// ownedByLeader says whether the worker pod's StatefulSet is controlled by this leader pod.
func ownedByLeader(ctx context.Context, c client.Client, pod, leader *corev1.Pod) bool {
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "StatefulSet" {
		return false
	}
	var sts appsv1.StatefulSet
	if err := c.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: owner.Name}, &sts); err != nil {
		return false
	}
	return sts.UID == owner.UID && metav1.IsControlledBy(&sts, leader)
}

// afterStart says whether a group restarts only once started: RecreateGroupAfterStart, or
// RecreateGroupOnPodRestart with upstream's experimental annotation.
func afterStart(lws *v1alpha1.LeaderWorkerSet) bool {
	_, annotated := lws.Annotations[v1alpha1.RecreateGroupAfterStartAnnotationKey]
	policy := lws.Spec.LeaderWorkerTemplate.RestartPolicy
	return policy == v1alpha1.RecreateGroupAfterStart || policy == v1alpha1.RecreateGroupOnPodRestart && annotated
}

// groupNotStarted says whether a group has not started yet: fewer pods than its size (one not
// created yet counts, as upstream counts it), or one of them Pending.
func (r *PodReconciler) groupNotStarted(ctx context.Context, leader *corev1.Pod, size int32) (bool, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(leader.Namespace), client.MatchingLabels{
		v1alpha1.GroupUniqueHashLabelKey: leader.Labels[v1alpha1.GroupUniqueHashLabelKey],
	}); err != nil {
		return false, err
	}
	if len(pods.Items) != int(size) {
		return true, nil
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodPending {
			return true, nil
		}
	}
	return false, nil
}

// containerRestarted says whether a live pod restarted any container.
func containerRestarted(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning && pod.Status.Phase != corev1.PodPending {
		return false
	}
	for _, s := range pod.Status.InitContainerStatuses {
		if s.RestartCount > 0 {
			return true
		}
	}
	for _, s := range pod.Status.ContainerStatuses {
		if s.RestartCount > 0 {
			return true
		}
	}
	return false
}

// SetupWithManager registers the reconciler for the pods it has work for — leaders (worker
// StatefulSets) and any group pod that restarted a container or is being deleted (restart policy)
// — and for the worker StatefulSets they own, so a deleted one is recreated. Filtering here keeps
// the thousands of routine worker pod updates of a large LeaderWorkerSet out of the queue.
func (r *PodReconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	relevant := func(o client.Object) bool {
		pod, ok := o.(*corev1.Pod)
		if !ok {
			return false
		}
		if _, ok := pod.Labels[v1alpha1.SetNameLabelKey]; !ok {
			return false
		}
		return IsLeader(pod) || pod.DeletionTimestamp != nil || containerRestarted(pod)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("leaderworkerset-pod").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(relevant))).
		Owns(&appsv1.StatefulSet{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(concurrency, 1)}).
		Complete(r)
}
