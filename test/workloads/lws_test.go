package workloads_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

const replicaKey = "test.cistern.dev/replica"

func newLWS(ns, name string, replicas, size int32, mods ...func(*v1alpha1.LeaderWorkerSet)) *v1alpha1.LeaderWorkerSet {
	l := &v1alpha1.LeaderWorkerSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.LeaderWorkerSetSpec{
			Replicas: ptr.To(replicas),
			LeaderWorkerTemplate: v1alpha1.LeaderWorkerTemplate{
				Size: ptr.To(size),
				WorkerTemplate: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/app:1"}},
				}},
			},
		},
	}
	for _, m := range mods {
		m(l)
	}
	return l
}

func withClaim(whenDeleted, whenScaled appsv1.PersistentVolumeClaimRetentionPolicyType) func(*v1alpha1.LeaderWorkerSet) {
	return func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{
			ObjectMeta: metav1.ObjectMeta{Name: "data"},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(""),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}}
		l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		if whenDeleted != "" {
			l.Spec.LeaderWorkerTemplate.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
				WhenDeleted: whenDeleted, WhenScaled: whenScaled}
		}
	}
}

func list[T client.ObjectList](t *testing.T, l T, ns string, labels map[string]string) T {
	t.Helper()
	if err := cl.List(testutil.Context(t), l, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
		t.Fatal(err)
	}
	return l
}

func names[O client.Object](items []O) []string {
	var out []string
	for _, o := range items {
		out = append(out, o.GetName())
	}
	slices.Sort(out)
	return out
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

func wantNames(got, want []string) error {
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("have %v, want %v", got, want)
	}
	return nil
}

