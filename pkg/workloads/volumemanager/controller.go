package volumemanager

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/params"
)

// Reconciler makes each VolumeManager's datasets present on their nodes.
type Reconciler struct {
	client.Client
	// APIReader reads kubelet's FailedMount events of stager pods without caching every Event
	// of the cluster; nil skips them.
	APIReader client.Reader
	// Recorder records the VolumeManager's Events; nil records none.
	Recorder events.EventRecorder
	Config   Config
}

// +kubebuilder:rbac:groups=data.cistern.dev,resources=volumemanagers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=data.cistern.dev,resources=volumemanagers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=data.cistern.dev,resources=volumemanagers/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=list
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=storagepool.storage.k8s.io,resources=storagepools,verbs=get;list;watch

// stagingPoll is how often a VolumeManager whose stager pods are mounting is looked at again, to
// read kubelet's FailedMount events (which are not watched).
const stagingPoll = 5 * time.Second

// world is what one reconcile reads from the cache, once.
type world struct {
	nodes       []corev1.Node
	byID        map[string]*corev1.Node // by driver node ID
	inventories map[string]*NodeInventory
	pvs         []corev1.PersistentVolume
	pvcs        []corev1.PersistentVolumeClaim
	stagers     map[string]*corev1.Pod // by name
	// previous is the last status' node states, by volume ID and node ID.
	previous map[string]map[string]datav1alpha1.NodeStatus
	// serving is the claim the last status gave users, by volume ID.
	serving map[string]string
	// users are the pods of the namespace, other than stager pods, using the VolumeManager's
	// claims and not finished, by claim.
	users claimUsers
}

// Reconcile brings one VolumeManager's volumes, claims and stager pods to its spec, and its status
// to what the nodes hold.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := klog.FromContext(ctx).WithValues("volumemanager", req.NamespacedName)
	ctx = klog.NewContext(ctx, logger)
	var vm datav1alpha1.VolumeManager
	if err := r.Get(ctx, req.NamespacedName, &vm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	w, err := r.read(ctx, &vm)
	if err != nil {
		return ctrl.Result{}, err
	}
	if vm.DeletionTimestamp != nil {
		return ctrl.Result{}, r.release(ctx, &vm, w)
	}
	if controllerutil.AddFinalizer(&vm, Finalizer) {
		if err := r.Update(ctx, &vm); err != nil {
			return ctrl.Result{}, err
		}
	}
	if vm.Spec.State == datav1alpha1.RequestCompleted {
		return ctrl.Result{}, r.complete(ctx, &vm, w)
	}

	status := datav1alpha1.VolumeManagerStatus{ObservedGeneration: vm.Generation, State: datav1alpha1.StateRunning}
	keep := map[string]bool{}     // names of PVs and PVCs still wanted
	keepPods := map[string]bool{} // stager pods still wanted
	outcomes := map[string]volumeOutcome{}
	var ids, problems []string
	poll := false
	for i := range vm.Spec.VolumeConfigs {
		vc := &vm.Spec.VolumeConfigs[i]
		v, o, mounting, err := r.reconcileVolume(ctx, &vm, vc, w, keep, keepPods)
		if err != nil {
			return ctrl.Result{}, err
		}
		poll = poll || mounting
		status.Volumes = append(status.Volumes, v)
		outcomes[vc.ID], ids = o, append(ids, vc.ID)
		if o.state != datav1alpha1.StateRunning {
			problems = append(problems, fmt.Sprintf("%s: %s", vc.ID, o.message))
			if status.State != datav1alpha1.StateFailed {
				status.State = o.state
			}
		}
	}
	if len(problems) > 0 {
		status.Message = strings.Join(problems, "; ")
	} else {
		status.Message = fmt.Sprintf("%d volumes ready", len(status.Volumes))
	}
	status.Progress = Progress(status.Volumes)
	status.Conditions = conditions(vm.Status.Conditions, vm.Generation, outcomes, ids, status.State, status.Message, w.users)
	if hold := holdOutputs(w, keep); writesBack(&vm) || hold.held() {
		meta.SetStatusCondition(&status.Conditions, outputsCondition(vm.Generation, hold))
	}
	if err := r.deleteStagers(ctx, w, keepPods); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.deleteUnwanted(ctx, w.pvs, w.pvcs, keep); err != nil {
		return ctrl.Result{}, err
	}
	result := ctrl.Result{}
	if poll {
		result.RequeueAfter = stagingPoll
	}
	return result, r.writeStatus(ctx, &vm, status)
}

