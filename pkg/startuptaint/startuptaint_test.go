package startuptaint

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cistern-csi/cistern/pkg/consts"
)

var (
	startup    = corev1.Taint{Key: Key, Effect: corev1.TaintEffectNoExecute}
	startupNS  = corev1.Taint{Key: Key, Effect: corev1.TaintEffectNoSchedule}
	notReady   = corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}
	dedicated  = corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule}
	nodeGVR    = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	nodeName   = "n1"
	anotherOne = "n2"
)

func node(name string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "7"}, Spec: corev1.NodeSpec{Taints: taints}}
}

func TestPatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		taints []corev1.Taint
		want   string
	}{
		{"no taints", nil, ""},
		{"other taints only", []corev1.Taint{notReady, dedicated}, ""},
		{"the startup taint alone", []corev1.Taint{startup},
			`[{"op":"replace","path":"/metadata/resourceVersion","value":"7"},{"op":"remove","path":"/spec/taints/0"}]`},
		{"both effects among others, last index first", []corev1.Taint{notReady, startupNS, dedicated, startup},
			`[{"op":"replace","path":"/metadata/resourceVersion","value":"7"},{"op":"remove","path":"/spec/taints/3"},{"op":"remove","path":"/spec/taints/1"}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Patch(node(nodeName, tc.taints...))
			if ok != (tc.want != "") || string(got) != tc.want {
				t.Fatalf("Patch = %s, %v; want %s", got, ok, tc.want)
			}
		})
	}
}

// taintsOf reads node's taints from the fake clientset.
func taintsOf(t *testing.T, c *fake.Clientset, name string) []corev1.Taint {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.Taints
}

// TestRemoveRetriesConflicts: a Node changed between the read and the patch (the API server's
// 409) is read again and patched again; only the startup taint goes, from that node only.
func TestRemoveRetriesConflicts(t *testing.T) {
	c := fake.NewClientset(node(nodeName, notReady, startup, dedicated), node(anotherOne, startup))
	conflicts, patches, gets := 2, 0, 0
	c.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets++
		return false, nil, nil
	})
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		patches++
		if name := a.(k8stesting.PatchAction).GetName(); name != nodeName {
			t.Errorf("patched node %s", name)
		}
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(nodeGVR.GroupResource(), nodeName, errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
	removed, err := Remove(context.Background(), c.CoreV1().Nodes(), nodeName)
	if err != nil || !removed {
		t.Fatalf("Remove = %v, %v; want true, nil", removed, err)
	}
	if gets != 3 || patches != 3 {
		t.Errorf("%d reads and %d patches; want 3 of each (two conflicts, then the patch that applies)", gets, patches)
	}
	if got, want := taintsOf(t, c, nodeName), []corev1.Taint{notReady, dedicated}; !slices.Equal(got, want) {
		t.Errorf("taints %v; want %v", got, want)
	}
	if got := taintsOf(t, c, anotherOne); !slices.Equal(got, []corev1.Taint{startup}) {
		t.Errorf("node %s's taints %v: another node was changed", anotherOne, got)
	}

	// Again: nothing to remove, nothing patched.
	patches = 0
	if removed, err := Remove(context.Background(), c.CoreV1().Nodes(), nodeName); err != nil || removed || patches != 0 {
		t.Fatalf("second Remove = %v, %v with %d patches; want false, nil, 0", removed, err, patches)
	}
}

// TestRemoveGivesUpOnOtherErrors: a refusal is not retried by Remove (Run retries it with
// backoff, and logs it) and leaves the taint.
func TestRemoveGivesUpOnOtherErrors(t *testing.T) {
	c := fake.NewClientset(node(nodeName, startup))
	patches := 0
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		patches++
		return true, nil, apierrors.NewForbidden(nodeGVR.GroupResource(), nodeName, errors.New("denied by policy"))
	})
	removed, err := Remove(context.Background(), c.CoreV1().Nodes(), nodeName)
	if !apierrors.IsForbidden(err) || removed || patches != 1 {
		t.Fatalf("Remove = %v, %v after %d patches; want false, Forbidden, 1", removed, err, patches)
	}
	if got := taintsOf(t, c, nodeName); !slices.Equal(got, []corev1.Taint{startup}) {
		t.Errorf("taints %v; want the startup taint kept", got)
	}
}

// TestRunWaitsForRegistration: Run patches nothing before the driver listens and is listed in
// the node's CSINode, then removes the taint.
func TestRunWaitsForRegistration(t *testing.T) {
	defer func(d time.Duration) { registrationPoll = d }(registrationPoll)
	registrationPoll = time.Millisecond
	c := fake.NewClientset(node(nodeName, startup),
		&storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	registered := make(chan struct{})
	csiNodeReads := 0
	c.PrependReactor("get", "csinodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		// kubelet registers the driver after the plugin's second read of the CSINode.
		if csiNodeReads++; csiNodeReads == 2 {
			close(registered)
		}
		if csiNodeReads <= 2 {
			return true, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, nil
		}
		return true, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
			Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: "other.csi.dev"}, {Name: consts.DriverName}}}}, nil
	})
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		select {
		case <-registered:
		default:
			t.Error("patched before the driver was registered")
		}
		return false, nil, nil
	})
	ready := make(chan struct{})
	close(ready)
	if err := Run(context.Background(), c, nodeName, consts.DriverName, ready); err != nil {
		t.Fatal(err)
	}
	if csiNodeReads != 3 {
		t.Errorf("%d reads of the CSINode; want 3", csiNodeReads)
	}
	if got := taintsOf(t, c, nodeName); len(got) != 0 {
		t.Errorf("taints %v; want none", got)
	}
}

// TestRunStopsUnready: a plugin that never listens patches nothing and returns with its context.
func TestRunStopsUnready(t *testing.T) {
	c := fake.NewClientset(node(nodeName, startup))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Run(ctx, c, nodeName, consts.DriverName, make(chan struct{})); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v; want context.Canceled", err)
	}
	for _, a := range c.Actions() {
		t.Errorf("unexpected %s %s", a.GetVerb(), a.GetResource().Resource)
	}
}