// TestLeaderWorkerSetPinnedGroups: replicas 2, size 3, a claim template and a schedulingPolicy give
// three StatefulSets, six bound claims and six pods, each on a node set aside for its group.
func TestLeaderWorkerSetPinnedGroups(t *testing.T) {
	cp, ns, ctx := setupNamespace(t, "lws-pin")
	name := "pin"

	groupNodes := map[int][]string{}
	var all []string
	for g := range 2 {
		for k := range 3 {
			n := fmt.Sprintf("%s-g%d-%d", ns, g, k)
			value := fmt.Sprintf("%s-%d", name, g)
			framework.CreateNode(t, cp, n, map[string]string{replicaKey: value},
				corev1.Taint{Key: replicaKey, Value: value, Effect: corev1.TaintEffectNoSchedule})
			groupNodes[g] = append(groupNodes[g], n)
			all = append(all, n)
		}
	}
	framework.FakeKubelet(t, cp.Client, fields.OneTermEqualSelector("metadata.namespace", ns), all...)

	// One static volume per expected claim: the PV binder binds them, so the scheduler can place
	// the pods. (No provisioner runs in this suite.)
	var claims []string
	for g := range 2 {
		claims = append(claims, fmt.Sprintf("data-%s-%d", name, g))
		for w := 1; w < 3; w++ {
			claims = append(claims, fmt.Sprintf("data-%s-%d-%d", name, g, w))
		}
	}
	for _, c := range claims {
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + c},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: "cistern.csi.dev", VolumeHandle: ns + "-" + c}},
				ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: c},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			},
		}
		if err := cl.Create(ctx, pv); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Delete(testutil.Context(t), pv) })
	}

	lws := newLWS(ns, name, 2, 3, withClaim("", ""), func(l *v1alpha1.LeaderWorkerSet) {
		// A stale LWS_ value in the template is replaced, and a user variable can use $(LWS_...).
		l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Env = []corev1.EnvVar{
			{Name: v1alpha1.LwsGroupSize, Value: "99"}, {Name: "PEERS", Value: "$(LWS_GROUP_SIZE)"}}
		l.Spec.LeaderWorkerTemplate.SchedulingPolicy = &v1alpha1.SchedulingPolicy{
			ReplicaUniqueNodeSelector: replicaKey,
			ReplicaUniqueToleration:   &v1alpha1.ReplicaUniqueToleration{Key: replicaKey, Effect: corev1.TaintEffectNoSchedule},
		}
	})
	if err := cl.Create(ctx, lws); err != nil {
		t.Fatal(err)
	}
	// The defaulting webhook wrote the retention policy explicitly.
	var stored v1alpha1.LeaderWorkerSet
	if err := cl.Get(ctx, client.ObjectKeyFromObject(lws), &stored); err != nil {
		t.Fatal(err)
	}
	if rp := stored.Spec.LeaderWorkerTemplate.PersistentVolumeClaimRetentionPolicy; rp == nil || rp.WhenDeleted != "Retain" || rp.WhenScaled != "Retain" {
		t.Errorf("retention policy not defaulted to Retain/Retain: %+v", rp)
	}

	sel := map[string]string{v1alpha1.SetNameLabelKey: name}
	testutil.Eventually(t, 2*time.Minute, "three StatefulSets", func() error {
		return wantNames(names(ptrs(list(t, &appsv1.StatefulSetList{}, ns, sel).Items)), []string{"pin", "pin-0", "pin-1"})
	})
	testutil.Eventually(t, 2*time.Minute, "six bound claims", func() error {
		var pvcs corev1.PersistentVolumeClaimList
		if err := cl.List(ctx, &pvcs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, c := range pvcs.Items {
			if c.Status.Phase != corev1.ClaimBound {
				return fmt.Errorf("claim %s is %s", c.Name, c.Status.Phase)
			}
		}
		return wantNames(names(ptrs(pvcs.Items)), slices.Clone(claims))
	})
	testutil.Eventually(t, 2*time.Minute, "six pods scheduled on their group's nodes", func() error {
		pods := list(t, &corev1.PodList{}, ns, sel).Items
		if len(pods) != 6 {
			return fmt.Errorf("%d pods", len(pods))
		}
		for _, p := range pods {
			g := p.Labels[v1alpha1.GroupIndexLabelKey]
			leader := name + "-" + g
			if p.Spec.NodeSelector[replicaKey] != leader {
				return fmt.Errorf("pod %s: nodeSelector %v", p.Name, p.Spec.NodeSelector)
			}
			if !slices.Contains(p.Spec.Tolerations, corev1.Toleration{Key: replicaKey, Operator: corev1.TolerationOpEqual, Value: leader, Effect: corev1.TaintEffectNoSchedule}) {
				return fmt.Errorf("pod %s: tolerations %v", p.Name, p.Spec.Tolerations)
			}
			var gi int
			fmt.Sscan(g, &gi)
			if !slices.Contains(groupNodes[gi], p.Spec.NodeName) {
				return fmt.Errorf("pod %s (group %s) on node %q, want one of %v", p.Name, g, p.Spec.NodeName, groupNodes[gi])
			}
			want := []corev1.EnvVar{
				{Name: v1alpha1.LwsLeaderAddress, Value: fmt.Sprintf("%s.%s.%s", leader, name, ns)},
				{Name: v1alpha1.LwsGroupSize, Value: "3"},
				{Name: v1alpha1.LwsWorkerIndex, Value: p.Labels[v1alpha1.WorkerIndexLabelKey]},
				{Name: "PEERS", Value: "$(LWS_GROUP_SIZE)"},
			}
			if env := p.Spec.Containers[0].Env; !slices.Equal(env, want) {
				return fmt.Errorf("pod %s: env %v, want %v", p.Name, env, want)
			}
		}
		return nil
	})
	testutil.Eventually(t, time.Minute, "both groups ready", func() error {
		var l v1alpha1.LeaderWorkerSet
		if err := cl.Get(ctx, client.ObjectKeyFromObject(lws), &l); err != nil {
			return err
		}
		if l.Status.ReadyReplicas != 2 || l.Status.Replicas != 2 || l.Status.UpdatedReplicas != 2 {
			return fmt.Errorf("status %+v", l.Status)
		}
		return nil
	})
	var svc corev1.Service
	if err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &svc); err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("headless service: %v %+v", err, svc.Spec)
	}
}

