package lws

import (
	"fmt"
	"strconv"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// rolloutLWS is a LeaderWorkerSet with the given replicas and rolling update budget.
func rolloutLWS(replicas int32, maxUnavailable, maxSurge intstr.IntOrString) *v1alpha1.LeaderWorkerSet {
	return testLWS(func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.Replicas = ptr.To(replicas)
		l.Spec.RolloutStrategy.RollingUpdateConfiguration = &v1alpha1.RollingUpdateConfiguration{
			MaxUnavailable: maxUnavailable, MaxSurge: maxSurge}
	})
}

// leaderSts is an existing leader StatefulSet with replicas, partition, and spec.replicas as of
// the last write (the replicas annotation).
func leaderSts(replicas, partition, lastReplicas int32) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "lws", Annotations: map[string]string{
			v1alpha1.ReplicasAnnotationKey: strconv.Itoa(int(lastReplicas))}},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To(replicas),
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{RollingUpdate: &appsv1.RollingUpdateStatefulSetStrategy{
				Partition: ptr.To(partition)}},
		},
	}
}

// groupsOf spells group states: R ready and updated, O ready at the old revision, N updated and
// not ready, D neither.
func groupsOf(s string) []groupState {
	out := make([]groupState, len(s))
	for i, c := range s {
		out[i] = groupState{ready: c == 'R' || c == 'O', updated: c == 'R' || c == 'N'}
	}
	return out
}

