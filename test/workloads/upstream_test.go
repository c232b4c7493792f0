package workloads_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/pkg/workloads/lws"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

// Upstream LeaderWorkerSet features on the real control plane: subgroups, exclusive placement
// with the KEP-223 selectors, the rollout partition, LeaderReady, restartPolicy None, and status
// counts that include surge groups.

// TestLeaderWorkerSetSubGroups: size 5 by subGroupSize 2 puts the leader as the extra pod of
// subgroup 0 (LeaderWorker), or in none (LeaderExcluded); the subgroup size cannot change.
func TestLeaderWorkerSetSubGroups(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "lws-sub")
	for _, tc := range []struct {
		name string
		typ  v1alpha1.SubGroupPolicyType
		want map[string]string // pod -> subgroup index ("" none)
	}{
		{"sg", v1alpha1.SubGroupPolicyTypeLeaderWorker, map[string]string{"sg-0": "0", "sg-0-1": "0", "sg-0-2": "0", "sg-0-3": "1", "sg-0-4": "1"}},
		{"ex", v1alpha1.SubGroupPolicyTypeLeaderExcluded, map[string]string{"ex-0": "", "ex-0-1": "0", "ex-0-2": "0", "ex-0-3": "1", "ex-0-4": "1"}},
	} {
		l := newLWS(ns, tc.name, 1, 5, func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.SubGroupPolicy = &v1alpha1.SubGroupPolicy{Type: ptr.To(tc.typ), SubGroupSize: ptr.To[int32](2)}
		})
		if err := cl.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, time.Minute, tc.name+": subgroup labels", func() error {
			pods := list(t, &corev1.PodList{}, ns, map[string]string{v1alpha1.SetNameLabelKey: tc.name}).Items
			if len(pods) != 5 {
				return fmt.Errorf("%d pods", len(pods))
			}
			for _, p := range pods {
				want, ok := tc.want[p.Name]
				if !ok {
					return fmt.Errorf("unexpected pod %s", p.Name)
				}
				got := p.Labels[v1alpha1.SubGroupIndexLabelKey]
				if got != want || p.Annotations[v1alpha1.SubGroupSizeAnnotationKey] != "2" ||
					p.Annotations[v1alpha1.SubGroupPolicyTypeAnnotationKey] != string(tc.typ) {
					return fmt.Errorf("pod %s: subgroup %q (want %q), annotations %v", p.Name, got, want, p.Annotations)
				}
				if want != "" && p.Labels[v1alpha1.SubGroupUniqueHashLabelKey] != lws.GroupKey(tc.name+"-0", want) {
					return fmt.Errorf("pod %s: subgroup key %q", p.Name, p.Labels[v1alpha1.SubGroupUniqueHashLabelKey])
				}
			}
			return nil
		})
	}
	_, err := patchLWS(ctx, client.ObjectKey{Namespace: ns, Name: "sg"}, func(cur *v1alpha1.LeaderWorkerSet) {
		cur.Spec.LeaderWorkerTemplate.SubGroupPolicy.SubGroupSize = ptr.To[int32](5)
	})
	if err == nil || !strings.Contains(err.Error(), "spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize: Invalid value: 5: field is immutable") {
		t.Errorf("subGroupSize change: %v", err)
	}
	bad := newLWS(ns, "bad", 1, 6, func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.LeaderWorkerTemplate.SubGroupPolicy = &v1alpha1.SubGroupPolicy{SubGroupSize: ptr.To[int32](4)}
	})
	if err := cl.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "size (6) or size-1 must be divisible by subGroupSize") {
		t.Errorf("subGroupSize 4 of size 6: %v", err)
	}
}

