package workloads_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads/lws"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

const readyNodeKey = "test.cistern.dev/ready-nodes"

// readyNodes registers two nodes, labelled and tainted with readyNodeKey=ns so only this test's pods
// land there, with a fake kubelet that makes every pod bound to them Ready at once.
func readyNodes(t *testing.T, cp *framework.ControlPlane, ns string) {
	nodes := []string{ns + "-a", ns + "-b"}
	for _, n := range nodes {
		framework.CreateNode(t, cp, n, map[string]string{readyNodeKey: ns}, corev1.Taint{Key: readyNodeKey, Value: ns, Effect: corev1.TaintEffectNoSchedule})
	}
	framework.FakeKubelet(t, cp.Client, fields.OneTermEqualSelector("metadata.namespace", ns), nodes...)
}

// onReadyNodes sends every pod of the LeaderWorkerSet to the nodes of readyNodes.
func onReadyNodes(ns string) func(*v1alpha1.LeaderWorkerSet) {
	return func(l *v1alpha1.LeaderWorkerSet) {
		spec := &l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec
		spec.NodeSelector = map[string]string{readyNodeKey: ns}
		spec.Tolerations = []corev1.Toleration{{Key: readyNodeKey, Operator: corev1.TolerationOpEqual, Value: ns, Effect: corev1.TaintEffectNoSchedule}}
	}
}

// updateLWS changes the stored LeaderWorkerSet with mod and returns its new template revision.
// It sends a merge patch without a resourceVersion, as kubectl patch does: the controller writes
// the status all the while groups start, and an Update lost every retry to those writes at a load
// of 20 (TestLeaderWorkerSetPartition, four tries over 0.3 s).
func updateLWS(t *testing.T, key client.ObjectKey, mod func(*v1alpha1.LeaderWorkerSet)) string {
	t.Helper()
	ctx := testutil.Context(t)
	cur, err := patchLWS(ctx, key, mod)
	if err != nil {
		t.Fatal(err)
	}
	lws.SetDefaults(cur)
	return lws.TemplateHash(cur)
}

// patchLWS changes the spec of the stored LeaderWorkerSet with mod through a merge patch, which
// carries no resourceVersion and so never conflicts with the controller's status writes; the
// API server still validates the result as an update.
func patchLWS(ctx context.Context, key client.ObjectKey, mod func(*v1alpha1.LeaderWorkerSet)) (*v1alpha1.LeaderWorkerSet, error) {
	var cur v1alpha1.LeaderWorkerSet
	if err := cl.Get(ctx, key, &cur); err != nil {
		return nil, err
	}
	base := cur.DeepCopy()
	mod(&cur)
	return &cur, cl.Patch(ctx, &cur, client.MergeFrom(base))
}

// groupWatch follows, through one pod watch (so in the API server's order), how many groups a
// LeaderWorkerSet has and how many are ready, and records the extremes.
type groupWatch struct {
	mu       sync.Mutex
	pods     map[string]*corev1.Pod
	armed    bool // extremes are recorded from the moment every group was ready
	maxLive  int
	minReady int
	sawLive  string // the state that set maxLive, for the failure message
	sawReady string
}

func watchGroups(t *testing.T, c kubernetes.Interface, ns, name string) *groupWatch {
	w := &groupWatch{pods: map[string]*corev1.Pod{}, minReady: 1 << 30}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	lw := cache.NewFilteredListWatchFromClient(c.CoreV1().RESTClient(), "pods", ns, func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.SetNameLabelKey + "=" + name
	})
	set := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			w.update(func() { w.pods[p.Name] = p })
		}
	}
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    set,
			UpdateFunc: func(_, n any) { set(n) },
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				if p, ok := obj.(*corev1.Pod); ok {
					w.update(func() { delete(w.pods, p.Name) })
				}
			},
		},
	})
	wg.Add(1)
	go func() { defer wg.Done(); informer.Run(ctx.Done()) }()
	return w
}

// arm starts recording extremes; the caller has seen every group ready.
func (w *groupWatch) arm() {
	w.update(func() { w.armed = true })
}

func (w *groupWatch) update(change func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	change()
	if !w.armed {
		return
	}
	live, ready, state := w.count()
	if live > w.maxLive {
		w.maxLive, w.sawLive = live, state
	}
	if ready < w.minReady {
		w.minReady, w.sawReady = ready, state
	}
}

