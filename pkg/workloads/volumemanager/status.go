package volumemanager

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/units"
)

// NodeObservation is what the controller sees of one volume's data on one node.
type NodeObservation struct {
	// ID is the driver's node ID.
	ID string
	// Inventory is the node's StoragePools' inventory; nil when none reports.
	Inventory *NodeInventory
	// Stager is the node's stager pod for the volume; nil when there is none.
	Stager *corev1.Pod
	// MountMessage is kubelet's latest FailedMount event about the stager pod.
	MountMessage string
	// Proved is true when an earlier status had the data Ready on the node: a stager pod mounted
	// the claim there, so the VolumeManager's credentials were checked on that node.
	Proved bool
}

// NodeStatusOf says where datasetID stands on a node. Ready needs both the node's inventory and a
// stager pod that ran there (now or before): the cache may hold the dataset for someone else,
// and only a mount with the VolumeManager's own credentials proves they may read it. Until then
// the node's inventory is not read at all: what another tenant's staging of the same source did
// (held, staging, its progress, failed) is no business of this VolumeManager's namespace, which
// could otherwise learn whether a guessed bucket and prefix are cached there.
func NodeStatusOf(datasetID string, o NodeObservation) datav1alpha1.NodeStatus {
	ns := datav1alpha1.NodeStatus{Name: o.ID}
	ran := o.Stager != nil && o.Stager.Status.Phase == corev1.PodSucceeded
	var d spapi.CachedDataset
	listed, ready := false, false
	if o.Inventory != nil && (o.Proved || ran) {
		d, listed = o.Inventory.Datasets[datasetID]
		ready = o.Inventory.Ready[datasetID]
	}
	if listed {
		ns.BytesDone, ns.BytesTotal = d.BytesDone, d.BytesTotal
	}
	switch {
	case ready:
		ns.State = datav1alpha1.NodeReady
	case listed && d.State == spapi.DatasetFailed:
		ns.State, ns.Message = datav1alpha1.NodeFailed, o.MountMessage
		if ns.Message == "" {
			ns.Message = "staging failed on the node: " + d.Reason
		}
	case o.MountMessage != "" && permanentMountFailure(o.MountMessage):
		ns.State, ns.Message = datav1alpha1.NodeFailed, o.MountMessage
	case listed:
		ns.State, ns.Message = datav1alpha1.NodeStaging, "staging: "+progress(d.BytesDone, d.BytesTotal)
	case ran:
		ns.State, ns.Message = datav1alpha1.NodeStaging, "staged; waiting for the node's StoragePool inventory"
	case o.Stager != nil && o.Stager.Spec.NodeName != "":
		ns.State, ns.Message = datav1alpha1.NodeStaging, o.MountMessage
		if ns.Message == "" {
			ns.Message = "stager pod " + o.Stager.Name + " is mounting the volume" + waitingReason(o.Stager)
		}
	default:
		ns.State, ns.Message = datav1alpha1.NodePending, "waiting for a stager pod to be scheduled"
		if o.Stager != nil {
			if c := podCondition(o.Stager, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse && c.Message != "" {
				ns.Message += ": " + c.Message
			}
		}
	}
	return ns
}

// permanentMountFailure says whether kubelet's FailedMount message is a failure to report rather
// than progress: the driver answers Unavailable while a dataset downloads, and kubelet's own
// timeout messages only say it is still waiting.
func permanentMountFailure(msg string) bool {
	for _, transient := range []string{"code = Unavailable", "code = Aborted", "code = DeadlineExceeded", "timed out waiting", "context deadline exceeded"} {
		if strings.Contains(msg, transient) {
			return false
		}
	}
	return true
}

func waitingReason(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
			return " (" + w.Reason + ")"
		}
	}
	return ""
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func progress(done, total int64) string {
	if total <= 0 {
		return "listing the source"
	}
	return units.Progress(done, total)
}

// Progress sums the data staged over every volume's nodes ("3.1 GiB of 12.5 GiB, 24%"): a Ready
// node counts in full, a node whose dataset is not listed yet not at all; "" before any is.
func Progress(volumes []datav1alpha1.Volume) string {
	var done, total int64
	for _, v := range volumes {
		for _, n := range v.Nodes {
			d := n.BytesDone
			if n.State == datav1alpha1.NodeReady {
				d = n.BytesTotal
			}
			done, total = done+min(d, n.BytesTotal), total+n.BytesTotal
		}
	}
	return units.Progress(done, total)
}

// volumeOutcome is one volume's part of the VolumeManager's state and conditions.
type volumeOutcome struct {
	state datav1alpha1.State
	// placed is false, with why, when the volume has no node set of replicas nodes.
	placed    bool
	placedWhy string
	// replacing names the nodes being replaced, if any.
	replacing string
	// message says what keeps the data from being ready.
	message string
	// failedReason is the Failed condition reason: InvalidVolume or StagingFailed.
	failedReason string
}

