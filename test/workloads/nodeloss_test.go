package workloads_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
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
		var ref *corev1.ObjectReference
		if claim != "" {
			ref = &corev1.ObjectReference{Namespace: ns, Name: claim}
		}
		return pinnedVolume(t, name, node, "cistern.csi.dev", ref)
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
	untouched := forgedVolumes(t, cp, ns, lost, spare)
	if err := cp.Client.CoreV1().Nodes().Delete(ctx, lost, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 3*time.Minute, "group Ready again on the other node, with new claims", onNode(spare))
	// The pass that released the group's claims went over every volume pinned to the lost node.
	untouched()
}

// forgedVolumes makes, pinned to the node about to be lost, volumes a compromised node could
// write (the node PersistentVolume policy lets it name any claim) beside the group's: one naming,
// with its UID, an LWS claim of another namespace that is bound to a volume on a live node; one
// naming with a stale UID a claim whose volumeName is that volume; one of another driver, bound
// to an LWS claim. Each claim has a Pending pod of its LeaderWorkerSet, which a release would
// delete. The function returned fails the test unless all claims and pods are as they were.
func forgedVolumes(t *testing.T, cp *framework.ControlPlane, ns, lost, live string) func() {
	ctx := testutil.Context(t)
	victimNS := framework.CreateNamespace(t, cp, "lws-nodeloss-victim")
	lwsLabels := map[string]string{v1alpha1.SetNameLabelKey: "victim"}
	claim := func(namespace, name, volume string) *corev1.PersistentVolumeClaim {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: lwsLabels},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(""), VolumeName: volume,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
		if err := cl.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		// Pending for good: no node has the label.
		// A group's leader, as the StatefulSet controller makes it (the pod webhook completes it).
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name + "-0",
			Labels:      map[string]string{v1alpha1.SetNameLabelKey: "victim", v1alpha1.WorkerIndexLabelKey: "0"},
			Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "1"}},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{"cistern.test/nowhere": "true"},
				Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/app:1"}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}}}}
		if err := cl.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		return pvc
	}
	driver := "cistern.csi.dev"
	victim := claim(victimNS, "victim", victimNS+"-live")
	pinnedVolume(t, victimNS+"-live", live, driver, &corev1.ObjectReference{Namespace: victimNS, Name: "victim"})
	pinnedVolume(t, victimNS+"-forged", lost, driver, &corev1.ObjectReference{Namespace: victimNS, Name: "victim", UID: victim.UID})
	claim(ns, "remade", ns+"-remade")
	pinnedVolume(t, ns+"-remade", lost, driver, &corev1.ObjectReference{Namespace: ns, Name: "remade", UID: "0b7c7a6e-0000-4000-8000-000000000000"})
	claim(ns, "foreign", ns+"-foreign")
	pinnedVolume(t, ns+"-foreign", lost, "other.csi.dev", &corev1.ObjectReference{Namespace: ns, Name: "foreign"})
	keys := []client.ObjectKey{{Namespace: victimNS, Name: "victim"}, {Namespace: ns, Name: "remade"}, {Namespace: ns, Name: "foreign"}}
	uids := map[client.ObjectKey]types.UID{}
	testutil.Eventually(t, time.Minute, "the victim claims bound to their live volumes", func() error {
		for _, k := range keys {
			var pvc corev1.PersistentVolumeClaim
			if err := cl.Get(ctx, k, &pvc); err != nil {
				return err
			}
			uids[k] = pvc.UID
			if want := corev1.ClaimBound; k.Name == "remade" {
				continue // its volume names another UID: it stays Pending
			} else if pvc.Status.Phase != want {
				return fmt.Errorf("claim %s %s", k, pvc.Status.Phase)
			}
		}
		return nil
	})
	return func() {
		t.Helper()
		for _, k := range keys {
			var pvc corev1.PersistentVolumeClaim
			if err := cl.Get(ctx, k, &pvc); err != nil || pvc.UID != uids[k] || pvc.DeletionTimestamp != nil {
				t.Errorf("claim %s released by a forged volume (deleting %v, error %v)", k, pvc.DeletionTimestamp != nil, err)
			}
			var pod corev1.Pod
			if err := cl.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: k.Name + "-0"}, &pod); err != nil || pod.DeletionTimestamp != nil {
				t.Errorf("pod of claim %s deleted by a forged volume (error %v)", k, err)
			}
		}
	}
}

// pinnedVolume creates a node-local volume of driver (required node affinity on node's
// hostname), bound to claim if not nil, reclaim Retain, deleted with the test.
func pinnedVolume(t *testing.T, name, node, driver string, claim *corev1.ObjectReference) *corev1.PersistentVolume {
	ctx := testutil.Context(t)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: name}},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      claim,
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		},
	}
	if err := cl.Create(ctx, pv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), pv) })
	return pv
}

// nodeRole names the volumes of a node in this test.
func nodeRole(node, lost string) string {
	if node == lost {
		return "lost"
	}
	return "spare"
}
