package volumemanager

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	v1helper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
)

// EligibleNode says whether a node may hold a volume's data: the driver runs there (the node
// carries the driver's topology label), it is not being drained (unschedulable), it is no
// control-plane node unless allowControlPlane (Config.AllowControlPlane), it matches the volume's
// nodeAffinity, and the volume tolerates its NoSchedule/NoExecute taints.
func EligibleNode(vc *datav1alpha1.VolumeConfig, node *corev1.Node, allowControlPlane bool) bool {
	if node.DeletionTimestamp != nil || node.Spec.Unschedulable || node.Labels[consts.TopologyKey] == "" {
		return false
	}
	if !allowControlPlane && ControlPlaneNode(node) {
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

// controlPlaneKeys are the label and taint keys kubeadm and most installers put on control-plane
// nodes.
var controlPlaneKeys = []string{"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"}

// ControlPlaneNode says whether node is a control-plane node: labelled or tainted with a
// control-plane role key. A namespace user's tolerations do not make it eligible.
func ControlPlaneNode(node *corev1.Node) bool {
	for _, k := range controlPlaneKeys {
		if _, ok := node.Labels[k]; ok {
			return true
		}
		if slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == k }) {
			return true
		}
	}
	return false
}

// NodeInventory is what one node's StoragePools say: the free space of its best node-local pool
// and its cached datasets.
type NodeInventory struct {
	// Free is the most bytes a new volume can take in one of the node's pools (the pool's
	// maximumVolumeSize, else its available space); -1 when no pool reports capacity.
	Free int64
	// Ready holds the IDs of datasets Ready in one of the node's pools (the pools' labels, which
	// cover datasets beyond the status' bounded list).
	Ready map[string]bool
	// Datasets are the listed datasets by ID, the most advanced state over the node's pools.
	Datasets map[string]spapi.CachedDataset
	// Outputs are the volumes whose outputs the node holds, not at their targets yet, by volume
	// (summed over the node's pools); OutputsUnlisted is true when a pool lists only some.
	Outputs         map[string]spapi.VolumeOutputs
	OutputsUnlisted bool
}

// Inventories reads node-local StoragePools into one NodeInventory per Kubernetes node name (a
// shared pool's cache is no node's). Only pools of driver count.
func Inventories(pools []spapi.StoragePool, driver string) map[string]*NodeInventory {
	out := map[string]*NodeInventory{}
	for i := range pools {
		p := &pools[i]
		if p.Spec.Driver != driver || p.Labels[consts.LabelShared] == "true" || len(p.Status.AccessibleNodes) != 1 {
			continue
		}
		name := p.Status.AccessibleNodes[0]
		inv := out[name]
		if inv == nil {
			inv = &NodeInventory{Free: -1, Ready: map[string]bool{}, Datasets: map[string]spapi.CachedDataset{},
				Outputs: map[string]spapi.VolumeOutputs{}}
			out[name] = inv
		}
		if c := p.Status.Capacity; c != nil {
			free := c.MaximumVolumeSize
			if free == nil {
				free = c.Available
			}
			if free != nil && free.Value() > inv.Free {
				inv.Free = free.Value()
			}
		}
		for k, v := range p.Labels {
			if id, ok := strings.CutPrefix(k, consts.LabelDatasetPrefix); ok && id != "" && v == "true" {
				inv.Ready[id] = true
			}
		}
		if p.Status.Cache == nil {
			continue
		}
		for _, d := range p.Status.Cache.Datasets {
			if old, ok := inv.Datasets[d.ID]; !ok || stateRank(d.State) > stateRank(old.State) {
				inv.Datasets[d.ID] = d
			}
			if d.State == spapi.DatasetReady {
				inv.Ready[d.ID] = true
			}
		}
		c := p.Status.Cache
		inv.OutputsUnlisted = inv.OutputsUnlisted || int(c.OutputsTotal) > len(c.Outputs)
		for _, o := range c.Outputs {
			sum := inv.Outputs[o.Volume]
			sum.Volume = o.Volume
			sum.InUse += o.InUse
			sum.Uploading += o.Uploading
			sum.Failing += o.Failing
			sum.BytesPending += o.BytesPending
			inv.Outputs[o.Volume] = sum
		}
	}
	return out
}

