// Package placement steers pods toward the nodes that already hold their data. The
// workload-controller's pod webhook (Webhook) finds the Cistern datasets a pod's claims name
// (of the administrator's classes and volumes: never an inline volume's or a VolumeManager's,
// whose sources a tenant names, so that the webhook tells no pod author where a guessed
// dataset is cached), looks up which nodes' StoragePools carry the dataset label (the node's
// cache holds it Ready), and appends a preferred node affinity term per dataset. It only ever
// prefers: a pod whose data is nowhere, or whose warm nodes are full or excluded, schedules as
// it would without Cistern. See docs/datasets.md ("Pods go where their data is").
package placement

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/params"
)

// Weight of each term the webhook adds. The scheduler's NodeAffinity score sums the weights of
// the preferred terms a node matches and scales the best node to 100, so a term that is the
// pod's only preference gives the warm nodes the full NodeAffinity score (x2 in the default
// profile: more than NodeResourcesFit and BalancedAllocation can give a cold node) whatever its
// weight. Next to the user's own preferred terms (weights 1-100) the smallest weight never
// outranks any of them and only breaks ties among the nodes they rank equal: the user's
// preferences say where the pod should run, ours only how fast it can start.
const Weight = 1

// MaxNodes bounds the nodes one term lists. A dataset warm on more nodes than this is common
// enough that the preference would add little and a large pod object; no term is added.
const MaxNodes = 256

// Want is what a pod's volume needs from a node: the dataset in the cache of a pool the volume
// can be placed in.
type Want struct {
	// DatasetID is params.Dataset.ID().
	DatasetID string
	// Pool and PoolSelector are the volume's pool constraints (empty: any pool).
	Pool         string
	PoolSelector labels.Selector
}

// WantOf is what a parsed volume needs; ok is false for a volume without a dataset.
func WantOf(v params.Volume) (Want, bool) {
	if v.Dataset == nil {
		return Want{}, false
	}
	return Want{DatasetID: v.Dataset.ID(), Pool: v.Pool, PoolSelector: v.PoolSelector}, true
}

// LabelSelector selects the StoragePools whose node cache holds the dataset Ready.
func (w Want) LabelSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{consts.LabelDatasetPrefix + w.DatasetID: "true"})
}

// Nodes returns, sorted, the nodes of the pools (from a list selected by LabelSelector) that the
// volume can use: a node-local pool the volume's pool or selector targets, not reported
// unhealthy.
func (w Want) Nodes(pools []spapi.StoragePool) []string {
	var nodes []string
	for i := range pools {
		p := &pools[i]
		if p.Labels[consts.LabelDatasetPrefix+w.DatasetID] != "true" || p.Labels[consts.LabelShared] == "true" {
			continue
		}
		if w.Pool != "" && p.Spec.Parameters[consts.ParamPool] != w.Pool {
			continue
		}
		if w.PoolSelector != nil && !w.PoolSelector.Matches(labels.Set(p.Labels)) {
			continue
		}
		if c := meta.FindStatusCondition(p.Status.Conditions, spapi.ConditionHealthy); c != nil && c.Status == "False" {
			continue
		}
		for _, n := range p.Status.AccessibleNodes {
			if !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		}
	}
	slices.Sort(nodes)
	return nodes
}

// Term is the preferred scheduling term for nodes: those whose driver reports them under the
// topology key, the same key the volumes' PersistentVolumes are pinned by.
func Term(nodes []string) corev1.PreferredSchedulingTerm {
	return corev1.PreferredSchedulingTerm{
		Weight: Weight,
		Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
			Key: consts.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: nodes,
		}}},
	}
}

// Prefer appends a term for each node set to the pod's preferred node affinity, after the
// user's own terms; it never touches required affinity. A term the pod already has (the webhook
// ran before) is not added again. It reports whether the pod changed.
func Prefer(pod *corev1.Pod, nodeSets [][]string) bool {
	changed := false
	for _, nodes := range nodeSets {
		if len(nodes) == 0 || len(nodes) > MaxNodes {
			continue
		}
		term := Term(nodes)
		a := pod.Spec.Affinity
		if a != nil && a.NodeAffinity != nil && slices.ContainsFunc(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution,
			func(t corev1.PreferredSchedulingTerm) bool { return equality.Semantic.DeepEqual(t, term) }) {
			continue
		}
		if pod.Spec.Affinity == nil {
			pod.Spec.Affinity = &corev1.Affinity{}
		}
		if pod.Spec.Affinity.NodeAffinity == nil {
			pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
		}
		na := pod.Spec.Affinity.NodeAffinity
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution, term)
		changed = true
	}
	return changed
}

// Common returns, sorted, the nodes in every set: where a pod whose new volumes come from sources
// on those nodes can run.
func Common(nodeSets [][]string) []string {
	if len(nodeSets) == 0 {
		return nil
	}
	common := slices.Clone(nodeSets[0])
	for _, set := range nodeSets[1:] {
		common = slices.DeleteFunc(common, func(n string) bool { return !slices.Contains(set, n) })
	}
	slices.Sort(common)
	return slices.Compact(common)
}

// Requirement is the required node selector requirement for nodes: those the driver reports under
// the topology key.
func Requirement(nodes []string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: consts.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: nodes}
}

// Require confines the pod to nodes: the requirement is ANDed into every term of the pod's
// required node affinity (the terms are ORed, so each must carry it), or is a term of its own when
// the pod has none. An empty term, which matches no node, stays empty. A term that already has the
// requirement (the webhook ran before) is not changed. It reports whether the pod changed; nodes
// empty or above MaxNodes change nothing.
func Require(pod *corev1.Pod, nodes []string) bool {
	if len(nodes) == 0 || len(nodes) > MaxNodes {
		return false
	}
	req := Requirement(nodes)
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := pod.Spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req}}}}
		return true
	}
	changed := false
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		t := &terms[i]
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			continue
		}
		if slices.ContainsFunc(t.MatchExpressions, func(r corev1.NodeSelectorRequirement) bool { return equality.Semantic.DeepEqual(r, req) }) {
			continue
		}
		t.MatchExpressions = append(t.MatchExpressions, req)
		changed = true
	}
	return changed
}