func TestBudgetOf(t *testing.T) {
	for _, tc := range []struct {
		replicas       int32
		maxUnavailable intstr.IntOrString
		maxSurge       intstr.IntOrString
		want           rolloutBudget
	}{
		{4, intstr.FromInt32(1), intstr.FromInt32(0), rolloutBudget{1, 0}},
		{4, intstr.FromInt32(2), intstr.FromInt32(1), rolloutBudget{2, 1}},
		{3, intstr.FromString("50%"), intstr.FromString("50%"), rolloutBudget{1, 2}}, // 1.5 down, 1.5 up
		{10, intstr.FromString("25%"), intstr.FromString("1%"), rolloutBudget{2, 1}},
		{2, intstr.FromInt32(1), intstr.FromInt32(4), rolloutBudget{1, 2}}, // surge capped at replicas
		{2, intstr.FromInt32(0), intstr.FromString("100%"), rolloutBudget{0, 2}},
		{0, intstr.FromInt32(1), intstr.FromString("50%"), rolloutBudget{1, 0}},
	} {
		name := fmt.Sprintf("replicas %d, maxUnavailable %s, maxSurge %s", tc.replicas, tc.maxUnavailable.String(), tc.maxSurge.String())
		t.Run(name, func(t *testing.T) {
			got, err := budgetOf(rolloutLWS(tc.replicas, tc.maxUnavailable, tc.maxSurge))
			if err != nil || got != tc.want {
				t.Errorf("budgetOf = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// The cases of upstream's TestCalculateRollingUpdateReplicas.
func TestLeaderReplicas(t *testing.T) {
	for _, tc := range []struct {
		name                                  string
		replicas, maxSurge, maxUnavailable, n int32
		want                                  int32
	}{
		{"keeps the surge while the unready groups exceed maxUnavailable", 1, 1, 0, 1, 2},
		{"gives back the surge gradually as groups become ready", 4, 2, 1, 2, 5},
		{"gives back surge before the partition reaches 0 when maxUnavailable allows", 2, 2, 1, 2, 3},
		{"no surge once every group is ready", 1, 1, 0, 0, 1},
		{"no surge when maxUnavailable covers the unready group", 1, 1, 1, 1, 1},
		{"no surge when maxSurge is 0", 3, 0, 0, 1, 3},
		{"whole surge while more groups are unready than it covers", 4, 1, 1, 4, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := leaderReplicas(tc.replicas, rolloutBudget{maxUnavailable: tc.maxUnavailable, maxSurge: tc.maxSurge}, tc.n); got != tc.want {
				t.Errorf("leaderReplicas = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestRollingUpdate(t *testing.T) {
	one, two, zero := intstr.FromInt32(1), intstr.FromInt32(2), intstr.FromInt32(0)
	tests := []struct {
		name          string
		lws           *v1alpha1.LeaderWorkerSet
		sts           *appsv1.StatefulSet
		changed       bool
		groups        string
		wantPartition int32
		wantReplicas  int32
	}{
		{name: "no StatefulSet yet: all groups at once", lws: rolloutLWS(4, one, one),
			wantPartition: 0, wantReplicas: 4},
		{name: "at rest", lws: rolloutLWS(4, one, one), sts: leaderSts(4, 0, 4), groups: "RRRR",
			wantPartition: 0, wantReplicas: 4},
		{name: "template change, maxSurge 0: hold all groups, no surge", lws: rolloutLWS(4, one, zero),
			sts: leaderSts(4, 0, 4), changed: true, groups: "OOOO", wantPartition: 4, wantReplicas: 4},
		{name: "template change, maxSurge 1: one surge group", lws: rolloutLWS(4, one, one),
			sts: leaderSts(4, 0, 4), changed: true, groups: "OOOO", wantPartition: 4, wantReplicas: 5},
		{name: "template change, maxSurge 50% of 3 rounds up to 2", lws: rolloutLWS(3, one, intstr.FromString("50%")),
			sts: leaderSts(3, 0, 3), changed: true, groups: "OOO", wantPartition: 3, wantReplicas: 5},
		{name: "template change, maxSurge above replicas is capped", lws: rolloutLWS(2, one, intstr.FromInt32(4)),
			sts: leaderSts(2, 0, 2), changed: true, groups: "OO", wantPartition: 2, wantReplicas: 3},
		{name: "template change, maxSurge 2 of 2 with maxUnavailable 1: only what maxUnavailable does not cover",
			lws: rolloutLWS(2, one, two), sts: leaderSts(2, 0, 2), changed: true, groups: "OO", wantPartition: 2, wantReplicas: 3},
		{name: "scale up without template change: no surge", lws: rolloutLWS(3, zero, one),
			sts: leaderSts(2, 0, 2), groups: "RR", wantPartition: 0, wantReplicas: 3},
		{name: "scale up with template change: scale first, no surge", lws: rolloutLWS(3, zero, one),
			sts: leaderSts(2, 0, 2), changed: true, groups: "OO", wantPartition: 2, wantReplicas: 3},
		{name: "scale down with template change: surge on the new size", lws: rolloutLWS(3, one, two),
			sts: leaderSts(6, 0, 6), changed: true, groups: "OOOOOO", wantPartition: 3, wantReplicas: 5},
		{name: "after a scale down with template change the partition moves", lws: rolloutLWS(3, one, two),
			sts: leaderSts(5, 3, 3), groups: "OOODD", wantPartition: 2, wantReplicas: 5},
		{name: "maxSurge 1: surge group not ready yet, one old group rolls", lws: rolloutLWS(4, one, one),
			sts: leaderSts(5, 4, 4), groups: "OOOOD", wantPartition: 3, wantReplicas: 5},
		{name: "maxSurge 1: surge group ready, the next old group rolls", lws: rolloutLWS(4, one, one),
			sts: leaderSts(5, 3, 4), groups: "OOOND", wantPartition: 3, wantReplicas: 5},
		{name: "maxSurge 1: two groups ready at the top", lws: rolloutLWS(4, one, one),
			sts: leaderSts(5, 3, 4), groups: "OOORR", wantPartition: 1, wantReplicas: 5},
		{name: "maxSurge 1: surge given back once the unready groups fit in maxUnavailable", lws: rolloutLWS(4, one, one),
			sts: leaderSts(5, 1, 4), groups: "ODRRR", wantPartition: 0, wantReplicas: 5},
		{name: "maxSurge 1: last group rolling, surge gone", lws: rolloutLWS(4, one, one),
			sts: leaderSts(5, 0, 4), groups: "NRRRR", wantPartition: 0, wantReplicas: 4},
		{name: "maxUnavailable 2, maxSurge 2: partition to replicas-maxUnavailable", lws: rolloutLWS(4, two, two),
			sts: leaderSts(6, 4, 4), groups: "OOOODD", wantPartition: 2, wantReplicas: 6},
		{name: "maxUnavailable 2, maxSurge 2: half updated, surge given back", lws: rolloutLWS(4, two, two),
			sts: leaderSts(6, 2, 4), groups: "OORRRR", wantPartition: 0, wantReplicas: 4},
		{name: "maxUnavailable 0, maxSurge 1: an old group rolls only once the surge group is ready", lws: rolloutLWS(4, zero, one),
			sts: leaderSts(5, 4, 4), groups: "OOOOD", wantPartition: 4, wantReplicas: 5},
		{name: "maxUnavailable 0, maxSurge 1: surge ready", lws: rolloutLWS(4, zero, one),
			sts: leaderSts(5, 4, 4), groups: "OOOOR", wantPartition: 3, wantReplicas: 5},
		{name: "an unready group below the partition holds the partition up", lws: rolloutLWS(4, one, zero),
			sts: leaderSts(4, 3, 4), groups: "DOOR", wantPartition: 3, wantReplicas: 4},
		{name: "groups that were down before the update roll without waiting", lws: rolloutLWS(3, one, zero),
			sts: leaderSts(3, 3, 3), groups: "DDD", wantPartition: 2, wantReplicas: 3},
		{name: "the partition never moves up", lws: rolloutLWS(4, one, zero),
			sts: leaderSts(4, 1, 4), groups: "DDOO", wantPartition: 1, wantReplicas: 4},
		{name: "scaled up during the update: new groups first, partition kept", lws: rolloutLWS(6, one, two),
			sts: leaderSts(5, 3, 4), groups: "OOORD", wantPartition: 3, wantReplicas: 6},
		{name: "scaled up during the update to no more than the surge had: surge on the new size", lws: rolloutLWS(6, one, two),
			sts: leaderSts(6, 3, 4), groups: "OOORDD", wantPartition: 3, wantReplicas: 8},
		{name: "scaled down during the update: partition clamped", lws: rolloutLWS(2, one, one),
			sts: leaderSts(5, 4, 4), groups: "OOOOD", wantPartition: 3, wantReplicas: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, r, err := rollingUpdate(tc.lws, tc.sts, tc.changed, groupsOf(tc.groups))
			if err != nil {
				t.Fatal(err)
			}
			if p != tc.wantPartition || r != tc.wantReplicas {
				t.Errorf("partition, replicas = %d, %d; want %d, %d", p, r, tc.wantPartition, tc.wantReplicas)
			}
		})
	}
}

// simulate runs a rolling update of lws from a set whose groups are all ready at the old
// revision, playing the StatefulSet controller (it replaces every old group at or above the
// partition at once, the worst case for availability) and the kubelets (readyPerStep groups become
// ready between two passes of the controller). It checks on every state the set goes through
// that there are never more than replicas+maxSurge groups and never fewer than
// replicas-maxUnavailable ready ones, and returns the largest size the leader StatefulSet had.
func simulate(t *testing.T, lws *v1alpha1.LeaderWorkerSet, readyPerStep int) int32 {
	t.Helper()
	type group struct{ updated, ready bool }
	want := *lws.Spec.Replicas
	b, err := budgetOf(lws)
	if err != nil {
		t.Fatal(err)
	}
	groups := make([]group, want)
	for i := range groups {
		groups[i] = group{ready: true}
	}
	sts := leaderSts(want, 0, want)
	changed := true
	largest := want
	check := func(when string) {
		t.Helper()
		ready := 0
		for _, g := range groups {
			if g.ready {
				ready++
			}
		}
		if int32(len(groups)) > want+b.maxSurge {
			t.Fatalf("%s: %d groups, more than replicas %d + maxSurge %d", when, len(groups), want, b.maxSurge)
		}
		if int32(ready) < want-b.maxUnavailable {
			t.Fatalf("%s: %d ready groups, fewer than replicas %d - maxUnavailable %d", when, ready, want, b.maxUnavailable)
		}
	}
	for step := range 100 {
		states := make([]groupState, len(groups))
		for i, g := range groups {
			states[i] = groupState{ready: g.ready, updated: g.updated}
		}
		p, r, err := rollingUpdate(lws, sts, changed, states)
		if err != nil {
			t.Fatal(err)
		}
		changed = false
		sts = leaderSts(r, p, want)
		largest = max(largest, r)
		if int(r) < len(groups) {
			groups = groups[:r]
		}
		for int(r) > len(groups) {
			groups = append(groups, group{updated: int32(len(groups)) >= p})
		}
		for i := p; i < r; i++ {
			if !groups[i].updated {
				groups[i] = group{updated: true}
			}
		}
		check(fmt.Sprintf("step %d, after partition %d, replicas %d", step, p, r))

		done := p == 0 && r == want
		for i := range groups {
			done = done && groups[i].updated && groups[i].ready
		}
		if done {
			return largest
		}
		n := readyPerStep
		for i := len(groups) - 1; i >= 0 && n > 0; i-- {
			if groups[i].updated && !groups[i].ready {
				groups[i].ready = true
				n--
			}
		}
	}
	t.Fatalf("the update did not finish: groups %+v, StatefulSet %+v", groups, sts.Spec)
	return 0
}

func TestRollingUpdateKeepsBudget(t *testing.T) {
	for _, tc := range []struct {
		replicas                 int32
		maxUnavailable, maxSurge intstr.IntOrString
		wantLargest              int32
	}{
		{4, intstr.FromInt32(1), intstr.FromInt32(0), 4},
		{4, intstr.FromInt32(1), intstr.FromInt32(1), 5},
		{3, intstr.FromInt32(1), intstr.FromInt32(1), 4},
		{4, intstr.FromInt32(2), intstr.FromInt32(2), 6},
		{4, intstr.FromInt32(0), intstr.FromInt32(1), 5},
		{4, intstr.FromInt32(0), intstr.FromInt32(2), 6},
		{2, intstr.FromInt32(1), intstr.FromInt32(4), 3},
		{1, intstr.FromInt32(0), intstr.FromInt32(1), 2},
		{5, intstr.FromString("20%"), intstr.FromString("30%"), 7},
		{10, intstr.FromString("25%"), intstr.FromString("10%"), 11},
		{6, intstr.FromInt32(6), intstr.FromInt32(0), 6},
	} {
		for _, perStep := range []int{1, 2, 100} {
			name := fmt.Sprintf("replicas %d, maxUnavailable %s, maxSurge %s, %d ready per step",
				tc.replicas, tc.maxUnavailable.String(), tc.maxSurge.String(), perStep)
			t.Run(name, func(t *testing.T) {
				if got := simulate(t, rolloutLWS(tc.replicas, tc.maxUnavailable, tc.maxSurge), perStep); got != tc.wantLargest {
					t.Errorf("leader StatefulSet grew to %d groups, want %d", got, tc.wantLargest)
				}
			})
		}
	}
}

func TestRolloutDone(t *testing.T) {
	l := rolloutLWS(3, intstr.FromInt32(1), intstr.FromInt32(1))
	for _, tc := range []struct {
		name                string
		sts                 *appsv1.StatefulSet
		changed             bool
		partition, replicas int32
		groups              string
		want                bool
	}{
		{"at rest, all updated (ready or not)", leaderSts(3, 0, 3), false, 0, 3, "RRN", true},
		{"no StatefulSet yet", nil, false, 0, 3, "", false},
		{"template just changed", leaderSts(3, 0, 3), true, 3, 4, "OOO", false},
		{"a group at an old revision", leaderSts(3, 0, 3), false, 0, 3, "RRO", false},
		{"a group missing", leaderSts(3, 0, 3), false, 0, 3, "RR", false},
		{"surge still there", leaderSts(4, 0, 3), false, 0, 3, "RRRR", false},
		{"partition about to move", leaderSts(3, 1, 3), false, 0, 3, "RRR", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rolloutDone(l, tc.sts, tc.changed, tc.partition, tc.replicas, groupsOf(tc.groups)); got != tc.want {
				t.Errorf("rolloutDone = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStateOf(t *testing.T) {
	leader := func(rev string, ready bool, size string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lws-0", UID: "leader",
			Labels: map[string]string{v1alpha1.RevisionKey: rev}, Annotations: map[string]string{v1alpha1.SizeAnnotationKey: size}}}
		if ready {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		return p
	}
	workers := func(rev, owner string, available int32) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Name: "lws-0", Labels: map[string]string{v1alpha1.RevisionKey: rev},
				OwnerReferences: []metav1.OwnerReference{{Kind: "Pod", Name: "lws-0", UID: types.UID("leader" + owner), Controller: ptr.To(true)}}},
			Spec:   appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2)},
			Status: appsv1.StatefulSetStatus{ReadyReplicas: available, AvailableReplicas: available},
		}
	}
	for _, tc := range []struct {
		name    string
		leader  *corev1.Pod
		workers *appsv1.StatefulSet
		want    groupState
	}{
		{"ready and updated", leader("r", true, "3"), workers("r", "", 2), groupState{ready: true, updated: true}},
		{"a worker not available", leader("r", true, "3"), workers("r", "", 1), groupState{updated: true}},
		{"old workers", leader("r", true, "3"), workers("old", "", 2), groupState{ready: true}},
		{"workers of an earlier leader", leader("r", true, "3"), workers("r", "-before", 2), groupState{}},
		{"no workers yet", leader("r", true, "3"), nil, groupState{}},
		{"size 1 needs no workers", leader("r", true, "1"), nil, groupState{ready: true, updated: true}},
		{"leader not ready", leader("old", false, "1"), nil, groupState{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stateOf(tc.leader, tc.workers, "r"); got != tc.want {
				t.Errorf("stateOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}
