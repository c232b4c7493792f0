package volumemanager

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/units"
)

// outputHold is what keeps a VolumeManager's volumes from being released while it has an
// outputTarget: the writable copies its nodes still hold whose outputs are not at their targets.
// The controller learns it from the nodes' StoragePools (status.cache.outputs), which the node
// plugin writes: it needs no access to the nodes, the targets or the tenant's credentials, and
// no new permission (it reads StoragePools already). Each copy is listed from its publication on,
// so a claim gone does not hide a copy whose upload has not started yet.
type outputHold struct {
	// inUse, uploading and failing count copies: published, handed off, last attempt failed.
	inUse, uploading, failing int
	bytes                     int64
	// nodes are the nodes holding any; unknown the nodes that cannot tell (no StoragePool
	// reporting, the node gone, or more volumes with outputs than its StoragePool lists).
	nodes, unknown []string
}

func (h outputHold) held() bool { return h.inUse+h.uploading > 0 || len(h.unknown) > 0 }

func (h *outputHold) add(o outputHold) {
	h.inUse, h.uploading, h.failing, h.bytes = h.inUse+o.inUse, h.uploading+o.uploading, h.failing+o.failing, h.bytes+o.bytes
	for _, n := range o.nodes {
		if !slices.Contains(h.nodes, n) {
			h.nodes = append(h.nodes, n)
		}
	}
	for _, n := range o.unknown {
		if !slices.Contains(h.unknown, n) {
			h.unknown = append(h.unknown, n)
		}
	}
}

// hasOutputs says whether a PersistentVolume made for a VolumeManager writes back its copies.
func hasOutputs(pv *corev1.PersistentVolume) bool {
	return pv.Spec.CSI != nil && pv.Spec.CSI.VolumeAttributes[consts.ParamOutputTarget] != ""
}

// outputsOf reads what pv's nodes hold of its copies' outputs.
func outputsOf(pv *corev1.PersistentVolume, w *world) outputHold {
	var h outputHold
	if !hasOutputs(pv) {
		return h
	}
	for _, id := range NodesOf(pv) {
		n := w.byID[id]
		var inv *NodeInventory
		if n != nil {
			inv = w.inventories[n.Name]
		}
		if inv == nil {
			h.unknown = append(h.unknown, id)
			continue
		}
		o, listed := inv.Outputs[pv.Spec.CSI.VolumeHandle]
		if !listed {
			if inv.OutputsUnlisted {
				h.unknown = append(h.unknown, id)
			}
			continue
		}
		h.inUse, h.uploading, h.failing = h.inUse+int(o.InUse), h.uploading+int(o.Uploading), h.failing+int(o.Failing)
		h.bytes += o.BytesPending
		if o.InUse+o.Uploading > 0 {
			h.nodes = append(h.nodes, id)
		}
	}
	return h
}

// holdOutputs adds to keep the PersistentVolumes whose copies' outputs are still on their nodes:
// a volume is deleted only once they are at their targets. It returns what holds them all.
func holdOutputs(w *world, keep map[string]bool) outputHold {
	var all outputHold
	for i := range w.pvs {
		if h := outputsOf(&w.pvs[i], w); h.held() {
			keep[w.pvs[i].Name] = true
			all.add(h)
		}
	}
	return all
}

// writesBack says whether any volume of vm names an output target.
func writesBack(vm *datav1alpha1.VolumeManager) bool {
	return slices.ContainsFunc(vm.Spec.VolumeConfigs, func(vc datav1alpha1.VolumeConfig) bool { return vc.OutputTarget != "" })
}

// reason is the OutputsUploaded reason of a hold (Uploaded when nothing is held).
func (h outputHold) reason() string {
	switch {
	case h.failing > 0:
		return datav1alpha1.ReasonUploadFailing
	case h.uploading > 0:
		return datav1alpha1.ReasonUploading
	case h.inUse > 0:
		return datav1alpha1.ReasonOutputsInUse
	case len(h.unknown) > 0:
		return datav1alpha1.ReasonOutputsUnknown
	}
	return datav1alpha1.ReasonOutputsUploaded
}

// String says what holds the outputs, with counts.
func (h outputHold) String() string {
	var parts []string
	if h.inUse > 0 {
		parts = append(parts, fmt.Sprintf("%d copies in use", h.inUse))
	}
	if h.uploading > 0 {
		parts = append(parts, fmt.Sprintf("%d copies uploading (%s left)", h.uploading, units.HumanBytes(h.bytes)))
	}
	if h.failing > 0 {
		parts = append(parts, fmt.Sprintf("%d failing: the target refused the last attempt; retried with backoff, the data kept on the node (the pods' OutputUploadFailed events say why)", h.failing))
	}
	if len(h.nodes) > 0 {
		slices.Sort(h.nodes)
		parts = append(parts, "on "+strings.Join(h.nodes, ", "))
	}
	if len(h.unknown) > 0 {
		slices.Sort(h.unknown)
		parts = append(parts, "no report of its outputs from "+strings.Join(h.unknown, ", ")+" (its StoragePool missing or the node gone; delete the VolumeManager to stop waiting)")
	}
	if len(parts) == 0 {
		return "every output is at its target"
	}
	return "outputs not at their targets yet: " + strings.Join(parts, "; ")
}

// outputsCondition is OutputsUploaded for a hold.
func outputsCondition(generation int64, h outputHold) metav1.Condition {
	c := metav1.Condition{Type: datav1alpha1.ConditionOutputsUploaded, Status: metav1.ConditionFalse, Reason: h.reason(),
		Message: h.String(), ObservedGeneration: generation}
	if !h.held() {
		c.Status = metav1.ConditionTrue
	}
	return c
}