// count returns the groups (leader pods, terminating or not), the ready groups (leader and
// workers running and ready, none terminating, all at one revision) and a summary of the state.
func (w *groupWatch) count() (live, ready int, state string) {
	for _, p := range w.pods {
		if p.Labels[v1alpha1.WorkerIndexLabelKey] != "0" {
			continue
		}
		live++
		ok := runningReady(p)
		size := 1
		fmt.Sscan(p.Annotations[v1alpha1.SizeAnnotationKey], &size)
		for i := 1; i < size && ok; i++ {
			wp := w.pods[fmt.Sprintf("%s-%d", p.Name, i)]
			ok = wp != nil && runningReady(wp) && wp.Labels[v1alpha1.RevisionKey] == p.Labels[v1alpha1.RevisionKey]
		}
		if ok {
			ready++
		}
		state += fmt.Sprintf(" %s(%.6s ready=%v)", p.Name, p.Labels[v1alpha1.RevisionKey], ok)
	}
	return live, ready, state
}

// settled says whether the watch has seen exactly n groups, all ready, all leaders at rev.
func (w *groupWatch) settled(n int, rev string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	live, ready, state := w.count()
	if live != n || ready != n {
		return fmt.Errorf("%d groups, %d ready:%s", live, ready, state)
	}
	for _, p := range w.pods {
		if p.Labels[v1alpha1.RevisionKey] != rev {
			return fmt.Errorf("pod %s at %s", p.Name, p.Labels[v1alpha1.RevisionKey])
		}
	}
	return nil
}

func (w *groupWatch) extremes() (maxLive, minReady int, sawLive, sawReady string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxLive, w.minReady, w.sawLive, w.sawReady
}

func runningReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// leaderReplicasWatch records the largest spec.replicas the leader StatefulSet ever had.
func leaderReplicasWatch(t *testing.T, c kubernetes.Interface, ns, name string) func() int32 {
	var mu sync.Mutex
	var largest int32
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	lw := cache.NewListWatchFromClient(c.AppsV1().RESTClient(), "statefulsets", ns, fields.OneTermEqualSelector("metadata.name", name))
	seen := func(obj any) {
		if s, ok := obj.(*appsv1.StatefulSet); ok {
			mu.Lock()
			largest = max(largest, ptr.Deref(s.Spec.Replicas, 1))
			mu.Unlock()
		}
	}
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &appsv1.StatefulSet{},
		Handler:       cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, n any) { seen(n) }},
	})
	wg.Add(1)
	go func() { defer wg.Done(); informer.Run(ctx.Done()) }()
	return func() int32 {
		mu.Lock()
		defer mu.Unlock()
		return largest
	}
}

// revisions lists the ControllerRevisions of a LeaderWorkerSet as key -> name. (Those of its
// StatefulSets carry the same labels, from the pod templates, but another owner.)
func revisions(t *testing.T, ns, name string) map[string]string {
	out := map[string]string{}
	for _, r := range list(t, &appsv1.ControllerRevisionList{}, ns, map[string]string{v1alpha1.SetNameLabelKey: name}).Items {
		if ref := metav1.GetControllerOf(&r); ref != nil && ref.Kind == "LeaderWorkerSet" && ref.Name == name {
			out[r.Labels[v1alpha1.RevisionKey]] = r.Name
		}
	}
	return out
}

// allUpdated checks that the leader StatefulSet is at rest (partition 0, replicas) and that every
// leader pod and worker StatefulSet carries rev, with the given worker image.
func allUpdated(t *testing.T, ns, name string, replicas int32, rev, image string) error {
	var leader appsv1.StatefulSet
	if err := cl.Get(testutil.Context(t), client.ObjectKey{Namespace: ns, Name: name}, &leader); err != nil {
		return err
	}
	if r, p := ptr.Deref(leader.Spec.Replicas, 1), *leader.Spec.UpdateStrategy.RollingUpdate.Partition; r != replicas || p != 0 {
		return fmt.Errorf("leader StatefulSet replicas %d partition %d", r, p)
	}
	sel := map[string]string{v1alpha1.SetNameLabelKey: name}
	sets := list(t, &appsv1.StatefulSetList{}, ns, sel).Items
	if len(sets) != int(replicas)+1 {
		return fmt.Errorf("%d StatefulSets", len(sets))
	}
	for _, s := range sets {
		if s.Labels[v1alpha1.RevisionKey] != rev {
			return fmt.Errorf("StatefulSet %s at %s", s.Name, s.Labels[v1alpha1.RevisionKey])
		}
	}
	pods := list(t, &corev1.PodList{}, ns, sel).Items
	for _, p := range pods {
		if p.Labels[v1alpha1.RevisionKey] != rev || p.Spec.Containers[0].Image != image || !runningReady(&p) {
			return fmt.Errorf("pod %s at %s, image %s, phase %s", p.Name, p.Labels[v1alpha1.RevisionKey], p.Spec.Containers[0].Image, p.Status.Phase)
		}
	}
	var cur v1alpha1.LeaderWorkerSet
	if err := cl.Get(testutil.Context(t), client.ObjectKey{Namespace: ns, Name: name}, &cur); err != nil {
		return err
	}
	if st := cur.Status; st.Replicas != replicas || st.ReadyReplicas != replicas || st.UpdatedReplicas != replicas {
		return fmt.Errorf("status %+v", st)
	}
	return nil
}

