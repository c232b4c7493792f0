package nodeloss

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
)

func pinned(name, node, claim string, key string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			ClaimRef: &corev1.ObjectReference{Namespace: "ns", Name: claim, UID: types.UID("uid-" + claim)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: consts.DriverName, VolumeHandle: name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		},
	}
}

func TestPinnedNode(t *testing.T) {
	two := pinned("pv", "a", "c", corev1.LabelHostname)
	two.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values = []string{"a", "b"}
	zone := pinned("pv", "z1", "c", corev1.LabelTopologyZone)
	for _, tc := range []struct {
		pv   *corev1.PersistentVolume
		want string
	}{
		{pinned("pv", "a", "c", corev1.LabelHostname), "a"},
		{pinned("pv", "a", "c", consts.TopologyKey), "a"},
		{two, ""},
		{zone, ""},
		{&corev1.PersistentVolume{}, ""},
	} {
		if got := PinnedNode(tc.pv); got != tc.want {
			t.Errorf("PinnedNode(%+v) = %q, want %q", tc.pv.Spec.NodeAffinity, got, tc.want)
		}
	}
}

// A lost node releases the LeaderWorkerSet claims pinned to it and the pods holding them that do
// not run elsewhere; other claims, claims marked to keep, and pods on live nodes stay.
func TestReleaseOnNodeLoss(t *testing.T) {
	now := time.Now()
	claim := func(name, volume string, lws bool, keep bool) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume}}
		if lws {
			c.Labels = map[string]string{v1alpha1.SetNameLabelKey: "train"}
		}
		if keep {
			c.Annotations = map[string]string{KeepAnnotation: "true"}
		}
		return c
	}
	pod := func(name, node, claim string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name),
			Labels: map[string]string{v1alpha1.SetNameLabelKey: "train"}},
			Spec: corev1.PodSpec{NodeName: node, Volumes: []corev1.Volume{{Name: "data",
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	}
	terminating := func(p *corev1.Pod) *corev1.Pod {
		p.DeletionTimestamp = &metav1.Time{Time: now}
		p.Finalizers = []string{"test.cistern.dev/hold"}
		return p
	}
	notReady := func(since time.Duration) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", LastTransitionTime: metav1.NewTime(now.Add(-since))}}}}
	}
	for _, tc := range []struct {
		name     string
		node     *corev1.Node // nil: deleted
		grace    time.Duration
		released bool
		requeue  bool
	}{
		// Released: looked at again until the claims are gone.
		{name: "deleted node", released: true, requeue: true},
		{name: "unreachable past the grace period", node: notReady(10 * time.Minute), grace: 5 * time.Minute, released: true, requeue: true},
		{name: "unreachable within the grace period", node: notReady(time.Minute), grace: 5 * time.Minute, requeue: true},
		{name: "unreachable, no grace period set: only deletion counts", node: notReady(time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []client.Object{
				pinned("pv-leader", "a", "data-train-0", corev1.LabelHostname),
				pinned("pv-worker", "a", "data-train-0-1", consts.TopologyKey),
				pinned("pv-worker-2", "a", "data-train-0-2", consts.TopologyKey),
				pinned("pv-other", "a", "scratch", corev1.LabelHostname),
				pinned("pv-kept", "a", "data-train-1", corev1.LabelHostname),
				pinned("pv-elsewhere", "b", "data-train-2", corev1.LabelHostname),
				claim("data-train-0", "pv-leader", true, false), claim("data-train-0-1", "pv-worker", true, false),
				claim("data-train-0-2", "pv-worker-2", true, false), claim("scratch", "pv-other", false, false),
				claim("data-train-1", "pv-kept", true, true), claim("data-train-2", "pv-elsewhere", true, false),
				pod("train-0", "", "data-train-0"),                   // recreated, Pending: cannot be scheduled
				pod("train-0-1", "a", "data-train-0-1"),              // on the lost node
				terminating(pod("train-0-2", "a", "data-train-0-2")), // on the lost node, an eviction begun
				pod("train-2", "b", "data-train-2"),                  // elsewhere
				pod("user", "", "scratch"),
			}
			if tc.node != nil {
				objs = append(objs, tc.node)
			}
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			// The pods deleted, with their grace period (nil: the pod's own).
			deleted := map[string]*int64{}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
				Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
					if _, ok := obj.(*corev1.Pod); ok {
						o := (&client.DeleteOptions{}).ApplyOptions(opts)
						deleted[obj.GetName()] = o.GracePeriodSeconds
					}
					return c.Delete(ctx, obj, opts...)
				}}).Build()
			r := &Reconciler{Client: c, GracePeriod: tc.grace, Now: func() time.Time { return now }}
			res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: "a"}})
			if err != nil {
				t.Fatal(err)
			}
			if tc.requeue != (res.RequeueAfter > 0) {
				t.Errorf("requeue after %v", res.RequeueAfter)
			}
			if tc.released {
				// The claims are gone (the fake client has no pvc-protection finalizer): done.
				if res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: "a"}}); err != nil || res.RequeueAfter != 0 {
					t.Errorf("second pass: requeue after %v, error %v", res.RequeueAfter, err)
				}
			}
			gone := func(obj client.Object, name string) bool {
				return apierrors.IsNotFound(c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, obj))
			}
			for _, name := range []string{"data-train-0", "data-train-0-1", "data-train-0-2"} {
				if gone(&corev1.PersistentVolumeClaim{}, name) != tc.released {
					t.Errorf("claim %s released: %v, want %v", name, !tc.released, tc.released)
				}
			}
			for _, name := range []string{"train-0", "train-0-1"} {
				if gone(&corev1.Pod{}, name) != tc.released {
					t.Errorf("pod %s deleted: %v, want %v", name, !tc.released, tc.released)
				}
			}
			// The pods on the lost node go at once: no kubelet will confirm a graceful deletion,
			// not even of the one a taint eviction began (its finalizer keeps it in the fake).
			for _, name := range []string{"train-0-1", "train-0-2"} {
				if grace, ok := deleted[name]; ok != tc.released || ok && (grace == nil || *grace != 0) {
					t.Errorf("pod %s on the lost node: deleted %v with grace period %v, want deleted %v at once", name, ok, grace, tc.released)
				}
			}
			for _, name := range []string{"scratch", "data-train-1", "data-train-2"} {
				if gone(&corev1.PersistentVolumeClaim{}, name) {
					t.Errorf("claim %s released", name)
				}
			}
			for _, name := range []string{"train-2", "user"} {
				if gone(&corev1.Pod{}, name) {
					t.Errorf("pod %s deleted", name)
				}
			}
		})
	}
}

