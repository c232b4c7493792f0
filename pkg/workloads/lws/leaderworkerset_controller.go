package lws

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// LeaderWorkerSetReconciler keeps the leader StatefulSet, the shared headless Service and the
// status of each LeaderWorkerSet. It reads only from the informer cache and writes only what
// differs, so a LeaderWorkerSet at rest costs the API server nothing.
type LeaderWorkerSetReconciler struct {
	client.Client
	Recorder events.EventRecorder
}

// +kubebuilder:rbac:groups=workloads.cistern.dev,resources=leaderworkersets,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=workloads.cistern.dev,resources=leaderworkersets/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=workloads.cistern.dev,resources=leaderworkersets/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=apps,resources=controllerrevisions,verbs=list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete

// Reconcile brings one LeaderWorkerSet's objects to what its spec asks.
func (r *LeaderWorkerSetReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := klog.FromContext(ctx).WithValues("leaderworkerset", req.NamespacedName)
	ctx = klog.NewContext(ctx, logger)

	var lws v1alpha1.LeaderWorkerSet
	if err := r.Get(ctx, req.NamespacedName, &lws); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if lws.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	// Work on a defaulted copy: the controller must not depend on the webhook having run.
	desired := lws.DeepCopy()
	SetDefaults(desired)
	revision := TemplateHash(desired)

	var cur *appsv1.StatefulSet
	var existing appsv1.StatefulSet
	switch err := r.Get(ctx, req.NamespacedName, &existing); {
	case err == nil:
		cur = &existing
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	}
	// The revision is recorded before any pod can carry it, so the workers of its groups can
	// always be built from it.
	if err := ensureRevision(ctx, r.Client, desired, revision); err != nil {
		return ctrl.Result{}, fmt.Errorf("template revision %s: %w", revision, err)
	}
	g, err := r.listGroups(ctx, &lws)
	if err != nil {
		return ctrl.Result{}, err
	}

	templateChanged := cur != nil && cur.Labels[v1alpha1.RevisionKey] != revision
	var states []groupState
	if cur != nil {
		states = groupStates(lws.Name, revision, ptr.Deref(cur.Spec.Replicas, 1), g.leaders, g.sets)
	}
	partition, replicas, err := rollingUpdate(desired, cur, templateChanged, states)
	if err != nil {
		return ctrl.Result{}, err
	}
	sts, err := LeaderStatefulSet(desired, revision, replicas, partition)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := controllerutil.SetControllerReference(&lws, sts, r.Scheme()); err != nil {
		return ctrl.Result{}, err
	}
	if err := ensureStatefulSet(ctx, r.Client, sts, false); err != nil {
		r.Recorder.Eventf(&lws, nil, corev1.EventTypeWarning, "FailedApply", "ApplyLeaderStatefulSet", "leader StatefulSet %s: %v", sts.Name, err)
		return ctrl.Result{}, err
	}
	if cur != nil {
		r.recordRollout(&lws, cur, revision, templateChanged, partition, replicas)
	}
	if subdomainPolicy(desired) == v1alpha1.SubdomainShared {
		svc := HeadlessService(desired, desired.Name, map[string]string{v1alpha1.SetNameLabelKey: desired.Name})
		if err := controllerutil.SetControllerReference(&lws, svc, r.Scheme()); err != nil {
			return ctrl.Result{}, err
		}
		if err := ensureService(ctx, r.Client, svc); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.updateStatus(ctx, &lws, desired, revision, g); err != nil {
		return ctrl.Result{}, err
	}
	if rolloutDone(desired, cur, templateChanged, partition, replicas, states) {
		if err := truncateRevisions(ctx, r.Client, desired, revision); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// recordRollout reports the steps of a rolling update as events.
func (r *LeaderWorkerSetReconciler) recordRollout(lws *v1alpha1.LeaderWorkerSet, cur *appsv1.StatefulSet, revision string, templateChanged bool, partition, replicas int32) {
	want := ptr.Deref(lws.Spec.Replicas, 1)
	oldPartition, oldReplicas := currentPartition(cur), ptr.Deref(cur.Spec.Replicas, 1)
	switch {
	case templateChanged:
		r.Recorder.Eventf(lws, nil, corev1.EventTypeNormal, "GroupsUpdating", "RollingUpdate",
			"rolling %d groups to template revision %s with %d surge groups", partition, revision, max(replicas-want, 0))
	case partition < oldPartition:
		r.Recorder.Eventf(lws, nil, corev1.EventTypeNormal, "GroupsUpdating", "RollingUpdate",
			"updating groups %d to %d", partition, oldPartition-1)
	}
	if !templateChanged && replicas < oldReplicas && oldReplicas > want {
		r.Recorder.Eventf(lws, nil, corev1.EventTypeNormal, "GroupsProgressing", "RemoveSurge",
			"removing surge groups %d to %d", max(replicas, want), oldReplicas-1)
	}
}

// groups is what the cache holds of a LeaderWorkerSet's groups.
type groups struct {
	leaders []corev1.Pod
	sets    []appsv1.StatefulSet
}

func (r *LeaderWorkerSetReconciler) listGroups(ctx context.Context, lws *v1alpha1.LeaderWorkerSet) (groups, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(lws.Namespace), client.MatchingLabels{
		v1alpha1.SetNameLabelKey: lws.Name, v1alpha1.WorkerIndexLabelKey: "0",
	}); err != nil {
		return groups{}, err
	}
	var sets appsv1.StatefulSetList
	if err := r.List(ctx, &sets, client.InNamespace(lws.Namespace), client.MatchingLabels{v1alpha1.SetNameLabelKey: lws.Name}); err != nil {
		return groups{}, err
	}
	return groups{leaders: pods.Items, sets: sets.Items}, nil
}

// ensureStatefulSet creates sts, or updates the mutable parts of an existing one whose spec hash
// differs. createOnly leaves existing StatefulSets alone (worker StatefulSets are replaced with
// their leader, never updated in place).
func ensureStatefulSet(ctx context.Context, c client.Client, sts *appsv1.StatefulSet, createOnly bool) error {
	var cur appsv1.StatefulSet
	err := c.Get(ctx, client.ObjectKeyFromObject(sts), &cur)
	if apierrors.IsNotFound(err) {
		klog.FromContext(ctx).V(4).Info("creating StatefulSet", "statefulset", klog.KObj(sts))
		return c.Create(ctx, sts)
	}
	if err != nil || createOnly || cur.Annotations[SpecHashAnnotationKey] == sts.Annotations[SpecHashAnnotationKey] {
		return err
	}
	if !metav1.IsControlledBy(&cur, ownerOf(sts)) {
		return fmt.Errorf("StatefulSet %s exists and is not controlled by %s", sts.Name, sts.OwnerReferences[0].Name)
	}
	// selector, serviceName, podManagementPolicy and volumeClaimTemplates are immutable and
	// derived only from immutable inputs; the rest may change.
	cur.Labels, cur.Annotations = sts.Labels, sts.Annotations
	cur.Spec.Replicas = sts.Spec.Replicas
	cur.Spec.Template = sts.Spec.Template
	cur.Spec.UpdateStrategy = sts.Spec.UpdateStrategy
	cur.Spec.PersistentVolumeClaimRetentionPolicy = sts.Spec.PersistentVolumeClaimRetentionPolicy
	cur.Spec.Ordinals = sts.Spec.Ordinals
	klog.FromContext(ctx).V(4).Info("updating StatefulSet", "statefulset", klog.KObj(sts))
	return c.Update(ctx, &cur)
}

func ownerOf(obj metav1.Object) metav1.Object {
	o := obj.GetOwnerReferences()[0]
	return &metav1.ObjectMeta{Name: o.Name, UID: o.UID}
}

// ensureService creates svc if it does not exist; a headless Service never needs updating.
func ensureService(ctx context.Context, c client.Client, svc *corev1.Service) error {
	var cur corev1.Service
	err := c.Get(ctx, client.ObjectKeyFromObject(svc), &cur)
	if apierrors.IsNotFound(err) {
		err = c.Create(ctx, svc)
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
	}
	return err
}

// updateStatus counts groups from the cached leader pods and worker StatefulSets, and writes the
// status only when it changed.
func (r *LeaderWorkerSetReconciler) updateStatus(ctx context.Context, lws, desired *v1alpha1.LeaderWorkerSet, revision string, g groups) error {
	status, counts := ComputeStatus(desired, revision, g.leaders, g.sets)
	status.Conditions = lws.Status.Conditions
	setConditions(&status, counts, desired, lws.Generation)
	if apiequality.Semantic.DeepEqual(status, lws.Status) {
		return nil
	}
	updated := lws.DeepCopy()
	updated.Status = status
	err := r.Status().Update(ctx, updated)
	if apierrors.IsConflict(err) {
		return nil // a newer version is on its way through the cache; it will be reconciled
	}
	return err
}

// GroupCounts is what the conditions are computed from: the groups 0..replicas-1 (surge groups
// excluded), and among them those at or above the rollout partition, the only ones an update
// moves.
type GroupCounts struct {
	// Ready groups below spec.replicas.
	Ready int32
	// Partitioned groups exist below spec.replicas and at or above the partition; of them,
	// Updated carry the current revision and UpdatedReady are also ready.
	Partitioned, Updated, UpdatedReady int32
}

// ComputeStatus counts groups as upstream does: replicas, readyReplicas and updatedReplicas count
// every group that exists, surge groups of a rolling update included. A group is ready when its
// leader pod and all its workers are ready, and updated when both carry the current revision.
// The GroupCounts leave the surge groups out, for the conditions.
func ComputeStatus(lws *v1alpha1.LeaderWorkerSet, revision string, leaders []corev1.Pod, sets []appsv1.StatefulSet) (v1alpha1.LeaderWorkerSetStatus, GroupCounts) {
	replicas := ptr.Deref(lws.Spec.Replicas, 1)
	var partition int32
	if ru := lws.Spec.RolloutStrategy.RollingUpdateConfiguration; ru != nil {
		partition = ptr.Deref(ru.Partition, 0)
	}
	workers := make(map[string]*appsv1.StatefulSet, len(sets))
	for i := range sets {
		workers[sets[i].Name] = &sets[i]
	}
	st := v1alpha1.LeaderWorkerSetStatus{
		ObservedGeneration: lws.Generation,
		HPAPodSelector: labels.SelectorFromSet(labels.Set{
			v1alpha1.SetNameLabelKey: lws.Name, v1alpha1.WorkerIndexLabelKey: "0",
		}).String(),
	}
	var c GroupCounts
	for i := range leaders {
		p := &leaders[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		_, ord := ParentNameAndOrdinal(p.Name)
		if ord < 0 {
			continue
		}
		st.Replicas++
		g := stateOf(p, workers[p.Name], revision)
		if g.ready {
			st.ReadyReplicas++
		}
		if g.updated {
			st.UpdatedReplicas++
		}
		if int32(ord) >= replicas {
			continue
		}
		if g.ready {
			c.Ready++
		}
		// As upstream: a group whose worker StatefulSet is not there yet (being created) is no
		// group an update waits for, so creating a LeaderWorkerSet is no UpdateInProgress.
		if int32(ord) >= partition && !awaitingWorkers(p, workers[p.Name]) {
			c.Partitioned++
			if g.updated {
				c.Updated++
				if g.ready {
					c.UpdatedReady++
				}
			}
		}
	}
	return st, c
}

// awaitingWorkers: the group of leader has workers and their StatefulSet does not exist yet.
func awaitingWorkers(leader *corev1.Pod, workers *appsv1.StatefulSet) bool {
	return leader.Annotations[v1alpha1.SizeAnnotationKey] != "1" && (workers == nil || !metav1.IsControlledBy(workers, leader))
}

// setConditions: UpdateInProgress while a group at or above the partition is not at the current
// revision; Available once every group below spec.replicas is ready and those the update moves are
// updated; Progressing otherwise. A condition is first written when it becomes True.
func setConditions(st *v1alpha1.LeaderWorkerSetStatus, c GroupCounts, lws *v1alpha1.LeaderWorkerSet, gen int64) {
	replicas := ptr.Deref(lws.Spec.Replicas, 1)
	// As upstream: a condition appears once it is True; after that it follows (False when its
	// state has passed), so a new LeaderWorkerSet does not list conditions it never had.
	set := func(t string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		} else if meta.FindStatusCondition(st.Conditions, t) == nil {
			return
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
	}
	updating := c.Updated < c.Partitioned
	available := !updating && c.Ready >= replicas && c.UpdatedReady == c.Partitioned
	set(v1alpha1.LeaderWorkerSetAvailable, available, "AllGroupsReady",
		fmt.Sprintf("%d of %d groups ready", c.Ready, replicas))
	set(v1alpha1.LeaderWorkerSetProgressing, !available, "GroupsProgressing",
		fmt.Sprintf("%d of %d groups ready", c.Ready, replicas))
	set(v1alpha1.LeaderWorkerSetUpdateInProgress, updating, "GroupsUpdating",
		fmt.Sprintf("%d of %d groups updated", c.Updated, c.Partitioned))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// SetupWithManager registers the reconciler: LeaderWorkerSets, their leader StatefulSets and
// Services, and — through the name label — worker StatefulSets and leader pods, whose readiness
// feeds the status.
func (r *LeaderWorkerSetReconciler) SetupWithManager(mgr ctrl.Manager) error {
	byName := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name, ok := o.GetLabels()[v1alpha1.SetNameLabelKey]
		if !ok {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
	})
	// Only leader pods: a worker's readiness reaches the status through its StatefulSet.
	leaders := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[v1alpha1.WorkerIndexLabelKey] == "0"
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("leaderworkerset").
		For(&v1alpha1.LeaderWorkerSet{}).
		Owns(&corev1.Service{}).
		Watches(&appsv1.StatefulSet{}, byName).
		Watches(&corev1.Pod{}, byName, builder.WithPredicates(leaders)).
		Complete(r)
}