// stateRank orders a dataset's states in a node's pools: the most advanced one tells.
func stateRank(s spapi.DatasetState) int {
	return map[spapi.DatasetState]int{spapi.DatasetFailed: 1, spapi.DatasetIncomplete: 2, spapi.DatasetStaging: 3, spapi.DatasetReady: 4}[s]
}

// Placement is what SelectNodes weighs: the nodes, their inventories (by node name), the dataset
// and the room each node must have for it.
type Placement struct {
	Nodes       []corev1.Node
	Inventories map[string]*NodeInventory
	DatasetID   string
	Capacity    int64
	// AllowControlPlane is Config.AllowControlPlane.
	AllowControlPlane bool
	// Spread orders the nodes that can hold the volume: the VolumeManager's UID and the volume's
	// ID (SpreadKey), so each volume has its own order of the nodes.
	Spread string
}

// SpreadKey is a volume's Placement.Spread.
func SpreadKey(vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig) string {
	return string(vm.UID) + "/" + vc.ID
}

// SelectNodes picks replicas eligible nodes, by the driver's node id (topology value). Nodes
// already chosen stay while they are eligible, so data is not moved without need. A node whose
// pools report less room than the capacity is never taken, and a node with no StoragePool yet is
// taken last. The others are taken in an order of their own for each volume (rendezvous hashing
// of p.Spread and the node's name), not by the room they report: a node writes its own
// StoragePools, so a compromised one could report any free space, and if the most room went
// first it would be chosen by every new volume and get every VolumeManager's Secrets through its
// kubelet. Hashing spreads volumes evenly over the nodes with room, stays the same from one
// reconcile to the next, and is a number no node can raise. Whether a node's cache already holds
// the dataset plays no part either: the VolumeManager's namespace has not proved it may read that
// copy (its stager pods do that, on the nodes chosen), and a choice that followed the caches
// would tell a namespace user where a guessed bucket and prefix are cached. It returns fewer than
// replicas when not enough nodes qualify.
func SelectNodes(vc *datav1alpha1.VolumeConfig, p Placement, current []string) []string {
	type candidate struct {
		id     string
		noPool bool
		rank   uint64
	}
	eligible := map[string]bool{}
	var cands []candidate
	for i := range p.Nodes {
		n := &p.Nodes[i]
		if !EligibleNode(vc, n, p.AllowControlPlane) {
			continue
		}
		id := n.Labels[consts.TopologyKey]
		eligible[id] = true
		c := candidate{id: id, noPool: true, rank: spreadRank(p.Spread, n.Name)}
		if inv := p.Inventories[n.Name]; inv != nil && inv.Free >= 0 {
			if inv.Free < p.Capacity {
				continue // no room, now
			}
			c.noPool = false
		}
		cands = append(cands, c)
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		if a.noPool != b.noPool {
			if a.noPool {
				return 1
			}
			return -1
		}
		if c := cmp.Compare(a.rank, b.rank); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	var out []string
	for _, id := range current {
		if eligible[id] && len(out) < int(vc.Replicas) && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	for _, c := range cands {
		if len(out) >= int(vc.Replicas) {
			break
		}
		if !slices.Contains(out, c.id) {
			out = append(out, c.id)
		}
	}
	slices.Sort(out)
	return out
}

// spreadRank is node's place in the order of key: the first 8 bytes of SHA-256(key, node), by the
// Kubernetes node name, which a node cannot change (the topology value is the node's to set).
func spreadRank(key, node string) uint64 {
	h := sha256.Sum256([]byte(key + "\x00" + node))
	return binary.BigEndian.Uint64(h[:8])
}