// complete honours spec.state Completed: it deletes the stager pods and the claims (the API server
// keeps a claim while a pod uses it), then the volumes once their claims are gone, and reports
// Completed when nothing is left. Their deletions requeue it. Nothing new is made.
func (r *Reconciler) complete(ctx context.Context, vm *datav1alpha1.VolumeManager, w *world) error {
	if err := r.deleteStagers(ctx, w, nil); err != nil {
		return err
	}
	// A volume whose copies' outputs are still on their nodes stays until they are uploaded.
	keep := map[string]bool{}
	hold := holdOutputs(w, keep)
	if err := r.deleteUnwanted(ctx, w.pvs, w.pvcs, keep); err != nil {
		return err
	}
	left := leftovers{stagers: len(w.stagers), claims: len(w.pvcs), volumes: len(w.pvs), users: w.users, outputs: hold,
		writesBack: writesBack(vm)}
	return r.writeStatus(ctx, vm, completionStatus(vm, left))
}

// writeStatus writes status when it differs from vm's, and records an Event for each condition
// that changed.
func (r *Reconciler) writeStatus(ctx context.Context, vm *datav1alpha1.VolumeManager, status datav1alpha1.VolumeManagerStatus) error {
	if apiequality.Semantic.DeepEqual(status, vm.Status) {
		return nil
	}
	old := vm.Status.Conditions
	vm.Status = status
	if err := r.Status().Update(ctx, vm); apierrors.IsConflict(err) {
		return nil // the cache was behind; the newer object requeues us
	} else if err != nil {
		return err
	}
	// Only once written: a reconcile from a stale cache records nothing twice.
	r.recordChanges(vm, old, status.Conditions)
	klog.FromContext(ctx).V(4).Info("status", "state", status.State, "message", status.Message)
	return nil
}

// read lists what a reconcile of vm needs, from the cache.
func (r *Reconciler) read(ctx context.Context, vm *datav1alpha1.VolumeManager) (*world, error) {
	w := &world{byID: map[string]*corev1.Node{}, stagers: map[string]*corev1.Pod{},
		previous: map[string]map[string]datav1alpha1.NodeStatus{}, serving: map[string]string{}}
	var err error
	if w.pvs, w.pvcs, err = r.owned(ctx, vm); err != nil {
		return nil, err
	}
	if err := r.readPods(ctx, vm, w); err != nil {
		return nil, err
	}
	if vm.DeletionTimestamp != nil {
		return w, nil
	}
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes); err != nil {
		return nil, err
	}
	w.nodes = nodes.Items
	for i := range w.nodes {
		if id := w.nodes[i].Labels[consts.TopologyKey]; id != "" {
			w.byID[id] = &w.nodes[i]
		}
	}
	var pools spapi.StoragePoolList
	if err := r.List(ctx, &pools); err != nil {
		return nil, err
	}
	w.inventories = Inventories(pools.Items, r.Config.driverName())
	for _, v := range vm.Status.Volumes {
		m := map[string]datav1alpha1.NodeStatus{}
		for _, n := range v.Nodes {
			m[n.Name] = n
		}
		w.previous[v.ID] = m
		if c := v.VolumeSource.PersistentVolumeClaim; c != nil {
			w.serving[v.ID] = c.ClaimName
		}
	}
	return w, nil
}

// readPods sorts the namespace's pods into vm's stager pods and the pods using its claims.
func (r *Reconciler) readPods(ctx context.Context, vm *datav1alpha1.VolumeManager, w *world) error {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(vm.Namespace)); err != nil {
		return err
	}
	claims := map[string]bool{}
	for _, c := range w.pvcs {
		claims[c.Name] = true
	}
	w.users = claimUsers{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if l := p.Labels; l[LabelManager] == vm.Name && l[LabelNamespace] == vm.Namespace && l[LabelStager] == "true" {
			w.stagers[p.Name] = p
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // a finished pod holds no claim (the API server's claim protection agrees)
		}
		for _, v := range p.Spec.Volumes {
			if c := v.PersistentVolumeClaim; c != nil && claims[c.ClaimName] && !slices.Contains(w.users[c.ClaimName], p.Name) {
				w.users[c.ClaimName] = append(w.users[c.ClaimName], p.Name)
			}
		}
	}
	for c := range w.users {
		slices.Sort(w.users[c])
	}
	return nil
}

