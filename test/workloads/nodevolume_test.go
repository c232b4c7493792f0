package workloads_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

// TestNodePersistentVolumeWebhook: the controller's webhook admits a node plugin's new
// PersistentVolume (a token bound to a pod scheduled to the node, as kubelet projects it) only as
// its provisioner makes it — for a claim, named with its UID, of the volume's Cistern class, not
// bound, selected for that node, naming exactly the Secrets the class names for that claim — and
// never lets an update bind a volume to another claim. The node PersistentVolume policy, which
// sees only the volume, let a node name any claim of a pod on it and any Secret of that claim's
// namespace, which the Node authorizer then handed it.
func TestNodePersistentVolumeWebhook(t *testing.T) {
	cp, ns, ctx := setupNamespace(t, "nodevolume")
	victimNS := framework.CreateNamespace(t, cp, "nodevolume-victim")
	mine, theirs := ns+"-a", ns+"-b"
	framework.CreateNode(t, cp, mine, nil)
	framework.CreateNode(t, cp, theirs, nil)
	asNode := kubernetes.NewForConfigOrDie(framework.PodServiceAccountConfig(t, cp, nodePluginPod(t, mine)))
	unbound := kubernetes.NewForConfigOrDie(framework.ServiceAccountConfig(t, cp, testutil.ControllerNamespace, "cistern-node"))

	dataset, other := ns+"-dataset", ns+"-other"
	storageClass(t, dataset, consts.DriverName, map[string]string{
		"csi.storage.k8s.io/node-stage-secret-name": "creds", "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}"})
	storageClass(t, other, "example.com/other", nil)
	claim := func(namespace, name, class, node, volume string) *corev1.PersistentVolumeClaim {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(class), VolumeName: volume,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
		if node != "" {
			pvc.Annotations = map[string]string{"volume.kubernetes.io/selected-node": node}
		}
		if err := cl.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		return pvc
	}
	ours := claim(ns, "ours", dataset, mine, "")
	forTheirs := claim(ns, "theirs", dataset, theirs, "")
	bound := claim(ns, "bound", dataset, mine, "elsewhere")
	foreign := claim(ns, "foreign", other, mine, "")
	missingClass := claim(ns, "missing-class", ns+"-missing", mine, "")
	victim := claim(victimNS, "victim", dataset, "", victimNS+"-live")

	// The volume the provisioner of node mine makes for pvc.
	volume := func(name string, pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:         corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: *pvc.Spec.StorageClassName,
				ClaimRef: &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim",
					Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: consts.DriverName, VolumeHandle: "fast-" + name,
					NodeStageSecretRef: &corev1.SecretReference{Name: "creds", Namespace: pvc.Namespace}}},
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: consts.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{mine}}}}}}},
			},
		}
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	create := func(c kubernetes.Interface, pv *corev1.PersistentVolume) error {
		_, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, dry)
		return err
	}
	// The webhook takes effect once the controller has registered it (at its start).
	testutil.Eventually(t, time.Minute, "a node's volume for another node's claim refused", func() error {
		if create(asNode, volume("theirs", forTheirs)) == nil {
			return fmt.Errorf("created")
		}
		return nil
	})
	if err := create(asNode, volume("ours", ours)); err != nil {
		t.Fatalf("the volume the provisioner makes for a claim of its node: %v", err)
	}

	for _, tc := range []struct {
		name string
		pv   *corev1.PersistentVolume
		want string
	}{
		{"another node's claim", volume("theirs", forTheirs), "is for node " + `"` + theirs + `"`},
		{"a claim of another namespace bound elsewhere", volume("victim", victim), "is bound to volume " + victimNS + "-live"},
		{"a bound claim", volume("bound", bound), "is bound to volume elsewhere"},
		{"a claim of another driver's class", volume("foreign", foreign), "is provisioned by example.com/other"},
		{"a class that does not exist", volume("missing-class", missingClass), "does not exist"},
		{"a claim of another class than the volume's", func() *corev1.PersistentVolume {
			pv := volume("foreign-as-ours", foreign)
			pv.Spec.StorageClassName = dataset
			return pv
		}(), "is not of the volume's StorageClass"},
		{"a claim made again under the name", func() *corev1.PersistentVolume {
			pv := volume("stale", ours)
			pv.Spec.ClaimRef.UID = types.UID("0b7c7a6e-0000-4000-8000-000000000000")
			return pv
		}(), "not 0b7c7a6e"},
		{"a claim named without its UID", func() *corev1.PersistentVolume {
			pv := volume("no-uid", ours)
			pv.Spec.ClaimRef.UID = ""
			return pv
		}(), "names its claim (claimRef namespace, name and uid)"},
		{"a claim that does not exist", func() *corev1.PersistentVolume {
			pv := volume("gone", ours)
			pv.Spec.ClaimRef.Name = "gone"
			return pv
		}(), "does not exist"},
		{"another Secret of the claim's namespace", func() *corev1.PersistentVolume {
			pv := volume("other-secret", ours)
			pv.Spec.CSI.NodeStageSecretRef.Name = "database"
			return pv
		}(), "names Secrets"},
		{"a Secret the class does not name", func() *corev1.PersistentVolume {
			pv := volume("publish-secret", ours)
			pv.Spec.CSI.NodePublishSecretRef = &corev1.SecretReference{Name: "creds", Namespace: ns}
			return pv
		}(), "names Secrets"},
	} {
		if err := create(asNode, tc.pv); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want a refusal naming %q, got %v", tc.name, tc.want, err)
		}
	}
	if err := create(unbound, volume("ours", ours)); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not bound to a pod on a node") {
		t.Errorf("a token bound to no pod: want a refusal, got %v", err)
	}
	// The webhook hears only node plugins: the administrator still writes any volume.
	if err := create(cp.Client, volume("victim", victim)); err != nil {
		t.Errorf("the administrator's volume: %v", err)
	}

	// Updates keep the claim: a finalizer removed, as the provisioner does; never another claim.
	pv, err := asNode.CoreV1().PersistentVolumes().Create(ctx, volume("kept", ours), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), pv) })
	// RBAC grants the node patch, as the provisioner removes its finalizer.
	patch := func(body string) error {
		_, err := asNode.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, []byte(body),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := patch(`{"spec":{"claimRef":{"namespace":"` + victimNS + `","name":"victim","uid":"` + string(victim.UID) + `"}}}`); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "may not bind a PersistentVolume to another claim") {
		t.Errorf("rebinding a volume to another claim: want a refusal, got %v", err)
	}
	if err := patch(`{"metadata":{"labels":{"released":"yes"}}}`); err != nil {
		t.Errorf("an update that keeps the claim: %v", err)
	}
}

// nodePluginPod is a pod of the node plugin's ServiceAccount bound to node, whose token the API
// server marks with the node's name.
func nodePluginPod(t *testing.T, node string) *corev1.Pod {
	ctx := testutil.Context(t)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: testutil.ControllerNamespace, GenerateName: "cistern-node-"},
		Spec: corev1.PodSpec{ServiceAccountName: "cistern-node", NodeName: node,
			Containers: []corev1.Container{{Name: "driver", Image: "registry.invalid/node:1"}}}}
	if err := cl.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
	return pod
}

func storageClass(t *testing.T, name, provisioner string, params map[string]string) {
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, Parameters: params,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}
	if err := cl.Create(testutil.Context(t), sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), sc) })
}