// TestLeaderWorkerSetScale: groups come and go with replicas. On scale-down the leader's claims
// follow whenScaled, and the removed groups' worker claims follow whenDeleted, since their
// StatefulSets are deleted whole.
func TestLeaderWorkerSetScale(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "lws-scale")
	lws := newLWS(ns, "scale", 2, 2, withClaim(appsv1.RetainPersistentVolumeClaimRetentionPolicyType, appsv1.DeletePersistentVolumeClaimRetentionPolicyType))
	if err := cl.Create(ctx, lws); err != nil {
		t.Fatal(err)
	}
	sel := map[string]string{v1alpha1.SetNameLabelKey: "scale"}
	testutil.Eventually(t, time.Minute, "two groups", func() error {
		return wantNames(names(ptrs(list(t, &appsv1.StatefulSetList{}, ns, sel).Items)), []string{"scale", "scale-0", "scale-1"})
	})
	scale := func(n int32) {
		t.Helper()
		if _, err := patchLWS(ctx, client.ObjectKeyFromObject(lws), func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.Replicas = ptr.To(n)
		}); err != nil {
			t.Fatal(err)
		}
	}
	scale(3)
	testutil.Eventually(t, time.Minute, "three groups", func() error {
		return wantNames(names(ptrs(list(t, &appsv1.StatefulSetList{}, ns, sel).Items)), []string{"scale", "scale-0", "scale-1", "scale-2"})
	})
	testutil.Eventually(t, time.Minute, "claims of three groups", func() error {
		return wantNames(names(ptrs(list(t, &corev1.PersistentVolumeClaimList{}, ns, nil).Items)),
			[]string{"data-scale-0", "data-scale-0-1", "data-scale-1", "data-scale-1-1", "data-scale-2", "data-scale-2-1"})
	})
	scale(1)
	testutil.Eventually(t, time.Minute, "one group", func() error {
		if err := wantNames(names(ptrs(list(t, &appsv1.StatefulSetList{}, ns, sel).Items)), []string{"scale", "scale-0"}); err != nil {
			return err
		}
		return wantNames(names(ptrs(list(t, &corev1.PodList{}, ns, sel).Items)), []string{"scale-0", "scale-0-1"})
	})
	testutil.Eventually(t, time.Minute, "leader claims deleted (whenScaled), worker claims kept (whenDeleted)", func() error {
		return wantNames(names(ptrs(list(t, &corev1.PersistentVolumeClaimList{}, ns, nil).Items)),
			[]string{"data-scale-0", "data-scale-0-1", "data-scale-1-1", "data-scale-2-1"})
	})
	testutil.Eventually(t, time.Minute, "status counts one group", func() error {
		var l v1alpha1.LeaderWorkerSet
		if err := cl.Get(ctx, client.ObjectKeyFromObject(lws), &l); err != nil {
			return err
		}
		if l.Status.Replicas != 1 {
			return fmt.Errorf("status.replicas %d", l.Status.Replicas)
		}
		return nil
	})
}