// servingVolume is the claim users were given and its nodes: it keeps serving until a new node set
// is Ready. Without one in the status (never written), the live volume on current, the eligible
// nodes that hold the volume now.
func servingVolume(vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig, w *world, current []string) (string, []string) {
	claim, nodes := "", []string(nil)
	for i := range w.pvs {
		pv := &w.pvs[i]
		if ref := pv.Spec.ClaimRef; ref != nil && ref.Name == w.serving[vc.ID] && pv.Labels[LabelVolumeID] == vc.ID && pv.DeletionTimestamp == nil {
			claim, nodes = ref.Name, NodesOf(pv)
		}
	}
	if claim == "" && current != nil {
		claim, nodes = objectName(vm, vc.ID, current), current
	}
	return claim, nodes
}

// createMissing creates those of objs (for the node set chosen) that do not exist yet.
func (r *Reconciler) createMissing(ctx context.Context, chosen []string, objs ...client.Object) error {
	for _, obj := range objs {
		err := r.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
		if apierrors.IsNotFound(err) {
			klog.FromContext(ctx).V(3).Info("creating", "kind", obj.GetObjectKind().GroupVersionKind().Kind, "name", obj.GetName(), "nodes", chosen)
			err = r.Create(ctx, obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

func (r *Reconciler) reconcileVolume(ctx context.Context, vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig,
	w *world, keep, keepPods map[string]bool,
) (datav1alpha1.Volume, volumeOutcome, bool, error) {
	attrs, err := DatasetAttributes(vc, r.Config)
	if err != nil {
		return datav1alpha1.Volume{ID: vc.ID, Message: err.Error()}, volumeOutcome{state: datav1alpha1.StateFailed, message: err.Error(),
			placedWhy: "invalid volume", failedReason: datav1alpha1.ReasonInvalid}, false, nil
	}
	pl, err := params.Parse(attrs, params.StaticPV)
	if err != nil { // DatasetAttributes parsed them already
		return datav1alpha1.Volume{}, volumeOutcome{}, false, err
	}
	datasetID := pl.Dataset.ID()
	c := capacity(vc)
	current := currentPlacement(vc, w.pvs, w.nodes, r.Config.AllowControlPlane)
	chosen := SelectNodes(vc, Placement{Nodes: w.nodes, Inventories: w.inventories, DatasetID: datasetID, Capacity: c.Value(),
		AllowControlPlane: r.Config.AllowControlPlane, Spread: SpreadKey(vm, vc)}, current)

	servingClaim, servingNodes := servingVolume(vm, vc, w, current)
	if len(chosen) < int(vc.Replicas) {
		// Too few nodes: make nothing new (each node set is its own claim, so growing one node at
		// a time would churn claims), and keep what an earlier node set already placed.
		msg := fmt.Sprintf("only %d of %d nodes eligible", len(chosen), vc.Replicas)
		o := volumeOutcome{state: datav1alpha1.StatePending, message: msg, placedWhy: msg}
		if servingClaim == "" {
			return datav1alpha1.Volume{ID: vc.ID, Message: msg}, o, false, nil
		}
		keep[pvName(vm, vc.ID, servingNodes)], keep[servingClaim] = true, true
		nodes, mounting := r.observe(ctx, vm, vc, servingClaim, servingNodes, datasetID, w, keepPods)
		o.message = msg + "; keeping the data where it is"
		return StatusVolume(vc, servingClaim, servingNodes, nodes, o.message), o, mounting, nil
	}

	pv := PersistentVolume(vm, vc, chosen, attrs, r.Config)
	pvc := PersistentVolumeClaim(vm, vc, chosen)
	if err := controllerutil.SetControllerReference(vm, pvc, r.Scheme()); err != nil {
		return datav1alpha1.Volume{}, volumeOutcome{}, false, err
	}
	keep[pv.Name], keep[pvc.Name] = true, true
	if err := r.createMissing(ctx, chosen, pv, pvc); err != nil {
		return datav1alpha1.Volume{}, volumeOutcome{}, false, err
	}
	nodes, mounting := r.observe(ctx, vm, vc, pvc.Name, chosen, datasetID, w, keepPods)
	o := volumeOutcome{placed: true}
	claim, serving := pvc.Name, chosen
	if servingClaim != "" && servingClaim != pvc.Name {
		if st, _ := volumeState(vc.Replicas, chosen, nodes); st == datav1alpha1.StateRunning {
			klog.FromContext(ctx).V(2).Info("new nodes ready; releasing the old ones", "volume", vc.ID, "old", servingNodes, "new", chosen)
		} else {
			// Stage on the new node set first; the old claim serves until it is Ready.
			keep[pvName(vm, vc.ID, servingNodes)], keep[servingClaim] = true, true
			claim, serving = servingClaim, servingNodes
			o.replacing = fmt.Sprintf("moving from %s to %s", strings.Join(servingNodes, ","), strings.Join(chosen, ","))
			for _, id := range servingNodes {
				if slices.Contains(chosen, id) {
					continue
				}
				n := datav1alpha1.NodeStatus{Name: id, State: datav1alpha1.NodePending, Message: "the node is gone"}
				if w.byID[id] != nil {
					n = NodeStatusOf(datasetID, r.observation(ctx, vm, vc, id, datasetID, w))
					n.Message = strings.TrimPrefix(n.Message+"; ", "; ") + "being replaced: released once the new nodes are ready"
				}
				nodes = append(nodes, n)
			}
		}
	}
	o.state, o.message = volumeState(vc.Replicas, serving, nodes)
	if o.replacing != "" {
		o.message = strings.TrimSuffix(o.replacing+": "+o.message, ": ")
	}
	if o.state == datav1alpha1.StateFailed {
		o.failedReason = datav1alpha1.ReasonStagingFailed
	}
	return StatusVolume(vc, claim, serving, nodes, o.message), o, mounting, nil
}

// observe reads the data's state on each node of a node set and keeps a stager pod, mounting
// claim, on every node where it is not proved Ready yet. mounting says a stager pod is on its
// node and not done, so kubelet's events are worth reading again soon.
func (r *Reconciler) observe(ctx context.Context, vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig, claim string,
	nodeIDs []string, datasetID string, w *world, keepPods map[string]bool,
) ([]datav1alpha1.NodeStatus, bool) {
	mounting := false
	var out []datav1alpha1.NodeStatus
	for _, id := range nodeIDs {
		obs := r.observation(ctx, vm, vc, id, datasetID, w)
		ns := NodeStatusOf(datasetID, obs)
		out = append(out, ns)
		name := stagerName(vm, vc.ID, id)
		prev := w.previous[vc.ID][id].State == datav1alpha1.NodeReady
		switch {
		case ns.State == datav1alpha1.NodeReady && prev:
			// Proved and recorded: the stager pod, if any, has done its job.
		case obs.Stager != nil && obs.Stager.Status.Phase == corev1.PodFailed:
			// Made again on a later reconcile, once this one is gone.
			klog.FromContext(ctx).V(2).Info("stager pod failed", "pod", name, "reason", obs.Stager.Status.Reason, "message", obs.Stager.Status.Message)
		case obs.Stager != nil:
			keepPods[name] = true
			mounting = mounting || obs.Stager.Spec.NodeName != "" && obs.Stager.Status.Phase != corev1.PodSucceeded
		case ns.State == datav1alpha1.NodeReady:
		case w.byID[id] != nil:
			keepPods[name] = true
			if err := r.createStager(ctx, vm, vc, claim, w.byID[id], id); err != nil {
				klog.FromContext(ctx).Error(err, "creating stager pod", "pod", name)
			}
		}
	}
	return out, mounting
}

// observation gathers what is known of a volume's data on one node.
func (r *Reconciler) observation(ctx context.Context, vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig, id, datasetID string, w *world) NodeObservation {
	o := NodeObservation{ID: id, Stager: w.stagers[stagerName(vm, vc.ID, id)],
		Proved: w.previous[vc.ID][id].State == datav1alpha1.NodeReady}
	if n := w.byID[id]; n != nil {
		o.Inventory = w.inventories[n.Name]
	}
	if o.Stager != nil && o.Stager.Spec.NodeName != "" && o.Stager.Status.Phase == corev1.PodPending &&
		!(o.Inventory != nil && o.Inventory.Ready[datasetID]) {
		o.MountMessage = r.mountFailure(ctx, o.Stager)
	}
	return o
}

// mountFailure is the message of kubelet's latest FailedMount event about pod, or "".
func (r *Reconciler) mountFailure(ctx context.Context, pod *corev1.Pod) string {
	if r.APIReader == nil {
		return ""
	}
	var evs corev1.EventList
	if err := r.APIReader.List(ctx, &evs, client.InNamespace(pod.Namespace), client.MatchingFields{
		"involvedObject.uid": string(pod.UID), "reason": "FailedMount"}); err != nil {
		klog.FromContext(ctx).V(3).Info("reading stager pod events", "pod", pod.Name, "err", err)
		return ""
	}
	var latest *corev1.Event
	for i := range evs.Items {
		if e := &evs.Items[i]; latest == nil || eventTime(e).After(eventTime(latest)) {
			latest = e
		}
	}
	if latest == nil {
		return ""
	}
	return latest.Message
}

func eventTime(e *corev1.Event) time.Time {
	switch {
	case e.Series != nil:
		return e.Series.LastObservedTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func (r *Reconciler) createStager(ctx context.Context, vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig, claim string, node *corev1.Node, id string) error {
	pod := StagerPod(vm, vc, claim, node, id, r.Config.StagerImage)
	if err := controllerutil.SetControllerReference(vm, pod, r.Scheme()); err != nil {
		return err
	}
	klog.FromContext(ctx).V(3).Info("creating stager pod", "pod", pod.Name, "node", node.Name, "claim", claim)
	if err := r.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// deleteStagers deletes the stager pods not wanted: done, failed, or for nodes no longer chosen.
func (r *Reconciler) deleteStagers(ctx context.Context, w *world, keep map[string]bool) error {
	for name, pod := range w.stagers {
		if keep[name] || pod.DeletionTimestamp != nil {
			continue
		}
		klog.FromContext(ctx).V(3).Info("deleting stager pod", "pod", name, "phase", pod.Status.Phase)
		if err := r.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// recordChanges records an Event for each condition whose status or reason changed.
func (r *Reconciler) recordChanges(vm *datav1alpha1.VolumeManager, old, cur []metav1.Condition) {
	if r.Recorder == nil {
		return
	}
	for _, c := range cur {
		prev := meta.FindStatusCondition(old, c.Type)
		if prev != nil && prev.Status == c.Status && prev.Reason == c.Reason {
			continue
		}
		typ := corev1.EventTypeNormal
		if c.Reason == datav1alpha1.ReasonStagingFailed || c.Reason == datav1alpha1.ReasonInvalid || c.Reason == datav1alpha1.ReasonTooFewNodes ||
			c.Reason == string(datav1alpha1.StateFailed) || c.Reason == datav1alpha1.ReasonUploadFailing || c.Reason == datav1alpha1.ReasonOutputsUnknown {
			typ = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(vm, nil, typ, c.Reason, c.Type, "%s", c.Message)
	}
}

// currentPlacement is the node set of the live PersistentVolume of vc that has the most nodes still
// eligible (nil when there is none).
func currentPlacement(vc *datav1alpha1.VolumeConfig, pvs []corev1.PersistentVolume, nodes []corev1.Node, allowControlPlane bool) []string {
	eligible := map[string]bool{}
	for i := range nodes {
		if EligibleNode(vc, &nodes[i], allowControlPlane) {
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
func (r *Reconciler) release(ctx context.Context, vm *datav1alpha1.VolumeManager, w *world) error {
	if !controllerutil.ContainsFinalizer(vm, Finalizer) {
		return nil
	}
	// Stager pods first: their claims go only once no pod uses them.
	if err := r.deleteStagers(ctx, w, nil); err != nil {
		return err
	}
	pvs := w.pvs
	if err := r.deleteUnwanted(ctx, pvs, w.pvcs, nil); err != nil {
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

// SetupWithManager registers the reconciler for VolumeManagers, their claims, volumes and stager
// pods, Nodes (a node coming or going changes where data can be) and StoragePools (what each
// node's cache holds, within seconds of a change).
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
	// A pod using a VolumeManager's claim changes its InUse condition (and what a release waits for).
	claimUsers := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		pod, ok := o.(*corev1.Pod)
		if !ok {
			return nil
		}
		var reqs []reconcile.Request
		for _, v := range pod.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			var c corev1.PersistentVolumeClaim
			if err := mgr.GetClient().Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: v.PersistentVolumeClaim.ClaimName}, &c); err != nil {
				continue
			}
			if l := c.Labels; l[LabelManager] != "" && l[LabelNamespace] == pod.Namespace {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: pod.Namespace, Name: l[LabelManager]}})
			}
		}
		return reqs
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("volumemanager").
		For(&datav1alpha1.VolumeManager{}).
		Watches(&corev1.PersistentVolumeClaim{}, byLabels).
		Watches(&corev1.PersistentVolume{}, byLabels).
		Owns(&corev1.Pod{}).
		Watches(&corev1.Pod{}, claimUsers).
		Watches(&corev1.Node{}, allManagers).
		Watches(&spapi.StoragePool{}, allManagers).
		Complete(r)
}
