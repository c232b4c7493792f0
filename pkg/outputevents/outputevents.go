// Package outputevents records the Events of a volume on its pod or claim, where `kubectl
// describe pod` or `kubectl describe pvc` shows them: the write-back's (pkg/volume,
// writeback_events.go: uploads started, failed and retried, finished, output targets refused)
// and the progress of the staging the volume waits for (staging_events.go: DatasetStaging,
// DatasetStaged).
package outputevents

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/volume"
)

// Recorder records the Events of one node's volumes on their pods and claims.
type Recorder struct {
	client      kubernetes.Interface
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
}

// New records Events through client, as component on node.
func New(client kubernetes.Interface, node, component string) *Recorder {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return &Recorder{
		client:      client,
		broadcaster: b,
		recorder:    b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component, Host: node}),
	}
}

// Record records e; it is the volume service's WriteBack.OnEvent and StagingEvents.OnEvent. A claim is named by its UID,
// which kubectl describe looks Events up by: read from the API server (a claim deleted while its
// outputs upload gets its Event by name only).
func (r *Recorder) Record(e volume.Event) {
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: e.Object.Kind, Namespace: e.Object.Namespace,
		Name: e.Object.Name, UID: types.UID(e.Object.UID)}
	if ref.Kind == "PersistentVolumeClaim" && ref.UID == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		pvc, err := r.client.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		cancel()
		if err == nil {
			ref.UID = pvc.UID
		} else {
			klog.Background().V(4).Info("Event on a claim not found by UID", "claim", klog.KRef(ref.Namespace, ref.Name), "err", err.Error())
		}
	}
	typ := corev1.EventTypeNormal
	if e.Warning {
		typ = corev1.EventTypeWarning
	}
	r.recorder.Event(ref, typ, e.Reason, e.Message)
}

// Stop flushes pending Events (as far as the broadcaster does) and stops recording.
func (r *Recorder) Stop() { r.broadcaster.Shutdown() }