// TestLeaderWorkerSetDeletion: deleting the LeaderWorkerSet removes every StatefulSet and pod;
// the claims stay under whenDeleted=Retain and go under Delete.
func TestLeaderWorkerSetDeletion(t *testing.T) {
	forEachWhenDeleted(t, "lws-del", "del", func(t *testing.T, ctx context.Context, policy appsv1.PersistentVolumeClaimRetentionPolicyType, lws *v1alpha1.LeaderWorkerSet) {
		ns := lws.Namespace
		allClaims := []string{"data-del-0", "data-del-0-1", "data-del-0-2"}
		testutil.Eventually(t, time.Minute, "claims", func() error {
			return wantNames(names(ptrs(list(t, &corev1.PersistentVolumeClaimList{}, ns, nil).Items)), slices.Clone(allClaims))
		})
		mark := markReconciles(t, "leaderworkerset")
		if err := cl.Delete(ctx, lws); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, time.Minute, "StatefulSets and pods gone", func() error {
			if n := len(list(t, &appsv1.StatefulSetList{}, ns, nil).Items); n > 0 {
				return fmt.Errorf("%d StatefulSets", n)
			}
			if n := len(list(t, &corev1.PodList{}, ns, nil).Items); n > 0 {
				return fmt.Errorf("%d pods", n)
			}
			return nil
		})
		want := allClaims
		if policy == "Delete" {
			want = nil
		}
		testutil.Eventually(t, time.Minute, "claims after deletion", func() error {
			return wantNames(names(ptrs(list(t, &corev1.PersistentVolumeClaimList{}, ns, nil).Items)), want)
		})
		if policy == "Retain" {
			// Nothing deletes them later: the controller handled the deletion, the
			// StatefulSets are gone, and no claim is being deleted or has an owner the
			// garbage collector would delete it with.
			mark.wait(t, "the LeaderWorkerSet's deletion")
			claims := list(t, &corev1.PersistentVolumeClaimList{}, ns, nil).Items
			if err := wantNames(names(ptrs(claims)), allClaims); err != nil {
				t.Error(err)
			}
			for _, c := range claims {
				if c.DeletionTimestamp != nil || len(c.OwnerReferences) > 0 {
					t.Errorf("claim %s: deletionTimestamp %v, owners %v: would not stay", c.Name, c.DeletionTimestamp, c.OwnerReferences)
				}
			}
		}
	})
}

// TestLeaderWorkerSetGroupRestart: a container restart in a worker recreates the whole group
// (RecreateGroupOnPodRestart). The leader's claim always survives (its StatefulSet stays); the
// workers' claims survive under whenDeleted=Retain and are replaced under Delete.
func TestLeaderWorkerSetGroupRestart(t *testing.T) {
	forEachWhenDeleted(t, "lws-restart", "rs", func(t *testing.T, ctx context.Context, policy appsv1.PersistentVolumeClaimRetentionPolicyType, lws *v1alpha1.LeaderWorkerSet) {
		ns := lws.Namespace
		uids := func() (map[string]types.UID, error) {
			out := map[string]types.UID{}
			var pvcs corev1.PersistentVolumeClaimList
			var pods corev1.PodList
			var sets appsv1.StatefulSetList
			for _, l := range []client.ObjectList{&pvcs, &pods, &sets} {
				if err := cl.List(ctx, l, client.InNamespace(ns)); err != nil {
					return nil, err
				}
			}
			for _, o := range pvcs.Items {
				if o.DeletionTimestamp == nil {
					out["pvc/"+o.Name] = o.UID
				}
			}
			for _, o := range pods.Items {
				out["pod/"+o.Name] = o.UID
			}
			for _, o := range sets.Items {
				out["sts/"+o.Name] = o.UID
			}
			return out, nil
		}
		keys := []string{"pvc/data-rs-0", "pvc/data-rs-0-1", "pvc/data-rs-0-2", "pod/rs-0", "pod/rs-0-1", "pod/rs-0-2", "sts/rs", "sts/rs-0"}
		var before map[string]types.UID
		testutil.Eventually(t, time.Minute, "group up", func() error {
			var err error
			if before, err = uids(); err != nil {
				return err
			}
			for _, k := range keys {
				if before[k] == "" {
					return fmt.Errorf("%s missing", k)
				}
			}
			return nil
		})

		// Report a container restart in worker rs-0-1, as its kubelet would.
		if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			var w corev1.Pod
			if err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: "rs-0-1"}, &w); err != nil {
				return err
			}
			w.Status.Phase = corev1.PodRunning
			w.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Image: "registry.invalid/app:1", RestartCount: 1,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
			return cl.Status().Update(ctx, &w)
		}); err != nil {
			t.Fatal(err)
		}

		testutil.Eventually(t, 2*time.Minute, "group recreated", func() error {
			after, err := uids()
			if err != nil {
				return err
			}
			for _, k := range keys {
				if after[k] == "" {
					return fmt.Errorf("%s missing", k)
				}
			}
			for _, k := range []string{"pod/rs-0", "pod/rs-0-1", "pod/rs-0-2", "sts/rs-0"} {
				if after[k] == before[k] {
					return fmt.Errorf("%s not recreated", k)
				}
			}
			if after["sts/rs"] != before["sts/rs"] || after["pvc/data-rs-0"] != before["pvc/data-rs-0"] {
				return fmt.Errorf("leader StatefulSet or claim replaced")
			}
			for _, k := range []string{"pvc/data-rs-0-1", "pvc/data-rs-0-2"} {
				kept := after[k] == before[k]
				if kept != (policy == "Retain") {
					return fmt.Errorf("%s kept=%v under whenDeleted=%s", k, kept, policy)
				}
			}
			return nil
		})
	})
}

