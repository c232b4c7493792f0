// Package nodeevents records what dataset staging does to a node's disks as Events on its Node
// object, where `kubectl describe node` shows them: evictions from the dataset cache, writable
// dataset volumes copied because they could not be layered on it, streaming volumes staged
// because the node cannot stream, and objects of datasets that nothing could check.
package nodeevents

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/units"
)

// ReasonEvicted is the reason of an eviction's Event.
const ReasonEvicted = "DatasetEvicted"

// ReasonWritableCopied is the reason of the Event of a writable dataset volume that could not be
// layered on the cache and got a full copy instead.
const ReasonWritableCopied = "WritableDatasetCopied"

// Recorder records Events about one node.
type Recorder struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	node        *corev1.ObjectReference
}

// New records Events on the Node named node through client, as component.
func New(client kubernetes.Interface, node, component string) *Recorder {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return &Recorder{
		broadcaster: b,
		recorder:    b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component, Host: node}),
		// Node events carry the node's name as UID, as kubelet's do: kubectl describe node
		// finds them that way.
		node: &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node, UID: types.UID(node)},
	}
}

// Evicted records an eviction; it is the dataset manager's OnEvict.
func (r *Recorder) Evicted(e datasource.EvictEvent) {
	r.recorder.Eventf(r.node, corev1.EventTypeNormal, ReasonEvicted,
		"Evicted cached dataset %s (%s, last used %s) from pool %s: %s",
		e.Source, units.HumanBytes(e.Bytes), e.LastUsed.UTC().Format(time.RFC3339), e.Pool, e.Reason)
}

// WritableCopied records a writable volume of a dataset filled with a copy because it could not
// be layered on the cached tree; it is the volume service's WritableDatasets.OnCopy.
func (r *Recorder) WritableCopied(volumeID, dataset, reason string) {
	r.recorder.Eventf(r.node, corev1.EventTypeWarning, ReasonWritableCopied,
		"Volume %s of dataset %s was filled with a full copy, not layered on the cached dataset: %s", volumeID, dataset, reason)
}

// ReasonStreamingStaged is the reason of the Event of a streaming dataset volume staged instead.
const ReasonStreamingStaged = "StreamingVolumeStaged"

// StreamingStaged records a streaming volume served as a staged one because the node cannot
// stream (no FUSE); it is the volume service's StreamingVolumes.OnFallback.
func (r *Recorder) StreamingStaged(volumeID, dataset, reason string) {
	r.recorder.Eventf(r.node, corev1.EventTypeWarning, ReasonStreamingStaged,
		"Volume %s of dataset %s is staged, not streamed: %s", volumeID, dataset, reason)
}

// ReasonStreamingRefused is the reason of the Event of a streaming volume taken over after a
// restart of the plugin whose caller's access could not be proved again.
const ReasonStreamingRefused = "StreamingVolumeRefused"

// StreamingRefused records a streaming volume whose reads fail (EIO) after a takeover, and why;
// it is the volume service's StreamingVolumes.OnRefused.
func (r *Recorder) StreamingRefused(volumeID, dataset, reason string) {
	r.recorder.Eventf(r.node, corev1.EventTypeWarning, ReasonStreamingRefused,
		"Volume %s of dataset %s was taken over after a restart of the node plugin, but its caller's access could not be proved again: its reads fail with EIO until it is unstaged: %s", volumeID, dataset, reason)
}

// Stop flushes pending Events (as far as the broadcaster does) and stops recording.
func (r *Recorder) Stop() { r.broadcaster.Shutdown() }

// ReasonUnverifiable is the reason of the Event of an object nothing could check.
const ReasonUnverifiable = "UnverifiableObject"

// Unverifiable records an object of a dataset that nothing could check, refused or served
// unchecked; it is the dataset manager's OnUnverifiable.
func (r *Recorder) Unverifiable(e datasource.UnverifiableEvent) {
	action := "refused: its dataset is not served (--unverifiable-objects=serve serves such objects)"
	if e.Served {
		action = "served unchecked (--unverifiable-objects=serve)"
	}
	r.recorder.Eventf(r.node, corev1.EventTypeWarning, ReasonUnverifiable,
		"Object %q of dataset %s has nothing to check it by, %s: %s", e.Key, e.Dataset, action, e.Reason)
}
