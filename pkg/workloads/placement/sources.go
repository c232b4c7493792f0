package placement

import (
	"context"
	"slices"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/ids"
)

// Volumes restored from a snapshot or cloned from a claim. Cistern's snapshots and volumes are
// node-local: a new volume can only be made from one on the node that holds it, and the node the
// scheduler picks for a WaitForFirstConsumer claim is where its provisioner makes it. Another node
// answers ResourceExhausted and the claim goes back to the scheduler, a random retry per node;
// a required node affinity makes the first pick the right one.

// sourceNodes returns the nodes that hold the data source of a claim of the driver still to be
// provisioned: the node a Cistern snapshot's ID (or its content's managed-by label) names, or the
// nodes a Cistern PV's required node affinity allows. nil when the claim has no data source, its
// source is another driver's, a kind the webhook does not know, not found, or not yet bound.
func (w *Webhook) sourceNodes(ctx context.Context, ns string, spec *corev1.PersistentVolumeClaimSpec) ([]string, error) {
	group, kind, name := "", "", ""
	switch ref := spec.DataSourceRef; {
	case ref != nil:
		if ref.Namespace != nil && *ref.Namespace != "" && *ref.Namespace != ns {
			// A cross-namespace source (CrossNamespaceVolumeDataSource) needs a ReferenceGrant
			// the webhook does not check: reading it would tell the pod's author where another
			// namespace's data is. The ResourceExhausted retry still finds the node.
			return nil, nil
		}
		group, kind, name = deref(ref.APIGroup), ref.Kind, ref.Name
	case spec.DataSource != nil:
		group, kind, name = deref(spec.DataSource.APIGroup), spec.DataSource.Kind, spec.DataSource.Name
	default:
		return nil, nil
	}
	switch {
	case group == snapv1.GroupName && kind == "VolumeSnapshot":
		node, err := w.snapshotNode(ctx, ns, name)
		if node == "" || err != nil {
			return nil, err
		}
		return []string{node}, nil
	case group == "" && kind == "PersistentVolumeClaim":
		return w.claimNodes(ctx, ns, name)
	}
	return nil, nil
}

// snapshotNode returns the node that holds a VolumeSnapshot of the driver, "" when unknown.
func (w *Webhook) snapshotNode(ctx context.Context, ns, name string) (string, error) {
	var vs snapv1.VolumeSnapshot
	if err := w.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &vs); err != nil {
		return "", ignoreNotFound(err)
	}
	// Bound, or pre-provisioned and naming its content (the provisioner waits for either).
	var contentName string
	if vs.Status != nil {
		contentName = deref(vs.Status.BoundVolumeSnapshotContentName)
	}
	if contentName == "" {
		contentName = deref(vs.Spec.Source.VolumeSnapshotContentName)
	}
	if contentName == "" {
		return "", nil
	}
	var c snapv1.VolumeSnapshotContent
	if err := w.Reader.Get(ctx, types.NamespacedName{Name: contentName}, &c); err != nil {
		return "", ignoreNotFound(err)
	}
	// A content is the snapshot's only if it points back at it.
	if c.Spec.Driver != w.DriverName || c.Spec.VolumeSnapshotRef.Namespace != ns || c.Spec.VolumeSnapshotRef.Name != name {
		return "", nil
	}
	var handle string
	if c.Status != nil {
		handle = deref(c.Status.SnapshotHandle)
	}
	if handle == "" {
		handle = deref(c.Spec.Source.SnapshotHandle)
	}
	if node := ids.NodeOfSnapshotID(handle); node != "" {
		return node, nil
	}
	// An ID too long to name its node: the snapshot-controller labelled the content with the
	// node of the volume it was taken from.
	node := c.Labels[consts.LabelSnapshotManagedBy]
	klog.FromContext(ctx).V(4).Info("Snapshot handle names no node", "content", c.Name, "managedBy", node)
	return node, nil
}

// claimNodes returns the nodes that hold the bound claim a new claim is cloned from.
func (w *Webhook) claimNodes(ctx context.Context, ns, name string) ([]string, error) {
	var src corev1.PersistentVolumeClaim
	if err := w.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &src); err != nil {
		return nil, ignoreNotFound(err)
	}
	if src.Spec.VolumeName == "" {
		return nil, nil
	}
	var pv corev1.PersistentVolume
	if err := w.Reader.Get(ctx, types.NamespacedName{Name: src.Spec.VolumeName}, &pv); err != nil {
		return nil, ignoreNotFound(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != w.DriverName {
		return nil, nil
	}
	return NodesOf(pv.Spec.NodeAffinity), nil
}

// NodesOf returns, sorted, the nodes a PV's required node affinity allows by the driver's topology
// key: per term the intersection of its In expressions on the key, over the terms their union. nil
// when some term does not constrain the key (the volume is reachable elsewhere too) or there is no
// required affinity.
func NodesOf(a *corev1.VolumeNodeAffinity) []string {
	if a == nil || a.Required == nil || len(a.Required.NodeSelectorTerms) == 0 {
		return nil
	}
	var nodes []string
	for _, term := range a.Required.NodeSelectorTerms {
		var inTerm []string
		constrained := false
		for _, e := range term.MatchExpressions {
			if e.Key != consts.TopologyKey || e.Operator != corev1.NodeSelectorOpIn {
				continue
			}
			if !constrained {
				inTerm, constrained = slices.Clone(e.Values), true
				continue
			}
			inTerm = slices.DeleteFunc(inTerm, func(n string) bool { return !slices.Contains(e.Values, n) })
		}
		if !constrained {
			return nil
		}
		nodes = append(nodes, inTerm...)
	}
	slices.Sort(nodes)
	return slices.Compact(nodes)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