// TestLeaderWorkerSetExclusivePlacement: two zones of two nodes; in each zone one node is set
// aside for group 0 and one for group 1 (schedulingPolicy). exclusive-topology on the zone sends
// the two groups to different zones, and each group's worker follows its leader into its zone,
// on its group's node.
func TestLeaderWorkerSetExclusivePlacement(t *testing.T) {
	cp, ns, ctx := setupNamespace(t, "lws-excl")
	const name, zoneKey = "ex", "test.cistern.dev/zone"
	zoneOf := map[string]string{}
	groupOf := map[string]string{}
	var nodes []string
	for _, z := range []string{"a", "b"} {
		for g := range 2 {
			n := fmt.Sprintf("%s-%s%d", ns, z, g)
			value := fmt.Sprintf("%s-%d", name, g)
			framework.CreateNode(t, cp, n, map[string]string{zoneKey: ns + "-" + z, replicaKey: value},
				corev1.Taint{Key: replicaKey, Value: value, Effect: corev1.TaintEffectNoSchedule})
			zoneOf[n], groupOf[n] = ns+"-"+z, value
			nodes = append(nodes, n)
		}
	}
	framework.FakeKubelet(t, cp.Client, fields.OneTermEqualSelector("metadata.namespace", ns), nodes...)
	l := newLWS(ns, name, 2, 2, func(l *v1alpha1.LeaderWorkerSet) {
		l.Annotations = map[string]string{v1alpha1.ExclusiveKeyAnnotationKey: zoneKey}
		l.Spec.LeaderWorkerTemplate.SchedulingPolicy = &v1alpha1.SchedulingPolicy{
			ReplicaUniqueNodeSelector: replicaKey,
			ReplicaUniqueToleration:   &v1alpha1.ReplicaUniqueToleration{Key: replicaKey, Effect: corev1.TaintEffectNoSchedule},
		}
	})
	if err := cl.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Minute, "groups in zones of their own, workers with their leader", func() error {
		pods := list(t, &corev1.PodList{}, ns, map[string]string{v1alpha1.SetNameLabelKey: name}).Items
		if len(pods) != 4 {
			return fmt.Errorf("%d pods", len(pods))
		}
		zones := map[string]string{} // group -> zone
		for _, p := range pods {
			if p.Spec.NodeName == "" {
				return fmt.Errorf("pod %s not scheduled", p.Name)
			}
			leader := name + "-" + p.Labels[v1alpha1.GroupIndexLabelKey]
			if groupOf[p.Spec.NodeName] != leader {
				return fmt.Errorf("pod %s on %s, a node of %s", p.Name, p.Spec.NodeName, groupOf[p.Spec.NodeName])
			}
			if z, ok := zones[leader]; ok && z != zoneOf[p.Spec.NodeName] {
				return fmt.Errorf("group %s in zones %s and %s", leader, z, zoneOf[p.Spec.NodeName])
			}
			zones[leader] = zoneOf[p.Spec.NodeName]
		}
		if zones[name+"-0"] == zones[name+"-1"] {
			return fmt.Errorf("both groups in zone %s", zones[name+"-0"])
		}
		return nil
	})
	var w appsv1.StatefulSet
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-0"}, &w); err != nil {
		t.Fatal(err)
	}
	if w.Spec.Template.Spec.NodeSelector[zoneKey] == "" {
		t.Errorf("worker StatefulSet node selector %v has no %s", w.Spec.Template.Spec.NodeSelector, zoneKey)
	}
	var leader corev1.Pod
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-0"}, &leader); err != nil {
		t.Fatal(err)
	}
	if a := leader.Spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey != zoneKey {
		t.Errorf("leader affinity %+v", leader.Spec.Affinity)
	}
}

