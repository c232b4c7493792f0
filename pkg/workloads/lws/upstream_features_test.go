package lws

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// Upstream LeaderWorkerSet features: subGroupPolicy, exclusive placement, rollout partition.

var lwsKind = v1alpha1.GroupVersion.WithKind("LeaderWorkerSet")

func TestSubGroupIndex(t *testing.T) {
	for _, tc := range []struct {
		name               string
		size, subGroupSize int
		want               []int // subgroup of workers 1..size-1
	}{
		{"size divisible: leader with worker 1", 4, 2, []int{0, 1, 1}},
		{"size-1 divisible: leader is the extra pod of subgroup 0", 5, 2, []int{0, 0, 1, 1}},
		{"both divisible by 1", 3, 1, []int{1, 2}},
		{"size-1 divisible by 4", 9, 4, []int{0, 0, 0, 0, 1, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			for w := 1; w < tc.size; w++ {
				got = append(got, SubGroupIndex(tc.size, tc.subGroupSize, w))
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("subgroups (-want +got):\n%s", d)
			}
		})
	}
}

func TestDefaultPodSubGroupsAndExclusivePlacement(t *testing.T) {
	pod := func(name string, leader bool, ann map[string]string) *corev1.Pod {
		labels := map[string]string{v1alpha1.SetNameLabelKey: "lws"}
		a := map[string]string{v1alpha1.SizeAnnotationKey: "5"}
		if leader {
			labels[v1alpha1.WorkerIndexLabelKey] = "0"
		} else {
			labels[v1alpha1.GroupIndexLabelKey] = "1"
			a[v1alpha1.LeaderPodNameAnnotationKey] = "lws-1"
		}
		for k, v := range ann {
			a[k] = v
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: labels, Annotations: a},
			Spec: corev1.PodSpec{Subdomain: "lws"}}
	}
	exclusive := func(topology, labelKey, value string) *corev1.Affinity {
		return &corev1.Affinity{
			PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: labelKey, Operator: metav1.LabelSelectorOpIn, Values: []string{value}}}},
				TopologyKey: topology}}},
			PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: labelKey, Operator: metav1.LabelSelectorOpExists},
					{Key: labelKey, Operator: metav1.LabelSelectorOpNotIn, Values: []string{value}}}},
				TopologyKey: topology}}},
		}
	}
	sub := map[string]string{v1alpha1.SubGroupSizeAnnotationKey: "2", v1alpha1.SubGroupPolicyTypeAnnotationKey: "LeaderWorker"}
	excluded := map[string]string{v1alpha1.SubGroupSizeAnnotationKey: "2", v1alpha1.SubGroupPolicyTypeAnnotationKey: "LeaderExcluded"}
	for _, tc := range []struct {
		name         string
		pod          *corev1.Pod
		wantLabels   map[string]string // subgroup labels; nil: none
		wantAffinity *corev1.Affinity
	}{
		{name: "leader in subgroup 0", pod: pod("lws-1", true, sub),
			wantLabels: map[string]string{v1alpha1.SubGroupIndexLabelKey: "0", v1alpha1.SubGroupUniqueHashLabelKey: GroupKey("lws-1", "0")}},
		{name: "leader excluded from subgroups", pod: pod("lws-1", true, excluded)},
		{name: "worker 3 of size 5 by 2 in subgroup 1", pod: pod("lws-1-3", false, sub),
			wantLabels: map[string]string{v1alpha1.SubGroupIndexLabelKey: "1", v1alpha1.SubGroupUniqueHashLabelKey: GroupKey("lws-1", "1")}},
		{name: "worker 2 under LeaderExcluded in subgroup 0", pod: pod("lws-1-2", false, excluded),
			wantLabels: map[string]string{v1alpha1.SubGroupIndexLabelKey: "0", v1alpha1.SubGroupUniqueHashLabelKey: GroupKey("lws-1", "0")}},
		{name: "exclusive topology: leader gets affinity and anti-affinity on its group key",
			pod:          pod("lws-1", true, map[string]string{v1alpha1.ExclusiveKeyAnnotationKey: "zone"}),
			wantAffinity: exclusive("zone", v1alpha1.GroupUniqueHashLabelKey, GroupKey("ns", "lws-1"))},
		{name: "exclusive topology: a worker follows by node selector, gets no affinity",
			pod: pod("lws-1-1", false, map[string]string{v1alpha1.ExclusiveKeyAnnotationKey: "zone"})},
		{name: "subgroup exclusive topology on a worker",
			pod: pod("lws-1-4", false, map[string]string{v1alpha1.SubGroupSizeAnnotationKey: "2",
				v1alpha1.SubGroupPolicyTypeAnnotationKey: "LeaderWorker", v1alpha1.SubGroupExclusiveKeyAnnotationKey: "rack"}),
			wantLabels:   map[string]string{v1alpha1.SubGroupIndexLabelKey: "1", v1alpha1.SubGroupUniqueHashLabelKey: GroupKey("lws-1", "1")},
			wantAffinity: exclusive("rack", v1alpha1.SubGroupUniqueHashLabelKey, GroupKey("lws-1", "1"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := DefaultPod(tc.pod); err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, k := range []string{v1alpha1.SubGroupIndexLabelKey, v1alpha1.SubGroupUniqueHashLabelKey} {
				if v, ok := tc.pod.Labels[k]; ok {
					got[k] = v
				}
			}
			if tc.wantLabels == nil {
				tc.wantLabels = map[string]string{}
			}
			if d := cmp.Diff(tc.wantLabels, got); d != "" {
				t.Errorf("subgroup labels (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantAffinity, tc.pod.Spec.Affinity); d != "" {
				t.Errorf("affinity (-want +got):\n%s", d)
			}
			// Defaulting twice (a webhook retried) adds nothing.
			again := tc.pod.DeepCopy()
			if err := DefaultPod(again); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.pod.Spec.Affinity, again.Spec.Affinity); d != "" {
				t.Errorf("second defaulting changed the affinity:\n%s", d)
			}
		})
	}
}

