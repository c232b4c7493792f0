package workloads_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

// TestLeaderWorkerSetNodeLoss: a group whose claims are bound to volumes pinned to one node (as
// node-local volumes are) runs there; the node is deleted; the controller releases the group's
// claims, the StatefulSet controller makes the pods and claims again, the claims bind to volumes
// of the other node, and the group is Ready there — under the default whenDeleted: Retain, which
// without the release would bring the pods back to the dead node's claims and leave them Pending.
func TestLeaderWorkerSetNodeLoss(t *testing.T) {
	cp := setup(t)
	ns := framework.CreateNamespace(t, cp, "lws-nodeloss")
	ctx := testutil.Context(t)
	lost, spare := ns+"-lost", ns+"-spare"
	framework.CreateNode(t, cp, lost, nil)
	framework.CreateNode(t, cp, spare, nil)
	framework.FakeKubelet(t, cp.Client, fields.OneTermEqualSelector("metadata.namespace", ns), lost, spare)

	// Node-local volumes: required node affinity on one hostname. The lost node's are bound to
	// the group's claims by name; the spare node's come later.
	volume := func(name, node, claim string) *corev1.PersistentVolume {
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: "cistern.csi.dev", VolumeHandle: name}},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
			},
		}
		if claim != "" {
			pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: ns, Name: claim}
		}
		if err := cl.Create(ctx, pv); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Delete(testutil.Context(t), pv) })
		return pv
	}
	const name = "nl"
	claims := []string{"data-nl-0", "data-nl-0-1"}
	for _, c := range claims {
		volume(ns+"-lost-"+c, lost, c)
	}
	lws := newLWS(ns, name, 1, 2, withClaim("", ""))
	if err := cl.Create(ctx, lws); err != nil {
		t.Fatal(err)
	}
	onNode := func(node string) func() error {
		return func() error {
			var l v1alpha1.LeaderWorkerSet
			if err := cl.Get(ctx, client.ObjectKeyFromObject(lws), &l); err != nil {
				return err
			}
			if l.Status.ReadyReplicas != 1 {
				return fmt.Errorf("status %+v", l.Status)
			}
			pods := list(t, &corev1.PodList{}, ns, map[string]string{v1alpha1.SetNameLabelKey: name}).Items
			if len(pods) != 2 {
				return fmt.Errorf("%d pods", len(pods))
			}
			for _, p := range pods {
				if p.Spec.NodeName != node || p.DeletionTimestamp != nil {
					return fmt.Errorf("pod %s on %q (deleting %v), want %s", p.Name, p.Spec.NodeName, p.DeletionTimestamp != nil, node)
				}
			}
			for _, c := range claims {
				var pvc corev1.PersistentVolumeClaim
				if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: c}, &pvc); err != nil {
					return err
				}
				if pvc.Status.Phase != corev1.ClaimBound || !strings.HasPrefix(pvc.Spec.VolumeName, ns+"-"+nodeRole(node, lost)+"-") {
					return fmt.Errorf("claim %s %s on volume %q", c, pvc.Status.Phase, pvc.Spec.VolumeName)
				}
			}
			return nil
		}
	}
	testutil.Eventually(t, 2*time.Minute, "group Ready on the node of its volumes", onNode(lost))

	// The spare node's volumes wait for the group's claims by name (a claim made again gets a new
	// UID, which the lost node's volumes no longer match): an unbound volume of an earlier test of
	// the suite could otherwise take the new claims.
	for _, c := range claims {
		volume(ns+"-spare-"+c, spare, c)
	}
	if err := cp.Client.CoreV1().Nodes().Delete(ctx, lost, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 3*time.Minute, "group Ready again on the other node, with new claims", onNode(spare))
}

// nodeRole names the volumes of a node in this test.
func nodeRole(node, lost string) string {
	if node == lost {
		return "lost"
	}
	return "spare"
}
