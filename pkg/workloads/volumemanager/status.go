package volumemanager

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
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
	return fmt.Sprintf("%s of %s", human(done), human(total))
}

func human(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

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

// volumeState reads a volume's state from its nodes: Ready when replicas of the nodes its claim
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
		return datav1alpha1.StateReady, ""
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

// conditions sets Placed and DataReady on a copy of old, keeping transition times of unchanged
// conditions.
func conditions(old []metav1.Condition, generation int64, outcomes map[string]volumeOutcome, ids []string) []metav1.Condition {
	out := append([]metav1.Condition(nil), old...)
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
