package lws

import (
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// IsLeader says whether a LeaderWorkerSet pod is a group leader.
func IsLeader(pod *corev1.Pod) bool {
	return pod.Labels[v1alpha1.WorkerIndexLabelKey] == "0"
}

// DefaultPod completes a LeaderWorkerSet pod at creation: the labels only known once the
// StatefulSet controller has named the pod (group-index, group-key, worker-index), the subdomain of
// a UniquePerReplica leader, the LWS_* environment variables, and the schedulingPolicy's node
// selector and toleration. Pods without the name label are left alone.
func DefaultPod(pod *corev1.Pod) error {
	lwsName, ok := pod.Labels[v1alpha1.SetNameLabelKey]
	if !ok {
		return nil
	}
	size, ok := pod.Annotations[v1alpha1.SizeAnnotationKey]
	if !ok {
		return fmt.Errorf("pod %s: annotation %s is missing", pod.Name, v1alpha1.SizeAnnotationKey)
	}
	groupSize, err := strconv.Atoi(size)
	if err != nil {
		return fmt.Errorf("pod %s: annotation %s=%q is not a number", pod.Name, v1alpha1.SizeAnnotationKey, size)
	}

	var leaderName string
	var worker int
	if IsLeader(pod) {
		leaderName = pod.Name
		if _, ok := pod.Labels[v1alpha1.GroupIndexLabelKey]; !ok {
			_, group := ParentNameAndOrdinal(pod.Name)
			if group < 0 {
				return fmt.Errorf("pod %s: name has no ordinal", pod.Name)
			}
			pod.Labels[v1alpha1.GroupIndexLabelKey] = strconv.Itoa(group)
		}
		if pod.Annotations[v1alpha1.SubdomainPolicyAnnotationKey] == string(v1alpha1.SubdomainUniquePerReplica) {
			pod.Spec.Subdomain = pod.Name
		}
		if _, ok := pod.Labels[v1alpha1.GroupUniqueHashLabelKey]; !ok {
			pod.Labels[v1alpha1.GroupUniqueHashLabelKey] = GroupKey(pod.Namespace, pod.Name)
		}
		// Exclusive placement: the leader takes a topology domain no other group uses; its
		// workers follow it there by node selector (WorkerStatefulSet).
		if key := pod.Annotations[v1alpha1.ExclusiveKeyAnnotationKey]; key != "" {
			setExclusiveAffinity(pod, key, v1alpha1.GroupUniqueHashLabelKey, pod.Labels[v1alpha1.GroupUniqueHashLabelKey])
		}
	} else {
		leaderName = pod.Annotations[v1alpha1.LeaderPodNameAnnotationKey]
		_, worker = ParentNameAndOrdinal(pod.Name)
		if worker < 0 {
			return fmt.Errorf("pod %s: name has no ordinal", pod.Name)
		}
		pod.Labels[v1alpha1.WorkerIndexLabelKey] = strconv.Itoa(worker)
	}
	if err := setSubGroup(pod, leaderName, groupSize, worker); err != nil {
		return err
	}

	group, ok := pod.Labels[v1alpha1.GroupIndexLabelKey]
	if !ok {
		return fmt.Errorf("pod %s: label %s is missing", pod.Name, v1alpha1.GroupIndexLabelKey)
	}
	env := []corev1.EnvVar{
		{Name: v1alpha1.LwsLeaderAddress, Value: fmt.Sprintf("%s-%s.%s.%s", lwsName, group, pod.Spec.Subdomain, pod.Namespace)},
		{Name: v1alpha1.LwsGroupSize, Value: size},
		{Name: v1alpha1.LwsWorkerIndex, Value: pod.Labels[v1alpha1.WorkerIndexLabelKey]},
	}
	for i := range pod.Spec.InitContainers {
		addEnv(&pod.Spec.InitContainers[i], env)
	}
	for i := range pod.Spec.Containers {
		addEnv(&pod.Spec.Containers[i], env)
	}
	return applySchedulingPolicy(pod, leaderName)
}

// setSubGroup labels a pod of a LeaderWorkerSet with a subGroupPolicy with its subgroup-index and
// subgroup-key, as upstream does: the leader is in subgroup 0 (none under LeaderExcluded); when
// size-1 is divisible by subGroupSize and size is not, the leader is the extra pod of subgroup 0
// and worker w is in (w-1)/subGroupSize, otherwise in w/subGroupSize. The subgroup key is
// SHA-1("<leader>/<subgroup>"). Under subgroup-exclusive-topology each subgroup gets a topology
// domain of its own.
func setSubGroup(pod *corev1.Pod, leaderName string, size, worker int) error {
	sgs, ok := pod.Annotations[v1alpha1.SubGroupSizeAnnotationKey]
	if !ok || pod.Labels[v1alpha1.SubGroupIndexLabelKey] != "" {
		return nil
	}
	subGroupSize, err := strconv.Atoi(sgs)
	if err != nil || subGroupSize < 1 {
		return fmt.Errorf("pod %s: annotation %s=%q is not a positive number", pod.Name, v1alpha1.SubGroupSizeAnnotationKey, sgs)
	}
	var index int
	if IsLeader(pod) {
		if pod.Annotations[v1alpha1.SubGroupPolicyTypeAnnotationKey] == string(v1alpha1.SubGroupPolicyTypeLeaderExcluded) {
			return nil
		}
	} else {
		index = SubGroupIndex(size, subGroupSize, worker)
	}
	if leaderName == "" {
		return fmt.Errorf("pod %s: annotation %s is missing", pod.Name, v1alpha1.LeaderPodNameAnnotationKey)
	}
	key := GroupKey(leaderName, strconv.Itoa(index))
	pod.Labels[v1alpha1.SubGroupIndexLabelKey] = strconv.Itoa(index)
	pod.Labels[v1alpha1.SubGroupUniqueHashLabelKey] = key
	if topo := pod.Annotations[v1alpha1.SubGroupExclusiveKeyAnnotationKey]; topo != "" {
		setExclusiveAffinity(pod, topo, v1alpha1.SubGroupUniqueHashLabelKey, key)
	}
	return nil
}

// SubGroupIndex is the subgroup of worker w in a group of size pods split by subGroupSize.
func SubGroupIndex(size, subGroupSize, w int) int {
	if (size-1)%subGroupSize == 0 && size%subGroupSize != 0 {
		return (w - 1) / subGroupSize
	}
	return w / subGroupSize
}

// setExclusiveAffinity gives the pod's group (or subgroup) a topology domain of its own: required
// pod affinity to pods with the same labelKey=value, and required anti-affinity to pods with any
// other value of labelKey, on topologyKey. Terms already there for this key are not added again.
func setExclusiveAffinity(pod *corev1.Pod, topologyKey, labelKey, value string) {
	a := pod.Spec.Affinity
	if a == nil {
		a = &corev1.Affinity{}
		pod.Spec.Affinity = a
	}
	if a.PodAffinity == nil {
		a.PodAffinity = &corev1.PodAffinity{}
	}
	if a.PodAntiAffinity == nil {
		a.PodAntiAffinity = &corev1.PodAntiAffinity{}
	}
	onKey := func(t corev1.PodAffinityTerm) bool { return t.TopologyKey == topologyKey }
	if slices.ContainsFunc(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution, onKey) &&
		slices.ContainsFunc(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution, onKey) {
		return
	}
	a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution,
		corev1.PodAffinityTerm{
			LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: labelKey, Operator: metav1.LabelSelectorOpIn, Values: []string{value}},
			}},
			TopologyKey: topologyKey,
		})
	a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution,
		corev1.PodAffinityTerm{
			LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: labelKey, Operator: metav1.LabelSelectorOpExists},
				{Key: labelKey, Operator: metav1.LabelSelectorOpNotIn, Values: []string{value}},
			}},
			TopologyKey: topologyKey,
		})
}