// A volume's claimRef is only its writer's word: volumes a node could forge — naming a claim of
// another namespace that is bound elsewhere, a claim made again under the name (another UID, or
// none named) that names the volume, or a volume of another driver — release no claim and no pod
// when their node is lost.
func TestForgedVolumesReleaseNothing(t *testing.T) {
	lwsClaim := func(ns, name, uid, volume string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid),
			Labels: map[string]string{v1alpha1.SetNameLabelKey: "train"}}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume}}
	}
	pending := func(ns, name, claim string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.SetNameLabelKey: "train"}},
			Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "data",
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	}
	forged := pinned("pv-forged", "a", "victim", corev1.LabelHostname)
	forged.Spec.ClaimRef.Namespace, forged.Spec.ClaimRef.UID = "team-b", "uid-victim"
	remade := pinned("pv-remade", "a", "remade", corev1.LabelHostname) // names uid-remade
	noUID := pinned("pv-no-uid", "a", "unnamed", corev1.LabelHostname)
	noUID.Spec.ClaimRef.UID = ""
	otherDriver := pinned("pv-other-driver", "a", "foreign", corev1.LabelHostname)
	otherDriver.Spec.CSI.Driver = "other.csi.dev"
	objs := []client.Object{
		forged, pinned("pv-victim", "b", "victim", corev1.LabelHostname), remade, noUID, otherDriver,
		lwsClaim("team-b", "victim", "uid-victim", "pv-victim"), pending("team-b", "victim-0", "victim"),
		lwsClaim("ns", "remade", "uid-remade-again", "pv-remade"), pending("ns", "remade-0", "remade"),
		lwsClaim("ns", "unnamed", "uid-unnamed", "pv-no-uid"), pending("ns", "unnamed-0", "unnamed"),
		lwsClaim("ns", "foreign", "uid-foreign", "pv-other-driver"), pending("ns", "foreign-0", "foreign"),
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	r := &Reconciler{Client: c}
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: "a"}})
	if err != nil || res.RequeueAfter != 0 {
		t.Fatalf("requeue after %v, error %v", res.RequeueAfter, err)
	}
	for _, key := range []types.NamespacedName{{Namespace: "team-b", Name: "victim"}, {Namespace: "ns", Name: "remade"},
		{Namespace: "ns", Name: "unnamed"}, {Namespace: "ns", Name: "foreign"}} {
		if err := c.Get(context.Background(), key, &corev1.PersistentVolumeClaim{}); err != nil {
			t.Errorf("claim %s: %v", key, err)
		}
		pod := types.NamespacedName{Namespace: key.Namespace, Name: key.Name + "-0"}
		if err := c.Get(context.Background(), pod, &corev1.Pod{}); err != nil {
			t.Errorf("pod %s: %v", pod, err)
		}
	}
}