func TestStatefulSetsCarryUpstreamPolicies(t *testing.T) {
	l := testLWS(func(l *v1alpha1.LeaderWorkerSet) {
		l.Annotations = map[string]string{v1alpha1.ExclusiveKeyAnnotationKey: "zone", v1alpha1.SubGroupExclusiveKeyAnnotationKey: "rack"}
		l.Spec.LeaderWorkerTemplate.SubGroupPolicy = &v1alpha1.SubGroupPolicy{SubGroupSize: ptr.To[int32](1)}
		l.Spec.LeaderWorkerTemplate.SchedulingPolicy = &v1alpha1.SchedulingPolicy{ReplicaUniqueNodeSelector: "pool"}
		l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.NodeSelector = map[string]string{"gpu": "a100"}
	})
	want := map[string]string{
		v1alpha1.ExclusiveKeyAnnotationKey:         "zone",
		v1alpha1.SubGroupExclusiveKeyAnnotationKey: "rack",
		v1alpha1.SubGroupSizeAnnotationKey:         "1",
		v1alpha1.SubGroupPolicyTypeAnnotationKey:   "LeaderWorker",
	}
	leaderSts, err := LeaderStatefulSet(l, "r", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	workers := WorkerStatefulSet(l, leaderPod(), map[string]string{"zone": "z1"})
	for name, ann := range map[string]map[string]string{"leader": leaderSts.Spec.Template.Annotations, "worker": workers.Spec.Template.Annotations} {
		for k, v := range want {
			if ann[k] != v {
				t.Errorf("%s template annotation %s = %q, want %q", name, k, ann[k], v)
			}
		}
	}
	// Exclusive placement pins the workers to the leader's domain, on top of the template's node
	// selector; the schedulingPolicy's selector is added per pod by the webhook.
	if d := cmp.Diff(map[string]string{"gpu": "a100", "zone": "z1"}, workers.Spec.Template.Spec.NodeSelector); d != "" {
		t.Errorf("worker node selector (-want +got):\n%s", d)
	}
	if l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.NodeSelector["zone"] != "" {
		t.Error("the LeaderWorkerSet's template was modified")
	}
}

func TestTemplateHashCoversExclusivePlacement(t *testing.T) {
	base := testLWS()
	withTopology := testLWS(func(l *v1alpha1.LeaderWorkerSet) {
		l.Annotations = map[string]string{v1alpha1.ExclusiveKeyAnnotationKey: "zone"}
	})
	other := testLWS(func(l *v1alpha1.LeaderWorkerSet) { l.Annotations = map[string]string{"unrelated": "x"} })
	if TemplateHash(base) == TemplateHash(withTopology) {
		t.Error("exclusive-topology does not change the template hash")
	}
	if TemplateHash(base) != TemplateHash(other) {
		t.Error("an unrelated annotation changed the template hash")
	}
	// The revision keeps the annotation, so a group restarted at it is placed as it was.
	rev, err := NewRevision(withTopology, lwsKind, TemplateHash(withTopology), 1)
	if err != nil {
		t.Fatal(err)
	}
	restored, err := ApplyRevision(base, rev)
	if err != nil {
		t.Fatal(err)
	}
	if TemplateHash(restored) != TemplateHash(withTopology) {
		t.Error("revision round trip lost the exclusive-topology annotation")
	}
}

func TestRollingUpdatePartition(t *testing.T) {
	one, zero := intstr.FromInt32(1), intstr.FromInt32(0)
	withPartition := func(replicas, partition int32, maxSurge intstr.IntOrString) *v1alpha1.LeaderWorkerSet {
		l := rolloutLWS(replicas, one, maxSurge)
		l.Spec.RolloutStrategy.RollingUpdateConfiguration.Partition = ptr.To(partition)
		return l
	}
	for _, tc := range []struct {
		name                        string
		lws                         *v1alpha1.LeaderWorkerSet
		changed                     bool
		sts                         []int32 // replicas, partition, last replicas; nil: no StatefulSet
		groups                      string
		wantPartition, wantReplicas int32
	}{
		{name: "created at the partition", lws: withPartition(4, 2, zero), wantPartition: 2, wantReplicas: 4},
		{name: "at rest at the partition: nothing moves", lws: withPartition(4, 2, zero),
			sts: []int32{4, 2, 4}, groups: "RRRR", wantPartition: 2, wantReplicas: 4},
		{name: "template changed: held at replicas", lws: withPartition(4, 2, zero), changed: true,
			sts: []int32{4, 2, 4}, groups: "OOOO", wantPartition: 4, wantReplicas: 4},
		{name: "rolling stops at the partition", lws: withPartition(4, 2, zero),
			sts: []int32{4, 3, 4}, groups: "OOOR", wantPartition: 2, wantReplicas: 4},
		{name: "done above the partition: stays", lws: withPartition(4, 2, zero),
			sts: []int32{4, 2, 4}, groups: "OORR", wantPartition: 2, wantReplicas: 4},
		{name: "partition lowered: the update goes on", lws: withPartition(4, 0, zero),
			sts: []int32{4, 2, 4}, groups: "OORR", wantPartition: 1, wantReplicas: 4},
		{name: "surge for the partitioned groups only", lws: withPartition(4, 3, one), changed: true,
			sts: []int32{4, 3, 4}, groups: "OOOO", wantPartition: 4, wantReplicas: 4},
		{name: "surge kept while a partitioned group is not ready", lws: withPartition(4, 2, one),
			sts: []int32{5, 3, 4}, groups: "OOONR", wantPartition: 2, wantReplicas: 5},
		{name: "surge given back once the partitioned groups are done", lws: withPartition(4, 2, one),
			sts: []int32{5, 2, 4}, groups: "OORRR", wantPartition: 2, wantReplicas: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var groups []groupState
			if tc.groups != "" {
				groups = groupsOf(tc.groups)
			}
			var p, r int32
			var err error
			if tc.sts == nil {
				p, r, err = rollingUpdate(tc.lws, nil, tc.changed, groups)
			} else {
				p, r, err = rollingUpdate(tc.lws, leaderSts(tc.sts[0], tc.sts[1], tc.sts[2]), tc.changed, groups)
			}
			if err != nil {
				t.Fatal(err)
			}
			if p != tc.wantPartition || r != tc.wantReplicas {
				t.Errorf("partition, replicas = %d, %d; want %d, %d", p, r, tc.wantPartition, tc.wantReplicas)
			}
		})
	}
}