// forEachWhenDeleted runs test once for each whenDeleted policy (Retain, Delete), each time in a
// namespace of its own (named from prefix) with a LeaderWorkerSet called name, one group of three,
// whose claims have that policy (and whenScaled: Retain), created.
func forEachWhenDeleted(t *testing.T, prefix, name string, test func(t *testing.T, ctx context.Context, policy appsv1.PersistentVolumeClaimRetentionPolicyType, lws *v1alpha1.LeaderWorkerSet)) {
	for _, policy := range []appsv1.PersistentVolumeClaimRetentionPolicyType{"Retain", "Delete"} {
		t.Run(string(policy), func(t *testing.T) {
			_, ns, ctx := setupNamespace(t, prefix)
			lws := newLWS(ns, name, 1, 3, withClaim(policy, "Retain"))
			if err := cl.Create(ctx, lws); err != nil {
				t.Fatal(err)
			}
			test(t, ctx, policy, lws)
		})
	}
}

// TestLeaderWorkerSetAdmission: the webhooks and the schema refuse what cannot work, with
// messages naming the field.
func TestLeaderWorkerSetAdmission(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "lws-adm")

	lws := newLWS(ns, "adm", 1, 1, withClaim("", ""))
	if err := cl.Create(ctx, lws); err != nil {
		t.Fatal(err)
	}
	// The controller writes status meanwhile: a patch, which cannot conflict with it.
	_, err := patchLWS(ctx, client.ObjectKeyFromObject(lws), func(cur *v1alpha1.LeaderWorkerSet) {
		cur.Spec.LeaderWorkerTemplate.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("5Gi")
	})
	if err == nil || !strings.Contains(err.Error(), "spec.leaderWorkerTemplate.volumeClaimTemplates: Forbidden: volumeClaimTemplates cannot be changed") {
		t.Errorf("claim template change: %v", err)
	}

	for _, tc := range []struct {
		name string
		mod  func(*v1alpha1.LeaderWorkerSet)
		want string
	}{
		{"bad toleration effect", func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.SchedulingPolicy = &v1alpha1.SchedulingPolicy{
				ReplicaUniqueToleration: &v1alpha1.ReplicaUniqueToleration{Key: "k", Effect: "Sometimes"}}
		}, `spec.leaderWorkerTemplate.schedulingPolicy.replicaUniqueToleration.effect: Unsupported value: "Sometimes"`},
		{"no room to roll", func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.RolloutStrategy.RollingUpdateConfiguration = &v1alpha1.RollingUpdateConfiguration{
				MaxUnavailable: intstr.FromInt32(0), MaxSurge: intstr.FromInt32(0)}
		}, "must not be 0 when maxSurge is 0"},
		{"bad node label key", func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.SchedulingPolicy = &v1alpha1.SchedulingPolicy{ReplicaUniqueNodeSelector: "a b"}
		}, "spec.leaderWorkerTemplate.schedulingPolicy.replicaUniqueNodeSelector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := cl.Create(ctx, newLWS(ns, "bad", 1, 1, tc.mod))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want %q", err, tc.want)
			}
		})
	}
}
