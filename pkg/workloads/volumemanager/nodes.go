package volumemanager

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	v1helper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
)

// EligibleNode says whether a node may hold a volume's data: the driver runs there (the node
// carries the driver's topology label), it matches the volume's nodeAffinity, and the volume
// tolerates its NoSchedule/NoExecute taints.
func EligibleNode(vc *datav1alpha1.VolumeConfig, node *corev1.Node) bool {
	if node.DeletionTimestamp != nil || node.Labels[consts.TopologyKey] == "" {
		return false
	}
	if vc.NodeAffinity != nil && vc.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		ok, err := nodeaffinity.NewLazyErrorNodeSelector(vc.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution).Match(node)
		if err != nil || !ok {
			return false
		}
	}
	_, untolerated := v1helper.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, vc.Tolerations, func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}, false)
	return !untolerated
}

// SelectNodes picks replicas eligible nodes, by the driver's node id (topology value), keeping the
// ones already chosen while they stay eligible so data is not moved without need. It returns fewer
// than replicas when not enough nodes qualify.
func SelectNodes(vc *datav1alpha1.VolumeConfig, nodes []corev1.Node, current []string) []string {
	eligible := map[string]bool{}
	var ids []string
	for i := range nodes {
		if EligibleNode(vc, &nodes[i]) {
			id := nodes[i].Labels[consts.TopologyKey]
			eligible[id] = true
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var out []string
	for _, id := range current {
		if eligible[id] && len(out) < int(vc.Replicas) && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	for _, id := range ids {
		if len(out) >= int(vc.Replicas) {
			break
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}