// TestLeaderWorkerSetPartition: with partition 1, a template change updates groups 1 and 2 only,
// and the set is Available with no update in progress; lowering the partition to 0 updates group
// 0 and drops the old revision.
func TestLeaderWorkerSetPartition(t *testing.T) {
	cp := setup(t)
	ns := framework.CreateNamespace(t, cp, "lws-part")
	readyNodes(t, cp, ns)
	const name = "part"
	l := newLWS(ns, name, 3, 2, onReadyNodes(ns), func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.RolloutStrategy.RollingUpdateConfiguration = &v1alpha1.RollingUpdateConfiguration{
			MaxUnavailable: intstr.FromInt32(1), Partition: ptr.To[int32](1)}
	})
	if err := cl.Create(testutil.Context(t), l); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(l)
	rev1 := updateLWS(t, key, func(*v1alpha1.LeaderWorkerSet) {})
	testutil.Eventually(t, 2*time.Minute, "three ready groups", func() error { return groupsAt(t, ns, name, map[string]string{"0": rev1, "1": rev1, "2": rev1}) })

	rev2 := updateLWS(t, key, func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image = "registry.invalid/app:2"
	})
	testutil.Eventually(t, 2*time.Minute, "groups 1 and 2 updated, group 0 kept", func() error {
		if err := groupsAt(t, ns, name, map[string]string{"0": rev1, "1": rev2, "2": rev2}); err != nil {
			return err
		}
		var cur v1alpha1.LeaderWorkerSet
		if err := cl.Get(testutil.Context(t), key, &cur); err != nil {
			return err
		}
		if st := cur.Status; st.Replicas != 3 || st.ReadyReplicas != 3 || st.UpdatedReplicas != 2 ||
			!meta.IsStatusConditionTrue(st.Conditions, v1alpha1.LeaderWorkerSetAvailable) ||
			meta.IsStatusConditionTrue(st.Conditions, v1alpha1.LeaderWorkerSetUpdateInProgress) {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	if got := revisions(t, ns, name); len(got) != 2 {
		t.Errorf("ControllerRevisions %v: group 0 still needs the old one", got)
	}

	updateLWS(t, key, func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.RolloutStrategy.RollingUpdateConfiguration.Partition = ptr.To[int32](0)
	})
	testutil.Eventually(t, 2*time.Minute, "all groups updated", func() error {
		return allUpdated(t, ns, name, 3, rev2, "registry.invalid/app:2")
	})
	testutil.Eventually(t, time.Minute, "old revision deleted", func() error {
		if got := revisions(t, ns, name); len(got) != 1 || got[rev2] == "" {
			return fmt.Errorf("ControllerRevisions %v", got)
		}
		return nil
	})
}

// groupsAt checks that each group's leader pod and worker StatefulSet carry the revision given
// for it, and that its pods are running and ready.
func groupsAt(t *testing.T, ns, name string, want map[string]string) error {
	sel := map[string]string{v1alpha1.SetNameLabelKey: name}
	pods := list(t, &corev1.PodList{}, ns, sel).Items
	if len(pods) != 2*len(want) {
		return fmt.Errorf("%d pods", len(pods))
	}
	for _, p := range pods {
		if rev := want[p.Labels[v1alpha1.GroupIndexLabelKey]]; p.Labels[v1alpha1.RevisionKey] != rev || !runningReady(&p) {
			return fmt.Errorf("pod %s at %.8s (want %.8s), ready %v", p.Name, p.Labels[v1alpha1.RevisionKey], rev, runningReady(&p))
		}
	}
	for g, rev := range want {
		var s appsv1.StatefulSet
		if err := cl.Get(testutil.Context(t), client.ObjectKey{Namespace: ns, Name: name + "-" + g}, &s); err != nil {
			return err
		}
		if s.Labels[v1alpha1.RevisionKey] != rev {
			return fmt.Errorf("StatefulSet %s at %.8s", s.Name, s.Labels[v1alpha1.RevisionKey])
		}
	}
	return nil
}

// TestLeaderWorkerSetLeaderReadyAndRestartNone: under LeaderReady the workers are created only
// once the leader is Ready; under restartPolicy None a worker's container restart leaves the
// group alone (RecreateGroupOnPodRestart is TestLeaderWorkerSetGroupRestart).
func TestLeaderWorkerSetLeaderReadyAndRestartNone(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "lws-ready")
	const name = "lr"
	l := newLWS(ns, name, 1, 2, func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.StartupPolicy = v1alpha1.LeaderReadyStartupPolicy
		l.Spec.LeaderWorkerTemplate.RestartPolicy = v1alpha1.NoneRestartPolicy
	})
	mark := markReconciles(t, "leaderworkerset", "leaderworkerset-pod")
	if err := cl.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	var leader corev1.Pod
	testutil.Eventually(t, time.Minute, "leader pod", func() error {
		return cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-0"}, &leader)
	})
	// No node runs the pods here: the leader stays Pending, so no workers, once the controllers
	// have handled the leader pod.
	mark.wait(t, "the leader pod")
	var sts appsv1.StatefulSet
	if err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-0"}, &sts); err == nil {
		t.Fatal("worker StatefulSet created before the leader was ready")
	}
	setPodStatus(t, ns, name+"-0", true, 0)
	testutil.Eventually(t, time.Minute, "worker StatefulSet once the leader is ready", func() error {
		return cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-0"}, &sts)
	})
	var worker corev1.Pod
	testutil.Eventually(t, time.Minute, "worker pod", func() error {
		return cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-0-1"}, &worker)
	})
	mark = markReconciles(t, "leaderworkerset-pod")
	setPodStatus(t, ns, name+"-0-1", true, 1)
	mark.wait(t, "the worker's restart")
	var after corev1.Pod
	if err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-0"}, &after); err != nil || after.UID != leader.UID || after.DeletionTimestamp != nil {
		t.Errorf("restartPolicy None: leader replaced or deleted after a worker restart (%v)", err)
	}
}

// setPodStatus reports a pod Running, Ready or not, with restarts of its container, as a kubelet
// would.
func setPodStatus(t *testing.T, ns, name string, ready bool, restarts int32) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	changePodStatus(t, p, func(p *corev1.Pod) {
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Image: p.Spec.Containers[0].Image, RestartCount: restarts, Ready: ready,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	})
}

// statusReplicasWatch records the largest status.replicas a LeaderWorkerSet reported.
func statusReplicasWatch(t *testing.T, cp *framework.ControlPlane, ns, name string) func() int32 {
	wc, err := client.NewWithWatch(cp.Config, client.Options{Scheme: workloads.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &v1alpha1.LeaderWorkerSetList{}, client.InNamespace(ns),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", name)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var mu sync.Mutex
	var largest int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if l, ok := ev.Object.(*v1alpha1.LeaderWorkerSet); ok {
				mu.Lock()
				largest = max(largest, l.Status.Replicas)
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	return func() int32 {
		mu.Lock()
		defer mu.Unlock()
		return largest
	}
}