func TestValidateUpstreamFields(t *testing.T) {
	sg := func(size, n int32, typ v1alpha1.SubGroupPolicyType) func(*v1alpha1.LeaderWorkerSet) {
		return func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.Size = ptr.To(size)
			l.Spec.LeaderWorkerTemplate.SubGroupPolicy = &v1alpha1.SubGroupPolicy{SubGroupSize: ptr.To(n)}
			if typ != "" {
				l.Spec.LeaderWorkerTemplate.SubGroupPolicy.Type = ptr.To(typ)
			}
		}
	}
	for _, tc := range []struct {
		name string
		mod  func(*v1alpha1.LeaderWorkerSet)
		want string // "" valid
	}{
		{name: "size divisible", mod: sg(4, 2, "")},
		{name: "size-1 divisible", mod: sg(5, 2, "")},
		{name: "LeaderExcluded with size-1 divisible", mod: sg(5, 2, v1alpha1.SubGroupPolicyTypeLeaderExcluded)},
		{name: "failure case - neither size nor size-1 divisible", mod: sg(6, 4, ""),
			want: "spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize: Invalid value: 4: size (6) or size-1 must be divisible by subGroupSize"},
		{name: "failure case - LeaderExcluded with size-1 not divisible", mod: sg(4, 2, v1alpha1.SubGroupPolicyTypeLeaderExcluded),
			want: "size-1 (3) must be divisible by subGroupSize under LeaderExcluded"},
		{name: "failure case - larger than size", mod: sg(2, 3, ""), want: "must not be greater than size (2)"},
		{name: "failure case - subGroupSize missing", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.SubGroupPolicy = &v1alpha1.SubGroupPolicy{}
		}, want: "spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize: Required value"},
		{name: "failure case - subgroup exclusive topology without a subGroupPolicy", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Annotations = map[string]string{v1alpha1.SubGroupExclusiveKeyAnnotationKey: "rack"}
		}, want: "metadata.annotations[leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology]: Invalid value: \"rack\": needs spec.leaderWorkerTemplate.subGroupPolicy"},
		{name: "failure case - exclusive topology not a label key", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Annotations = map[string]string{v1alpha1.ExclusiveKeyAnnotationKey: "not a key"}
		}, want: "must be a node label key"},
		{name: "failure case - negative partition", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.RolloutStrategy.RollingUpdateConfiguration = &v1alpha1.RollingUpdateConfiguration{
				MaxUnavailable: intstr.FromInt32(1), Partition: ptr.To[int32](-1)}
		}, want: "spec.rolloutStrategy.rollingUpdateConfiguration.partition: Invalid value: -1: must be >= 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := errorsToString(ValidateCreate(testLWS(tc.mod)))
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("errors %q, want %q", got, tc.want)
			}
		})
	}

	old := testLWS(sg(4, 2, ""))
	for _, tc := range []struct {
		name     string
		old, cur *v1alpha1.LeaderWorkerSet
		want     string
	}{
		{"failure case - subGroupSize changed", old, testLWS(sg(4, 4, "")), "subGroupPolicy.subGroupSize: Invalid value: 4: field is immutable"},
		{"failure case - subGroupPolicy added", testLWS(), testLWS(sg(3, 1, "")), "subGroupPolicy: Forbidden: cannot be added"},
		{"failure case - subGroupPolicy removed", old, testLWS(func(l *v1alpha1.LeaderWorkerSet) { l.Spec.LeaderWorkerTemplate.Size = ptr.To[int32](4) }),
			"subGroupPolicy: Forbidden: cannot be removed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errorsToString(ValidateUpdate(tc.old, tc.cur)); !strings.Contains(got, tc.want) {
				t.Errorf("errors %q, want %q", got, tc.want)
			}
		})
	}
}
