package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/startuptaint"
	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
)

// startupTaint: a node registered with the startup taint gets the node DaemonSet's pod (it
// tolerates the taint) and keeps other pods off; the node plugin started there with
// --remove-startup-taint, under a token bound to that pod, removes that taint and no other, and
// the waiting pod is scheduled. deploy/csi's cistern-node-startup-taint policy refuses the same
// ServiceAccount the startup taint of another node, any other change to its own Node, and a
// token bound to no node; a patch from a stale read is a Conflict.
func (p *policyScenario) startupTaint(t *testing.T) {
	c := ctx(t)
	nodeC := "policy-node-c"
	startup := corev1.Taint{Key: consts.StartupTaintKey, Effect: corev1.TaintEffectNoExecute}
	dedicated := corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule}
	framework.CreateNode(t, p.cp, nodeC, nil, startup, dedicated)
	asC := kubernetes.NewForConfigOrDie(framework.PodServiceAccountConfig(t, p.cp, cluster.DaemonSetPod(t, p.cp, nodeC)))
	// Node C's taints but kube-controller-manager's own (node.kubernetes.io/...).
	taintsOfC := func() []corev1.Taint {
		t.Helper()
		n, err := p.cp.Client.CoreV1().Nodes().Get(ctx(t), nodeC, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return strings.HasPrefix(t.Key, "node.kubernetes.io/") })
	}

	// Node A carries the startup taint too (NoSchedule: its pods stay). Node C's plugin may not
	// remove it; the policy takes effect once the API server's informers have seen it.
	setTaints(t, p.cp.Client, p.nodeA, corev1.Taint{Key: consts.StartupTaintKey, Effect: corev1.TaintEffectNoSchedule})
	t.Cleanup(func() { setTaints(t, p.cp.Client, p.nodeA) })
	var err error
	eventually(t, time.Minute, "another node's startup taint kept", func(ctx context.Context) error {
		removed, rerr := startuptaint.Remove(ctx, asC.CoreV1().Nodes(), p.nodeA)
		if removed {
			setTaints(t, p.cp.Client, p.nodeA, corev1.Taint{Key: consts.StartupTaintKey, Effect: corev1.TaintEffectNoSchedule})
			return errorf("removed")
		}
		err = rerr
		return nil
	})
	refused(t, err, "may only remove the startup taint from that node")
	_, err = startuptaint.Remove(c, p.unbound.CoreV1().Nodes(), nodeC)
	refused(t, err, "not bound to a pod on a node")

	// Its own Node: nothing but the startup taint going. (Indexes as they are now:
	// kube-controller-manager may have put taints of its own first.)
	current, err := p.cp.Client.CoreV1().Nodes().Get(c, nodeC, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	indexOf := func(key string) string {
		return strconv.Itoa(slices.IndexFunc(current.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key }))
	}
	for _, tc := range []struct {
		name, patch string
		typ         types.PatchType
		want        string
	}{
		{"label", `{"metadata":{"labels":{"taken":"yes"}}}`, types.MergePatchType, "may not change its Node's labels, annotations"},
		{"annotation", `{"metadata":{"annotations":{"taken":"yes"}}}`, types.MergePatchType, "may not change its Node's labels, annotations"},
		{"cordon", `{"spec":{"unschedulable":true}}`, types.MergePatchType, "may not change its Node's spec"},
		{"provider", `{"spec":{"providerID":"fake://elsewhere"}}`, types.MergePatchType, "may not change its Node's spec"},
		{"another taint removed", `[{"op":"remove","path":"/spec/taints/` + indexOf(dedicated.Key) + `"}]`, types.JSONPatchType, "no other taint"},
		{"a taint added", `[{"op":"add","path":"/spec/taints/-","value":{"key":"x","effect":"NoSchedule"}}]`, types.JSONPatchType, "no other taint"},
		{"startup taint removed with a label", `[{"op":"remove","path":"/spec/taints/` + indexOf(consts.StartupTaintKey) + `"},{"op":"add","path":"/metadata/labels/taken","value":"yes"}]`,
			types.JSONPatchType, "may not change its Node's labels, annotations"},
	} {
		_, err := asC.CoreV1().Nodes().Patch(c, nodeC, tc.typ, []byte(tc.patch), metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: want a refusal naming %q, got %v", tc.name, tc.want, err)
		} else {
			refused(t, err, tc.want)
		}
	}
	if got := taintsOfC(); !slices.EqualFunc(got, []corev1.Taint{startup, dedicated}, sameTaint) {
		t.Fatalf("node %s's taints after refused patches: %v", nodeC, got)
	}

	// A patch made from a stale read is a Conflict (the resourceVersion it carries), which
	// startuptaint.Remove reads again after.
	stale, err := p.cp.Client.CoreV1().Nodes().Get(c, nodeC, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.cp.Client.CoreV1().Nodes().Patch(c, nodeC, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"example.com/touched":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	patch, _ := startuptaint.Patch(stale)
	if _, err := asC.CoreV1().Nodes().Patch(c, nodeC, types.JSONPatchType, patch, metav1.PatchOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("a removal patch from a stale read: want a Conflict, got %v", err)
	}

	// A pod for node C, tolerating every taint there but the startup taint, is not scheduled
	// while that taint is there.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "wants-node-c", Namespace: p.ns}, Spec: corev1.PodSpec{
		NodeSelector: map[string]string{corev1.LabelHostname: nodeC},
		Tolerations: []corev1.Toleration{{Key: dedicated.Key, Operator: corev1.TolerationOpExists},
			{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists}},
		Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}},
	}}
	if _, err := p.cp.Client.CoreV1().Pods(p.ns).Create(c, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cp.Client.CoreV1().Pods(p.ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	eventually(t, time.Minute, "pod "+pod.Name+" found unschedulable", func(ctx context.Context) error {
		got, err := p.cp.Client.CoreV1().Pods(p.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Spec.NodeName != "" {
			t.Fatalf("pod scheduled to %s past the startup taint", got.Spec.NodeName)
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				return nil
			}
		}
		return errorf("not tried yet")
	})

	// The node plugin, as the DaemonSet runs it: once it serves (and the CSINode, which
	// framework.CreateNode made as node-driver-registrar would, lists it) the taint goes.
	p.startTaintRemovingDriver(t, nodeC)
	eventually(t, time.Minute, "startup taint removed from "+nodeC, func(context.Context) error {
		if got := taintsOfC(); !slices.EqualFunc(got, []corev1.Taint{dedicated}, sameTaint) {
			return errorf("taints %v", got)
		}
		return nil
	})
	if got := scheduledNode(t, p.cp.Client, p.ns, pod.Name); got != nodeC {
		t.Fatalf("pod scheduled to %s, want %s", got, nodeC)
	}
	n, err := p.cp.Client.CoreV1().Nodes().Get(c, p.nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == consts.StartupTaintKey }) {
		t.Errorf("node %s lost its startup taint: %v", p.nodeA, n.Spec.Taints)
	}
}