// TestLeaderWorkerSetMaxSurge: replicas 3, size 2, maxUnavailable 1, maxSurge 1. A template change
// adds a fourth group at the new revision, never has more than 4 groups or fewer than 2 ready
// ones, and ends with 3 groups, all at the new revision, and only the new ControllerRevision.
// The status counts the surge group while it exists.
func TestLeaderWorkerSetMaxSurge(t *testing.T) {
	cp, ns, ctx := setupNamespace(t, "lws-surge")
	readyNodes(t, cp, ns)
	const name = "surge"
	l := newLWS(ns, name, 3, 2, onReadyNodes(ns), func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.RolloutStrategy.RollingUpdateConfiguration = &v1alpha1.RollingUpdateConfiguration{
			MaxUnavailable: intstr.FromInt32(1), MaxSurge: intstr.FromInt32(1)}
	})
	groups := watchGroups(t, cp.Client, ns, name)
	largest := leaderReplicasWatch(t, cp.Client, ns, name)
	statusReplicas := statusReplicasWatch(t, cp, ns, name)
	if err := cl.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	rev1 := updateLWS(t, client.ObjectKeyFromObject(l), func(*v1alpha1.LeaderWorkerSet) {})
	testutil.Eventually(t, 2*time.Minute, "three ready groups at the first revision", func() error {
		return allUpdated(t, ns, name, 3, rev1, "registry.invalid/app:1")
	})
	testutil.Eventually(t, 30*time.Second, "the watch sees three ready groups", func() error { return groups.settled(3, rev1) })
	if got := revisions(t, ns, name); len(got) != 1 || got[rev1] == "" {
		t.Fatalf("ControllerRevisions %v, want one for %s", got, rev1)
	}
	groups.arm()

	rev2 := updateLWS(t, client.ObjectKeyFromObject(l), func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image = "registry.invalid/app:2"
	})
	testutil.Eventually(t, 3*time.Minute, "three ready groups at the new revision", func() error {
		return allUpdated(t, ns, name, 3, rev2, "registry.invalid/app:2")
	})
	// The watch may lag behind the reads above: the extremes are complete once it has seen the
	// end state too.
	testutil.Eventually(t, 30*time.Second, "the watch sees the end of the update", func() error { return groups.settled(3, rev2) })
	maxLive, minReady, sawLive, sawReady := groups.extremes()
	t.Logf("during the update: up to %d groups (%s), at least %d ready (%s); leader StatefulSet up to %d replicas",
		maxLive, sawLive, minReady, sawReady, largest())
	if largest() != 4 {
		t.Errorf("the leader StatefulSet grew to %d replicas, want 4 (replicas + maxSurge)", largest())
	}
	// Surge groups count in the status, as upstream counts them.
	if got := statusReplicas(); got != 4 {
		t.Errorf("status.replicas reached %d during the update, want 4 (the surge group counted)", got)
	}
	if maxLive > 4 {
		t.Errorf("%d groups at once, more than replicas + maxSurge = 4:%s", maxLive, sawLive)
	}
	if minReady < 2 {
		t.Errorf("only %d ready groups, fewer than replicas - maxUnavailable = 2:%s", minReady, sawReady)
	}
	testutil.Eventually(t, time.Minute, "the old ControllerRevision deleted", func() error {
		if got := revisions(t, ns, name); len(got) != 1 || got[rev2] == "" {
			return fmt.Errorf("ControllerRevisions %v, want only %s's", got, rev2)
		}
		return nil
	})
}

