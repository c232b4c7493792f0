package lws

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

func TestComputeStatus(t *testing.T) {
	l := testLWS() // replicas 2, size 3
	leader := func(name, rev string, ready bool, deleting bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name), Labels: map[string]string{v1alpha1.RevisionKey: rev}}}
		if ready {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		if deleting {
			p.DeletionTimestamp = &metav1.Time{}
		}
		return p
	}
	workers := func(name, rev string, ready int32) appsv1.StatefulSet {
		return appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.RevisionKey: rev},
				OwnerReferences: []metav1.OwnerReference{{Kind: "Pod", Name: name, UID: types.UID(name), Controller: ptr.To(true)}}},
			Spec:   appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2)},
			Status: appsv1.StatefulSetStatus{ReadyReplicas: ready, AvailableReplicas: ready}}
	}
	tests := []struct {
		name      string
		leaders   []corev1.Pod
		sets      []appsv1.StatefulSet
		want      [3]int32 // replicas, ready, updated
		avail     bool
		updating  bool
		partition int32
	}{
		{name: "nothing yet", want: [3]int32{0, 0, 0}},
		{name: "all ready and current", avail: true,
			leaders: []corev1.Pod{leader("lws-0", "r", true, false), leader("lws-1", "r", true, false)},
			sets:    []appsv1.StatefulSet{workers("lws-0", "r", 2), workers("lws-1", "r", 2)},
			want:    [3]int32{2, 2, 2}},
		{name: "a worker not ready, an old revision, a surge group (counted, as upstream) and one being deleted",
			leaders: []corev1.Pod{leader("lws-0", "r", true, false), leader("lws-1", "old", true, false),
				leader("lws-2", "r", true, false), leader("lws-3", "r", true, true)},
			sets: []appsv1.StatefulSet{workers("lws-0", "r", 1), workers("lws-1", "old", 2), workers("lws-2", "r", 2)},
			want: [3]int32{3, 2, 2}, updating: true},
		{name: "surge group ready does not make the set available while a group is not",
			leaders: []corev1.Pod{leader("lws-0", "r", true, false), leader("lws-1", "r", false, false), leader("lws-2", "r", true, false)},
			sets:    []appsv1.StatefulSet{workers("lws-0", "r", 2), workers("lws-1", "r", 2), workers("lws-2", "r", 2)},
			want:    [3]int32{3, 2, 3}},
		{name: "partition 1: group 0 keeps the old revision and the set is available", partition: 1, avail: true,
			leaders: []corev1.Pod{leader("lws-0", "old", true, false), leader("lws-1", "r", true, false)},
			sets:    []appsv1.StatefulSet{workers("lws-0", "old", 2), workers("lws-1", "r", 2)},
			want:    [3]int32{2, 2, 1}},
		{name: "being created: a leader whose worker StatefulSet is not there yet is no update in progress (as upstream)",
			leaders: []corev1.Pod{leader("lws-0", "r", false, false), leader("lws-1", "r", false, false)},
			sets:    []appsv1.StatefulSet{workers("lws-0", "r", 0)},
			want:    [3]int32{2, 0, 1}},
		{name: "partition 0: the same groups are an update in progress",
			leaders: []corev1.Pod{leader("lws-0", "old", true, false), leader("lws-1", "r", true, false)},
			sets:    []appsv1.StatefulSet{workers("lws-0", "old", 2), workers("lws-1", "r", 2)},
			want:    [3]int32{2, 2, 1}, updating: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := l.DeepCopy()
			SetDefaults(l)
			l.Spec.RolloutStrategy.RollingUpdateConfiguration.Partition = ptr.To(tc.partition)
			st, counts := ComputeStatus(l, "r", tc.leaders, tc.sets)
			if d := cmp.Diff(tc.want, [3]int32{st.Replicas, st.ReadyReplicas, st.UpdatedReplicas}); d != "" {
				t.Errorf("replicas/ready/updated (-want +got):\n%s", d)
			}
			if st.HPAPodSelector != "leaderworkerset.sigs.k8s.io/name=lws,leaderworkerset.sigs.k8s.io/worker-index=0" {
				t.Errorf("selector %q", st.HPAPodSelector)
			}
			setConditions(&st, counts, l, 1)
			if got := meta.IsStatusConditionTrue(st.Conditions, v1alpha1.LeaderWorkerSetAvailable); got != tc.avail {
				t.Errorf("Available = %v, want %v", got, tc.avail)
			}
			if got := meta.IsStatusConditionTrue(st.Conditions, v1alpha1.LeaderWorkerSetUpdateInProgress); got != tc.updating {
				t.Errorf("UpdateInProgress = %v, want %v", got, tc.updating)
			}
		})
	}
}

// Conditions appear when they first become True, as upstream writes them, and then follow.
func TestConditionsAppearWhenTrue(t *testing.T) {
	l := testLWS()
	var st v1alpha1.LeaderWorkerSetStatus
	statuses := func() map[string]metav1.ConditionStatus {
		m := map[string]metav1.ConditionStatus{}
		for _, c := range st.Conditions {
			m[c.Type] = c.Status
		}
		return m
	}
	// Created, nothing ready: only Progressing.
	setConditions(&st, GroupCounts{Partitioned: 2, Updated: 2}, l, 1)
	if d := cmp.Diff(map[string]metav1.ConditionStatus{v1alpha1.LeaderWorkerSetProgressing: metav1.ConditionTrue}, statuses()); d != "" {
		t.Errorf("new set (-want +got):\n%s", d)
	}
	// Ready: Available True, Progressing False; UpdateInProgress was never True, so absent.
	setConditions(&st, GroupCounts{Partitioned: 2, Updated: 2, Ready: 2, UpdatedReady: 2}, l, 1)
	if d := cmp.Diff(map[string]metav1.ConditionStatus{v1alpha1.LeaderWorkerSetProgressing: metav1.ConditionFalse,
		v1alpha1.LeaderWorkerSetAvailable: metav1.ConditionTrue}, statuses()); d != "" {
		t.Errorf("ready set (-want +got):\n%s", d)
	}
}