// startTaintRemovingDriver runs the node plugin for node with --remove-startup-taint and no
// pools, under a token bound to the node DaemonSet's pod there.
func (p *policyScenario) startTaintRemovingDriver(t *testing.T, node string) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(pools, []byte("pools: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := framework.StartCSIDriver(t, node+"-csi-driver", binaries(t).Driver, filepath.Join(dir, "csi.sock"),
		"--node-id="+node, "--mode=node", "--pools-config="+pools,
		"--state-dir="+filepath.Join(dir, "state"), "--writeback-dir=", "--kubelet-root="+filepath.Join(dir, "kubelet"),
		"--kubeconfig="+framework.PodServiceAccountKubeconfig(t, p.cp, cluster.DaemonSetPod(t, p.cp, node)),
		"--remove-startup-taint", "--v=3")
	t.Cleanup(d.Stop)
}

// setTaints sets node's taints as an administrator would.
func setTaints(t *testing.T, c kubernetes.Interface, node string, taints ...corev1.Taint) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = taints
		_, err = c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("tainting node %s: %v", node, err)
	}
}

// sameTaint compares taints by what they say (the API server stamps NoExecute ones with the
// time they were added).
func sameTaint(a, b corev1.Taint) bool {
	return a.Key == b.Key && a.Value == b.Value && a.Effect == b.Effect
}