// TestLeaderWorkerSetRevisions: while an update is stuck (the new template cannot be scheduled),
// a group below the partition that restarts gets its workers from its own, old revision (its
// ControllerRevision); rolling back to the old template reuses that revision, finishes the update
// and leaves only it.
func TestLeaderWorkerSetRevisions(t *testing.T) {
	cp, ns, ctx := setupNamespace(t, "lws-rev")
	readyNodes(t, cp, ns)
	const name = "rev"
	l := newLWS(ns, name, 3, 2, onReadyNodes(ns))
	if err := cl.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(l)
	rev1 := updateLWS(t, key, func(*v1alpha1.LeaderWorkerSet) {})
	testutil.Eventually(t, 2*time.Minute, "three ready groups at the first revision", func() error {
		return allUpdated(t, ns, name, 3, rev1, "registry.invalid/app:1")
	})
	rev1Name := revisions(t, ns, name)[rev1]

	// The new template asks for a node that does not exist: its groups never become ready.
	rev2 := updateLWS(t, key, func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image = "registry.invalid/app:2"
		l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.NodeSelector["test.cistern.dev/missing"] = "true"
	})
	testutil.Eventually(t, 2*time.Minute, "the update stuck at partition 2", func() error {
		var leader appsv1.StatefulSet
		if err := cl.Get(ctx, key, &leader); err != nil {
			return err
		}
		if p := *leader.Spec.UpdateStrategy.RollingUpdate.Partition; p != 2 {
			return fmt.Errorf("partition %d", p)
		}
		var p corev1.Pod
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-2"}, &p); err != nil {
			return err
		}
		if p.Labels[v1alpha1.RevisionKey] != rev2 {
			return fmt.Errorf("leader %s at %s", p.Name, p.Labels[v1alpha1.RevisionKey])
		}
		return nil
	})
	if got := revisions(t, ns, name); len(got) != 2 || got[rev1] != rev1Name || got[rev2] == "" {
		t.Fatalf("ControllerRevisions %v, want %s's and %s's", got, rev1, rev2)
	}

	// Restart group 0: its leader comes back at the old revision (below the partition), and so
	// must its workers.
	var leader0 corev1.Pod
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-0"}, &leader0); err != nil {
		t.Fatal(err)
	}
	if err := cl.Delete(ctx, &leader0); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Minute, "group 0 rebuilt at the old revision", func() error {
		var p corev1.Pod
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-0"}, &p); err != nil {
			return err
		}
		if p.UID == leader0.UID || p.Labels[v1alpha1.RevisionKey] != rev1 {
			return fmt.Errorf("leader uid %s (old %s) at %s", p.UID, leader0.UID, p.Labels[v1alpha1.RevisionKey])
		}
		var w appsv1.StatefulSet
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-0"}, &w); err != nil {
			return err
		}
		if !metav1.IsControlledBy(&w, &p) {
			return fmt.Errorf("worker StatefulSet still of the old leader")
		}
		if w.Labels[v1alpha1.RevisionKey] != rev1 || w.Spec.Template.Spec.Containers[0].Image != "registry.invalid/app:1" {
			return fmt.Errorf("worker StatefulSet at %s, image %s", w.Labels[v1alpha1.RevisionKey], w.Spec.Template.Spec.Containers[0].Image)
		}
		var wp corev1.Pod
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-0-1"}, &wp); err != nil {
			return err
		}
		if !runningReady(&wp) || wp.Spec.Containers[0].Image != "registry.invalid/app:1" {
			return fmt.Errorf("worker %s: image %s, phase %s", wp.Name, wp.Spec.Containers[0].Image, wp.Status.Phase)
		}
		return nil
	})

	// Roll back: the first template again.
	if back := updateLWS(t, key, func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image = "registry.invalid/app:1"
		delete(l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.NodeSelector, "test.cistern.dev/missing")
	}); back != rev1 {
		t.Fatalf("rolling back gave revision %s, want %s", back, rev1)
	}
	testutil.Eventually(t, 2*time.Minute, "rolled back", func() error {
		return allUpdated(t, ns, name, 3, rev1, "registry.invalid/app:1")
	})
	testutil.Eventually(t, time.Minute, "only the first ControllerRevision left", func() error {
		if got := revisions(t, ns, name); len(got) != 1 || got[rev1] != rev1Name {
			return fmt.Errorf("ControllerRevisions %v, want only %s", got, rev1Name)
		}
		return nil
	})
}
