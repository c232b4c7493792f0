// Package snapshotnode hands pre-provisioned VolumeSnapshotContents of the driver to the node that
// holds their snapshot. Cistern snapshots are node-local, so its csi-snapshotter runs in each node
// pod in node-deployment mode and takes only the contents labelled
// snapshot.storage.kubernetes.io/managed-by=<its node>. The snapshot-controller sets that label on
// the contents it creates for a VolumeSnapshot of a volume, but a content made by hand for an
// existing snapshot (spec.source.snapshotHandle) has none, and no sidecar would ever make it
// ready. The Reconciler labels such a content with the node its snapshot ID names
// (ids.NodeOfSnapshotID), or, when the ID names none, records a Warning Event saying what to
// do. See docs/driver.md, "Snapshots in Kubernetes".
package snapshotnode

import (
	"context"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/ids"
)

// The permissions (get, list, watch and patch volumesnapshotcontents) are not kubebuilder markers:
// they come with the VolumeSnapshot CRDs, in the deploy/csi/snapshots component, so that the base
// role grants nothing on an API a cluster without snapshots does not have.

// ReasonNoNode is the reason of the Warning Event on a content whose snapshot handle names no node.
const ReasonNoNode = "SnapshotNodeUnknown"

// Reconciler labels the driver's hand-made VolumeSnapshotContents with their snapshot's node.
type Reconciler struct {
	// Client reads through the cache of CacheByObject and patches.
	Client client.Client
	// Recorder records the Warning Events; nil records none.
	Recorder events.EventRecorder
	// DriverName is the driver whose contents are labelled.
	DriverName string
}

// NodeFor says what a content needs: handled is false for a content left alone (another
// driver's, one already labelled, or one the snapshot-controller makes for a VolumeSnapshot of a
// volume and labels itself); for the others node is the node its snapshot handle names, "" when
// it names none. That node is the driver's node ID, which deploy/csi sets to the Node's name, as
// it sets the sidecar's NODE_NAME: so it is the label's value.
func NodeFor(c *snapv1.VolumeSnapshotContent, driverName string) (node string, handled bool) {
	if c.Spec.Driver != driverName || c.Spec.Source.SnapshotHandle == nil {
		return "", false
	}
	if _, ok := c.Labels[consts.LabelSnapshotManagedBy]; ok {
		return "", false
	}
	return ids.NodeOfSnapshotID(*c.Spec.Source.SnapshotHandle), true
}

// CacheByObject keeps only unlabelled contents in the cache: every content the snapshot-controller
// makes is labelled at creation, so the cache holds the few made by hand (and other drivers'
// contents in clusters that do not snapshot per node), and a content drops out once labelled.
func CacheByObject() map[client.Object]cache.ByObject {
	unlabelled, err := labels.NewRequirement(consts.LabelSnapshotManagedBy, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // a constant, valid key
	}
	return map[client.Object]cache.ByObject{
		&snapv1.VolumeSnapshotContent{}: {Label: labels.NewSelector().Add(*unlabelled)},
	}
}

// Reconcile labels one content.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var c snapv1.VolumeSnapshotContent
	if err := r.Client.Get(ctx, req.NamespacedName, &c); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err) // gone, or labelled and out of the cache
	}
	node, handled := NodeFor(&c, r.DriverName)
	if !handled {
		return reconcile.Result{}, nil
	}
	logger := klog.FromContext(ctx).WithValues("content", c.Name, "snapshotHandle", *c.Spec.Source.SnapshotHandle)
	if node == "" {
		logger.V(2).Info("Snapshot handle names no node; no csi-snapshotter will take the content")
		if r.Recorder != nil {
			r.Recorder.Eventf(&c, nil, corev1.EventTypeWarning, ReasonNoNode, "Label",
				"snapshot handle %q names no node, so no node's csi-snapshotter will take this content: "+
					"label it %s=<node that holds the snapshot>", *c.Spec.Source.SnapshotHandle, consts.LabelSnapshotManagedBy)
		}
		return reconcile.Result{}, nil
	}
	// The optimistic lock keeps a label someone set meanwhile: the conflict requeues, and the next
	// pass sees the label and leaves the content.
	patch := client.MergeFromWithOptions(c.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	c.Labels[consts.LabelSnapshotManagedBy] = node
	if err := r.Client.Patch(ctx, &c, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	logger.V(2).Info("Handed the snapshot content to its node's csi-snapshotter", "node", node)
	return reconcile.Result{}, nil
}

// SetupWithManager watches the contents NodeFor handles. The manager's cache must use
// CacheByObject.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("snapshotnode").
		For(&snapv1.VolumeSnapshotContent{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			c, ok := o.(*snapv1.VolumeSnapshotContent)
			if !ok {
				return false
			}
			_, handled := NodeFor(c, r.DriverName)
			return handled
		}))).
		Complete(r)
}