// volumeState reads a volume's state from its nodes: Running when replicas of the nodes its claim
// serves are Ready, Failed when a chosen node failed, Pending otherwise.
func volumeState(replicas int32, serving []string, nodes []datav1alpha1.NodeStatus) (datav1alpha1.State, string) {
	byName := map[string]datav1alpha1.NodeStatus{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	ready := 0
	for _, id := range serving {
		if byName[id].State == datav1alpha1.NodeReady {
			ready++
		}
	}
	if ready >= int(replicas) {
		return datav1alpha1.StateRunning, ""
	}
	var failed, waiting []string
	for _, n := range nodes {
		switch n.State {
		case datav1alpha1.NodeFailed:
			failed = append(failed, n.Name+": "+n.Message)
		case datav1alpha1.NodeReady:
		default:
			waiting = append(waiting, n.Name+" "+strings.ToLower(string(n.State)))
		}
	}
	if len(failed) > 0 {
		return datav1alpha1.StateFailed, strings.Join(failed, "; ")
	}
	return datav1alpha1.StatePending, fmt.Sprintf("%d of %d nodes ready (%s)", ready, replicas, strings.Join(waiting, ", "))
}

// conditions sets Ready, Placed, DataReady and InUse on a copy of old, keeping transition times of
// unchanged conditions. state and message are the VolumeManager's; users the pods using its claims.
func conditions(old []metav1.Condition, generation int64, outcomes map[string]volumeOutcome, ids []string,
	state datav1alpha1.State, message string, users claimUsers,
) []metav1.Condition {
	out := append([]metav1.Condition(nil), old...)
	meta.SetStatusCondition(&out, readyCondition(generation, state, message))
	meta.SetStatusCondition(&out, inUseCondition(generation, users))
	placed := metav1.Condition{Type: datav1alpha1.ConditionPlaced, Status: metav1.ConditionTrue, Reason: datav1alpha1.ReasonPlaced,
		Message: "every volume has its nodes", ObservedGeneration: generation}
	ready := metav1.Condition{Type: datav1alpha1.ConditionDataReady, Status: metav1.ConditionTrue, Reason: datav1alpha1.ReasonDataReady,
		Message: "every volume's data is on its nodes", ObservedGeneration: generation}
	var unplaced, replacing, failed, waiting []string
	invalid := false
	for _, id := range ids {
		o := outcomes[id]
		if !o.placed {
			unplaced = append(unplaced, id+": "+o.placedWhy)
			invalid = invalid || o.failedReason == datav1alpha1.ReasonInvalid
		}
		if o.replacing != "" {
			replacing = append(replacing, id+": "+o.replacing)
		}
		switch o.state {
		case datav1alpha1.StateFailed:
			failed = append(failed, id+": "+o.message)
		case datav1alpha1.StatePending:
			waiting = append(waiting, id+": "+o.message)
		}
	}
	switch {
	case len(unplaced) > 0:
		placed.Status, placed.Reason, placed.Message = metav1.ConditionFalse, datav1alpha1.ReasonTooFewNodes, strings.Join(unplaced, "; ")
		if invalid {
			placed.Reason = datav1alpha1.ReasonInvalid
		}
	case len(replacing) > 0:
		placed.Reason, placed.Message = datav1alpha1.ReasonReplacingNodes, strings.Join(replacing, "; ")
	}
	switch {
	case len(failed) > 0:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, datav1alpha1.ReasonStagingFailed, strings.Join(failed, "; ")
		if invalid {
			ready.Reason = datav1alpha1.ReasonInvalid
		}
	case len(waiting) > 0:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, datav1alpha1.ReasonStaging, strings.Join(waiting, "; ")
	}
	meta.SetStatusCondition(&out, placed)
	meta.SetStatusCondition(&out, ready)
	return out
}

// readyCondition is Ready for a VolumeManager whose spec.state is not Completed: true while
// Running; its reason is the state.
func readyCondition(generation int64, state datav1alpha1.State, message string) metav1.Condition {
	c := metav1.Condition{Type: datav1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: string(state),
		Message: message, ObservedGeneration: generation}
	if state == datav1alpha1.StateRunning {
		c.Status = metav1.ConditionTrue
	}
	return c
}

// claimUsers are the pods (not stager pods, not finished) using a VolumeManager's claims, by claim.
type claimUsers map[string][]string

// maxNamedPods bounds the pod names a message lists.
const maxNamedPods = 5

// String says which pods use which claims, naming at most maxNamedPods pods.
func (u claimUsers) String() string {
	claims := slices.Sorted(maps.Keys(u))
	var parts []string
	named, total := 0, 0
	for _, c := range claims {
		total += len(u[c])
		var names []string
		for _, p := range u[c] {
			if named < maxNamedPods {
				names = append(names, p)
				named++
			}
		}
		if len(names) > 0 {
			parts = append(parts, fmt.Sprintf("claim %s by pod %s", c, strings.Join(names, ", ")))
		}
	}
	msg := "used: " + strings.Join(parts, "; ")
	if total > named {
		msg += fmt.Sprintf(" and %d more pods", total-named)
	}
	return msg
}

func inUseCondition(generation int64, users claimUsers) metav1.Condition {
	if len(users) == 0 {
		return metav1.Condition{Type: datav1alpha1.ConditionInUse, Status: metav1.ConditionFalse, Reason: datav1alpha1.ReasonNotInUse,
			Message: "no pod uses the volumes", ObservedGeneration: generation}
	}
	return metav1.Condition{Type: datav1alpha1.ConditionInUse, Status: metav1.ConditionTrue, Reason: datav1alpha1.ReasonPodsUsing,
		Message: users.String(), ObservedGeneration: generation}
}

// leftovers is what is still there of a VolumeManager whose spec.state is Completed.
type leftovers struct {
	stagers, claims, volumes int
	users                    claimUsers
	// outputs holds the volumes whose copies' outputs are not at their targets yet; writesBack
	// says the VolumeManager names an output target.
	outputs    outputHold
	writesBack bool
}

func (l leftovers) empty() bool { return l.stagers == 0 && l.claims == 0 && l.volumes == 0 }

// completionStatus is the status of a VolumeManager whose spec.state is Completed. While anything
// made for it is left, status.state keeps its last value (Running while pods still use the
// volumes) and conditions Ready=False and Completed=False say the release is under way; once
// nothing is left it is Completed.
func completionStatus(vm *datav1alpha1.VolumeManager, left leftovers) datav1alpha1.VolumeManagerStatus {
	gen := vm.Generation
	status := datav1alpha1.VolumeManagerStatus{ObservedGeneration: gen, State: vm.Status.State, Volumes: vm.Status.Volumes}
	conds := append([]metav1.Condition(nil), vm.Status.Conditions...)
	meta.SetStatusCondition(&conds, inUseCondition(gen, left.users))
	if left.writesBack || left.outputs.held() {
		meta.SetStatusCondition(&conds, outputsCondition(gen, left.outputs))
	}
	if left.empty() {
		// Every volume is deleted, and a volume with outputs is deleted only once no node holds
		// them (holdOutputs): the outputs are at their targets.
		status.State, status.Message = datav1alpha1.StateCompleted, "spec.state is Completed: the volumes are released"
		status.Volumes = nil
		for _, vc := range vm.Spec.VolumeConfigs {
			status.Volumes = append(status.Volumes, datav1alpha1.Volume{ID: vc.ID, Message: "released"})
		}
		for _, t := range []string{datav1alpha1.ConditionPlaced, datav1alpha1.ConditionDataReady} {
			meta.SetStatusCondition(&conds, metav1.Condition{Type: t, Status: metav1.ConditionFalse, Reason: datav1alpha1.ReasonReleased,
				Message: "the volumes are released", ObservedGeneration: gen})
		}
		meta.SetStatusCondition(&conds, metav1.Condition{Type: datav1alpha1.ConditionCompleted, Status: metav1.ConditionTrue,
			Reason: datav1alpha1.ReasonReleased, Message: status.Message, ObservedGeneration: gen})
		meta.SetStatusCondition(&conds, metav1.Condition{Type: datav1alpha1.ConditionReady, Status: metav1.ConditionFalse,
			Reason: string(datav1alpha1.StateCompleted), Message: status.Message, ObservedGeneration: gen})
		status.Conditions = conds
		return status
	}
	switch status.State {
	case "":
		status.State = datav1alpha1.StatePending
	case datav1alpha1.StateReady:
		status.State = datav1alpha1.StateRunning
	case datav1alpha1.StateFailed:
		if c := meta.FindStatusCondition(vm.Status.Conditions, datav1alpha1.ConditionCompleted); c != nil && c.Reason == datav1alpha1.ReasonUploadFailing {
			// Failed for a refusing target, set below again while it refuses.
			status.State = datav1alpha1.StateRunning
		}
	}
	status.Message = fmt.Sprintf("spec.state is Completed: releasing %d stager pods, %d claims, %d volumes", left.stagers, left.claims, left.volumes)
	if len(left.users) > 0 {
		status.Message += "; waiting for the pods using them to end: " + left.users.String()
	}
	reason := datav1alpha1.ReasonCompleting
	if left.outputs.held() {
		status.Message += "; " + left.outputs.String()
		if left.stagers == 0 && left.claims == 0 {
			// Only uploads hold the volumes now: say so in the reason.
			reason = left.outputs.reason()
		}
		if left.outputs.failing > 0 {
			// Not final: the node retries; once the target takes the outputs, Completed follows.
			status.State = datav1alpha1.StateFailed
		}
	}
	for _, t := range []string{datav1alpha1.ConditionReady, datav1alpha1.ConditionCompleted} {
		meta.SetStatusCondition(&conds, metav1.Condition{Type: t, Status: metav1.ConditionFalse, Reason: reason,
			Message: status.Message, ObservedGeneration: gen})
	}
	status.Conditions = conds
	return status
}