// addEnv puts the LWS variables first, in upstream's order, so that user variables can refer to
// them with $(VAR), and drops a user variable of the same name: frameworks such as vLLM form the
// group from these values, so a stale LWS_GROUP_SIZE in a template must not win.
func addEnv(c *corev1.Container, env []corev1.EnvVar) {
	out := make([]corev1.EnvVar, 0, len(env)+len(c.Env))
	out = append(out, env...)
	for _, e := range c.Env {
		if !slices.ContainsFunc(env, func(l corev1.EnvVar) bool { return l.Name == e.Name }) {
			out = append(out, e)
		}
	}
	c.Env = out
}

// applySchedulingPolicy pins the pod to the nodes of its group: nodeSelector[<key>] = leader name
// and a toleration {key, Equal, leader name, effect}.
func applySchedulingPolicy(pod *corev1.Pod, leaderName string) error {
	selKey := pod.Annotations[v1alpha1.ReplicaUniqueNodeSelectorAnnotationKey]
	tolKey := pod.Annotations[v1alpha1.ReplicaUniqueTolerationKeyAnnotationKey]
	if selKey == "" && tolKey == "" {
		return nil
	}
	if leaderName == "" {
		return fmt.Errorf("pod %s: annotation %s is missing", pod.Name, v1alpha1.LeaderPodNameAnnotationKey)
	}
	if selKey != "" {
		if pod.Spec.NodeSelector == nil {
			pod.Spec.NodeSelector = map[string]string{}
		}
		pod.Spec.NodeSelector[selKey] = leaderName
	}
	if tolKey != "" {
		effect := corev1.TaintEffect(pod.Annotations[v1alpha1.ReplicaUniqueTolerationEffectAnnotationKey])
		switch effect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			return fmt.Errorf("pod %s: annotation %s=%q is not NoSchedule, PreferNoSchedule or NoExecute",
				pod.Name, v1alpha1.ReplicaUniqueTolerationEffectAnnotationKey, effect)
		}
		tol := corev1.Toleration{Key: tolKey, Operator: corev1.TolerationOpEqual, Value: leaderName, Effect: effect}
		for _, t := range pod.Spec.Tolerations {
			if t == tol {
				return nil
			}
		}
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, tol)
	}
	return nil
}
