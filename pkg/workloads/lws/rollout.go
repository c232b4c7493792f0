package lws

import (
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// A rolling update works on the leader StatefulSet only, as upstream LeaderWorkerSet's does: its
// partition says which groups may be replaced (ordinals >= partition get the new template; a
// replaced leader brings a new worker StatefulSet), and its replicas grow by up to maxSurge for
// the update. Surge groups get the highest ordinals, so they are created at the new revision and
// are the first to go when the surge is given back.

// groupState is what the rolling update needs to know of one group.
type groupState struct {
	// ready: the leader pod runs and is ready, and so are all its workers.
	ready bool
	// updated: the leader pod and the worker StatefulSet carry the current template revision.
	updated bool
}

// rolloutBudget is a rolling update's limits in groups.
type rolloutBudget struct {
	maxUnavailable, maxSurge int32
}

// budgetOf scales maxUnavailable (rounded down) and maxSurge (rounded up) against spec.replicas;
// surging by more than replicas gains nothing, so maxSurge is capped there, as upstream does.
func budgetOf(lws *v1alpha1.LeaderWorkerSet) (rolloutBudget, error) {
	ru := lws.Spec.RolloutStrategy.RollingUpdateConfiguration
	if ru == nil {
		return rolloutBudget{maxUnavailable: 1}, nil
	}
	replicas := int(ptr.Deref(lws.Spec.Replicas, 1))
	mu, err := intstr.GetScaledValueFromIntOrPercent(&ru.MaxUnavailable, replicas, false)
	if err != nil {
		return rolloutBudget{}, fmt.Errorf("maxUnavailable: %w", err)
	}
	ms, err := intstr.GetScaledValueFromIntOrPercent(&ru.MaxSurge, replicas, true)
	if err != nil {
		return rolloutBudget{}, fmt.Errorf("maxSurge: %w", err)
	}
	return rolloutBudget{maxUnavailable: int32(max(mu, 0)), maxSurge: int32(min(max(ms, 0), replicas))}, nil
}

// rollingUpdate decides the leader StatefulSet's partition and replicas. sts is the existing
// leader StatefulSet (nil before it is created), templateChanged says whether its revision differs
// from the LeaderWorkerSet's, and groups holds the state of its groups 0..sts.replicas-1.
//
//   - No StatefulSet yet: every group is created at once, at the current revision.
//   - The template just changed: the partition holds every existing group at its revision and the
//     surge groups are added. A scale-up that comes with it goes first, without surge.
//   - Rolling: the partition moves down as updated groups become ready (nextPartition); the surge
//     is given back once the groups still to update or not ready fit within maxUnavailable
//     (leaderReplicas). A scale during the update keeps the partition (clamped to the new size).
//   - Done (partition 0, spec.replicas): nothing changes.
//
// rollingUpdateConfiguration.partition is a floor under the leader StatefulSet's partition: the
// groups below it keep their revision (upstream's staged rollout), and lowering it continues the
// update. Those groups are not being replaced, so they do not hold the surge: it is given back
// once the groups at and above the floor are updated and ready (upstream keeps it until the
// partition is back at 0).
func rollingUpdate(lws *v1alpha1.LeaderWorkerSet, sts *appsv1.StatefulSet, templateChanged bool, groups []groupState) (partition, replicas int32, err error) {
	var floor int32
	if ru := lws.Spec.RolloutStrategy.RollingUpdateConfiguration; ru != nil {
		floor = max(ptr.Deref(ru.Partition, 0), 0)
	}
	partition, replicas, err = rollingUpdateSteps(lws, sts, templateChanged, groups, floor)
	return max(partition, floor), replicas, err
}

func rollingUpdateSteps(lws *v1alpha1.LeaderWorkerSet, sts *appsv1.StatefulSet, templateChanged bool, groups []groupState, floor int32) (partition, replicas int32, err error) {
	want := ptr.Deref(lws.Spec.Replicas, 1)
	if sts == nil {
		return 0, want, nil
	}
	b, err := budgetOf(lws)
	if err != nil {
		return 0, 0, err
	}
	have := ptr.Deref(sts.Spec.Replicas, 1)
	if templateChanged {
		partition = min(want, have)
		if have < want {
			return partition, want, nil
		}
		return partition, leaderReplicas(want, b, max(want-floor, 0)), nil
	}

	partition = currentPartition(sts)
	if partition <= floor && have == want {
		return partition, want, nil
	}
	if have < want {
		return partition, want, nil
	}
	unready := unreadyGroups(groups, floor, want)
	if last, ok := lastReplicas(sts); ok && last != want {
		return min(partition, want+b.maxSurge), leaderReplicas(want, b, unready), nil
	}
	// Up to maxUnavailable groups may be down, plus one for every surge group there is now: while
	// the surge is all there this is maxUnavailable+maxSurge, and it shrinks as the surge goes, so
	// giving back a surge group never takes availability below replicas-maxUnavailable.
	step := b.maxUnavailable + have - want
	return nextPartition(groups, step, partition), leaderReplicas(want, b, unready), nil
}

// nextPartition moves the partition down so that at most step groups above the tail of updated,
// ready groups are being replaced. Groups below that point that are not ready already take from
// the budget, so the partition stops higher by as many. Groups just below it that are not ready,
// or already updated, cost no availability to replace, so it moves past them: an update started
// while groups were down cannot stall. The partition never moves up.
func nextPartition(groups []groupState, step, current int32) int32 {
	n := int32(len(groups))
	var done int32
	for i := n - 1; i >= 0 && groups[i].ready && groups[i].updated; i-- {
		done++
	}
	floor := max(n-done-step, 0)
	partition := floor
	for i := range floor {
		if !groups[i].ready {
			partition++
		}
	}
	for i := min(partition, n-1); i >= floor; i-- {
		if groups[i].ready && !groups[i].updated {
			break
		}
		partition = i
	}
	return min(partition, current)
}

// leaderReplicas is the leader StatefulSet's size during an update: replicas plus the whole
// surge while more of the first replicas groups are unready (not updated, or not ready) than the
// surge covers; after that only as many surge groups as needed to keep the unready ones within
// maxUnavailable, so the surge is given back one group at a time.
func leaderReplicas(replicas int32, b rolloutBudget, unready int32) int32 {
	if unready > b.maxSurge {
		return replicas + b.maxSurge
	}
	return replicas + max(unready-b.maxUnavailable, 0)
}

// unreadyGroups counts the groups from..replicas-1 that are not both updated and ready; a group
// that does not exist yet counts.
func unreadyGroups(groups []groupState, from, replicas int32) int32 {
	var n int32
	for i := from; i < replicas; i++ {
		if int(i) >= len(groups) || !groups[i].ready || !groups[i].updated {
			n++
		}
	}
	return n
}

// rolloutDone says whether no update is under way: the leader StatefulSet was, and stays, at
// partition 0 and spec.replicas, and every group carries the current revision. Only then can no
// other template revision be needed again.
func rolloutDone(lws *v1alpha1.LeaderWorkerSet, sts *appsv1.StatefulSet, templateChanged bool, partition, replicas int32, groups []groupState) bool {
	want := ptr.Deref(lws.Spec.Replicas, 1)
	if sts == nil || templateChanged || partition != 0 || replicas != want ||
		currentPartition(sts) != 0 || ptr.Deref(sts.Spec.Replicas, 1) != want {
		return false
	}
	for i := range want {
		if int(i) >= len(groups) || !groups[i].updated {
			return false
		}
	}
	return true
}

func currentPartition(sts *appsv1.StatefulSet) int32 {
	if ru := sts.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.Partition != nil {
		return *ru.Partition
	}
	return 0
}

// lastReplicas is spec.replicas as of the controller's last write to the leader StatefulSet.
func lastReplicas(sts *appsv1.StatefulSet) (int32, bool) {
	n, err := strconv.ParseInt(sts.Annotations[v1alpha1.ReplicasAnnotationKey], 10, 32)
	return int32(n), err == nil
}

// groupStates reads the state of groups 0..n-1 from the leader pods and worker StatefulSets.
func groupStates(lwsName, revision string, n int32, leaders []corev1.Pod, sets []appsv1.StatefulSet) []groupState {
	workers := make(map[string]*appsv1.StatefulSet, len(sets))
	for i := range sets {
		workers[sets[i].Name] = &sets[i]
	}
	byName := make(map[string]*corev1.Pod, len(leaders))
	for i := range leaders {
		byName[leaders[i].Name] = &leaders[i]
	}
	states := make([]groupState, n)
	for i := range n {
		name := LeaderName(lwsName, int(i))
		if p := byName[name]; p != nil {
			states[i] = stateOf(p, workers[name], revision)
		}
	}
	return states
}

// stateOf is the state of the group led by leader, whose worker StatefulSet (nil if there is none)
// is workers. A group of size 1 (as its leader's size annotation says) has no workers; a leader
// being deleted is not ready.
func stateOf(leader *corev1.Pod, workers *appsv1.StatefulSet, revision string) groupState {
	if leader.DeletionTimestamp != nil {
		return groupState{}
	}
	leaderOK := leader.Status.Phase == corev1.PodRunning && podReady(leader)
	leaderUpdated := leader.Labels[v1alpha1.RevisionKey] == revision
	if leader.Annotations[v1alpha1.SizeAnnotationKey] == "1" {
		return groupState{ready: leaderOK, updated: leaderUpdated}
	}
	// Only this leader's own worker StatefulSet counts, not one of an earlier incarnation of the
	// group that is still being deleted.
	if workers == nil || !metav1.IsControlledBy(workers, leader) {
		return groupState{}
	}
	return groupState{
		ready:   leaderOK && workersReady(workers),
		updated: leaderUpdated && workers.Labels[v1alpha1.RevisionKey] == revision,
	}
}

// workersReady: every worker is available and the StatefulSet is not rolling.
func workersReady(sts *appsv1.StatefulSet) bool {
	want := ptr.Deref(sts.Spec.Replicas, 1)
	return sts.Status.ObservedGeneration == sts.Generation &&
		sts.Status.AvailableReplicas == want && sts.Status.ReadyReplicas == want &&
		sts.Status.CurrentRevision == sts.Status.UpdateRevision
}
