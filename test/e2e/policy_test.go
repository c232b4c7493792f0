package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	nbv1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/poolpublisher"
	"github.com/cistern-csi/cistern/pkg/workloads/lws"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook"
	"github.com/cistern-csi/cistern/pkg/workloads/volumemanager"
	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
)

// TestNodeAdmissionPolicies: what deploy/csi's ValidatingAdmissionPolicies let a node plugin do
// with PersistentVolumes, StoragePools and its Node's startup taint, by real requests to the API
// server under tokens bound to the node DaemonSet's pods, as kubelet projects them (the API
// server names the pod's node in them). RBAC grants each cluster-wide; the policies hold each
// node to its own.
func TestNodeAdmissionPolicies(t *testing.T) {
	cp := framework.Shared(t)
	cluster.CreateNamespace(t, cp)
	cluster.ForgetWebhooks(t, cp)
	cluster.Install(t, cp)
	// No controller serves deploy/csi's webhooks here, and the one on node plugins'
	// PersistentVolumes fails closed: this test is the policies'. The webhook, which reads the
	// claim a node's volume names, is TestNodePersistentVolumeWebhook's (test/workloads) and
	// every provisioning of TestE2E's.
	cluster.ForgetWebhooks(t, cp)
	nodeA, nodeB := "policy-node-a", "policy-node-b"
	framework.CreateNode(t, cp, nodeA, nil)
	framework.CreateNode(t, cp, nodeB, nil)
	p := &policyScenario{
		cp:      cp,
		nodeA:   nodeA,
		nodeB:   nodeB,
		asNode:  kubernetes.NewForConfigOrDie(framework.PodServiceAccountConfig(t, cp, cluster.DaemonSetPod(t, cp, nodeA))),
		unbound: kubernetes.NewForConfigOrDie(framework.ServiceAccountConfig(t, cp, cluster.Namespace, cluster.NodeServiceAccount)),
		ns:      framework.CreateNamespace(t, cp, "policy"),
	}
	p.classes(t)
	// Pods are refused until kube-controller-manager has made the namespace's ServiceAccount.
	eventually(t, time.Minute, "ServiceAccount default in "+p.ns, func(ctx context.Context) error {
		_, err := cp.Client.CoreV1().ServiceAccounts(p.ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	t.Run("PersistentVolumesOfOwnNode", p.pvNode)
	t.Run("PersistentVolumeSecretsAndClaims", p.pvSecrets)
	t.Run("ReleaseAfterSecretGrantRevoked", p.releaseAfterRevocation)
	t.Run("ClaimsOfOwnNode", p.claims)
	t.Run("StoragePoolsOfOwnNode", p.storagePools)
	t.Run("StartupTaintOfOwnNode", p.startupTaint)
	t.Run("WorkloadControllerWrites", p.controllerWrites)
	t.Run("WorkloadControllerStatefulSets", p.controllerStatefulSets)
}

type policyScenario struct {
	cp              *framework.ControlPlane
	nodeA, nodeB    string
	asNode, unbound kubernetes.Interface
	ns              string
}

const (
	policyClass          = "cistern-policy"
	policyImmediateClass = "cistern-policy-immediate"
	policyOtherClass     = "other-policy"
)

// classes creates Cistern StorageClasses (WaitForFirstConsumer and Immediate) and one of another
// provisioner.
func (p *policyScenario) classes(t *testing.T) {
	for name, provisioner := range map[string]string{policyClass: consts.DriverName, policyImmediateClass: consts.DriverName,
		policyOtherClass: "example.com/other"} {
		mode := storagev1.VolumeBindingWaitForFirstConsumer
		if name == policyImmediateClass {
			mode = storagev1.VolumeBindingImmediate
		}
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner,
			VolumeBindingMode: ptr.To(mode)}
		if _, err := p.cp.Client.StorageV1().StorageClasses().Create(ctx(t), sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = p.cp.Client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
}

func (p *policyScenario) pvs(c kubernetes.Interface) typedcorev1.PersistentVolumeInterface {
	return c.CoreV1().PersistentVolumes()
}

// refused fails unless err is the API server's refusal naming want.
func refused(t *testing.T, err error, want string) {
	t.Helper()
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(fmt.Sprint(err), want) {
		t.Fatalf("want a refusal naming %q, got %v", want, err)
	}
}

// pvNode: RBAC lets the node ServiceAccount create and delete PersistentVolumes (the provisioner
// in node-deployment mode must); the policy holds each node's plugin to Cistern PersistentVolumes
// pinned to its own node.
func (p *policyScenario) pvNode(t *testing.T) {
	c := ctx(t)
	own := p.policyPV("policy-own", p.nodeA)
	// The policies take effect once the API server's informers have seen them.
	eventually(t, time.Minute, "another node's PersistentVolume refused", func(ctx context.Context) error {
		pv, err := p.pvs(p.asNode).Create(ctx, p.policyPV("policy-other", p.nodeB), metav1.CreateOptions{})
		if err == nil {
			_ = p.pvs(p.cp.Client).Delete(ctx, pv.Name, metav1.DeleteOptions{})
			return errorf("created")
		}
		return nil
	})
	if _, err := p.pvs(p.asNode).Create(c, own, metav1.CreateOptions{}); err != nil {
		t.Fatalf("node %s creating its own PersistentVolume: %v", p.nodeA, err)
	}
	if err := p.pvs(p.asNode).Delete(c, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("node %s deleting its own PersistentVolume: %v", p.nodeA, err)
	}
	_, err := p.pvs(p.asNode).Create(c, p.policyPV("policy-other", p.nodeB), metav1.CreateOptions{})
	refused(t, err, "may only manage PersistentVolumes pinned to that node")
	both := p.policyPV("policy-both", p.nodeA)
	both.Spec.NodeAffinity.Required.NodeSelectorTerms = append(both.Spec.NodeAffinity.Required.NodeSelectorTerms,
		p.policyPV("", p.nodeB).Spec.NodeAffinity.Required.NodeSelectorTerms...)
	_, err = p.pvs(p.asNode).Create(c, both, metav1.CreateOptions{})
	refused(t, err, "may only manage PersistentVolumes pinned to that node")
	hostPath := p.policyPV("policy-hostpath", p.nodeA)
	hostPath.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}
	_, err = p.pvs(p.asNode).Create(c, hostPath, metav1.CreateOptions{})
	refused(t, err, "only manage PersistentVolumes of cistern.csi.dev")
	_, err = p.pvs(p.unbound).Create(c, p.policyPV("policy-unbound", p.nodeA), metav1.CreateOptions{})
	refused(t, err, "not bound to a pod on a node")

	// Another node's volume: neither deleted nor moved.
	theirs, err := p.pvs(p.cp.Client).Create(c, p.policyPV("policy-theirs", p.nodeB), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.pvs(p.cp.Client).Delete(context.Background(), theirs.Name, metav1.DeleteOptions{}) })
	refused(t, p.pvs(p.asNode).Delete(c, theirs.Name, metav1.DeleteOptions{}), "may only manage PersistentVolumes pinned to that node")
	_, err = p.pvs(p.asNode).Patch(c, theirs.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"taken":"yes"}}}`), metav1.PatchOptions{})
	refused(t, err, "may only manage PersistentVolumes pinned to that node")
}

// pvSecrets: a node cannot make a PersistentVolume that lets the Node authorizer hand it a
// Secret of another namespace (the volume bound to a claim of a pod on the node), nor one bound
// to a claim of another driver's class, nor one with no claim, nor a VolumeManager's volume.
// The volumes the provisioner really writes (Secrets of the claim's namespace, or of a namespace
// the administrator lists) are still accepted.
func (p *policyScenario) pvSecrets(t *testing.T) {
	c := ctx(t)
	ref := func(ns string) *corev1.SecretReference { return &corev1.SecretReference{Name: "s3", Namespace: ns} }
	create := func(pv *corev1.PersistentVolume) error {
		_, err := p.pvs(p.asNode).Create(c, pv, metav1.CreateOptions{})
		if err == nil {
			t.Cleanup(func() { _ = p.pvs(p.cp.Client).Delete(context.Background(), pv.Name, metav1.DeleteOptions{}) })
		}
		return err
	}

	// Accepted: the claim's own namespace, for every reference a CSI PersistentVolume has.
	legit := p.policyPV("policy-secrets-claim-ns", p.nodeA)
	legit.Spec.CSI.NodeStageSecretRef = ref(p.ns)
	legit.Spec.CSI.NodePublishSecretRef = ref(p.ns)
	legit.Spec.CSI.NodeExpandSecretRef = ref(p.ns)
	legit.Spec.CSI.ControllerPublishSecretRef = ref(p.ns)
	legit.Spec.CSI.ControllerExpandSecretRef = ref(p.ns)
	if err := create(legit); err != nil {
		t.Fatalf("a volume naming Secrets of its claim's namespace: %v", err)
	}

	// The attack: a claim of a pod on this node, and a Secret anywhere.
	for _, field := range []string{"nodeStage", "nodePublish", "nodeExpand", "controllerPublish", "controllerExpand"} {
		pv := p.policyPV("policy-secrets-"+strings.ToLower(field), p.nodeA)
		r := ref("kube-system")
		switch field {
		case "nodeStage":
			pv.Spec.CSI.NodeStageSecretRef = r
		case "nodePublish":
			pv.Spec.CSI.NodePublishSecretRef = r
		case "nodeExpand":
			pv.Spec.CSI.NodeExpandSecretRef = r
		case "controllerPublish":
			pv.Spec.CSI.ControllerPublishSecretRef = r
		case "controllerExpand":
			pv.Spec.CSI.ControllerExpandSecretRef = r
		}
		refused(t, create(pv), "may only name Secrets of the claim namespace "+p.ns)
	}
	// Nor by binding an accepted volume to a claim of another namespace (its Secret references
	// are immutable).
	_, err := p.pvs(p.asNode).Patch(c, legit.Name, types.MergePatchType,
		[]byte(`{"spec":{"claimRef":{"namespace":"kube-system"}}}`), metav1.PatchOptions{})
	refused(t, err, "may only name Secrets of the claim namespace kube-system")

	noClaim := p.policyPV("policy-no-claim", p.nodeA)
	noClaim.Spec.ClaimRef = nil
	refused(t, create(noClaim), "bound (claimRef) to a claim of a StorageClass")
	noClass := p.policyPV("policy-no-class", p.nodeA)
	noClass.Spec.StorageClassName = ""
	refused(t, create(noClass), "bound (claimRef) to a claim of a StorageClass")
	otherClass := p.policyPV("policy-other-class", p.nodeA)
	otherClass.Spec.StorageClassName = policyOtherClass
	refused(t, create(otherClass), "only write PersistentVolumes of a Cistern StorageClass")
	vm := p.policyPV("policy-vm", p.nodeA)
	vm.Spec.CSI.VolumeHandle = consts.VolumeManagerHandlePrefix + "0123456789abcdef"
	refused(t, create(vm), "VolumeManager")

	// The administrator's grant: a class whose Secret lives in one namespace for every claim.
	const adminNS = "policy-admin-secrets"
	admin := p.policyPV("policy-secrets-admin-ns", p.nodeA)
	admin.Spec.CSI.NodeStageSecretRef = ref(adminNS)
	refused(t, create(admin), "may only name Secrets of the claim namespace")
	p.grantSecretReferences(t, adminNS)
	eventually(t, time.Minute, "a Secret of a granted namespace accepted", func(context.Context) error {
		return create(admin)
	})
}

// grantSecretReferences lets the node ServiceAccount name Secrets of ns in its volumes, as an
// administrator does (deploy/csi/driver/node-pv-policy.yaml), and returns the revocation.
func (p *policyScenario) grantSecretReferences(t *testing.T, ns string) (revoke func()) {
	t.Helper()
	c := ctx(t)
	if _, err := p.cp.Client.CoreV1().Namespaces().Create(c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "cistern-node-secret-references", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"cistern.csi.dev"}, Resources: []string{"secretreferences"}, Verbs: []string{"use"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: cluster.Namespace, Name: cluster.NodeServiceAccount}}}
	rbac := p.cp.Client.RbacV1()
	if _, err := rbac.Roles(ns).Create(c, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(c, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	revoke = func() {
		_ = rbac.RoleBindings(ns).Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
		_ = rbac.Roles(ns).Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	}
	t.Cleanup(revoke)
	return revoke
}

// releaseAfterRevocation: Secret references are checked when a volume is created (or its claim
// moves), never when it is released. With the administrator's grant revoked (or with nothing the
// policy reads at all: it has no parameter, whose absence would refuse every request it matches),
// a node still deletes its volumes and removes their finalizers, even a volume naming a Secret
// of the once-granted namespace; only new volumes naming such Secrets are refused.
func (p *policyScenario) releaseAfterRevocation(t *testing.T) {
	c := ctx(t)
	const adminNS = "policy-release-secrets"
	ref := func(ns string) *corev1.SecretReference { return &corev1.SecretReference{Name: "s3", Namespace: ns} }
	revoke := p.grantSecretReferences(t, adminNS)
	// A volume as the provisioner leaves it: a Secret of the granted namespace, its finalizer.
	pv := p.policyPV("policy-release-admin-ns", p.nodeA)
	pv.Finalizers = []string{"external-provisioner.volume.kubernetes.io/finalizer"}
	pv.Spec.CSI.NodeStageSecretRef = ref(adminNS)
	eventually(t, time.Minute, "a Secret of a granted namespace accepted", func(ctx context.Context) error {
		_, err := p.pvs(p.asNode).Create(ctx, pv, metav1.CreateOptions{})
		return err
	})
	t.Cleanup(func() {
		_, _ = p.pvs(p.cp.Client).Patch(context.Background(), pv.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		_ = p.pvs(p.cp.Client).Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})

	revoke()
	refusedElsewhere := p.policyPV("policy-release-refused", p.nodeA)
	refusedElsewhere.Spec.CSI.NodeStageSecretRef = ref(adminNS)
	eventually(t, time.Minute, "a Secret of a no longer granted namespace refused", func(ctx context.Context) error {
		created, err := p.pvs(p.asNode).Create(ctx, refusedElsewhere, metav1.CreateOptions{})
		if err == nil {
			_ = p.pvs(p.cp.Client).Delete(ctx, created.Name, metav1.DeleteOptions{})
			return errorf("created")
		}
		refused(t, err, "may only name Secrets of the claim namespace")
		return nil
	})
	// Release: delete (the finalizer holds it), then the finalizer removed, as the provisioner does.
	if err := p.pvs(p.asNode).Delete(c, pv.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("node %s deleting its volume after the grant was revoked: %v", p.nodeA, err)
	}
	// RBAC grants the node patch, as the provisioner removes its finalizer; the controller
	// manager removes its own meanwhile, so the patch is made against a fresh read.
	eventually(t, time.Minute, "the finalizer removed by the node", func(ctx context.Context) error {
		current, err := p.pvs(p.cp.Client).Get(ctx, pv.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		rest, err := json.Marshal(slices.DeleteFunc(current.Finalizers, func(f string) bool { return f == pv.Finalizers[0] }))
		if err != nil {
			return err
		}
		_, err = p.pvs(p.asNode).Patch(ctx, pv.Name, types.MergePatchType,
			[]byte(`{"metadata":{"resourceVersion":"`+current.ResourceVersion+`","finalizers":`+string(rest)+`}}`), metav1.PatchOptions{})
		if apierrors.IsForbidden(err) {
			t.Fatalf("node %s removing its volume's finalizer after the grant was revoked: %v", p.nodeA, err)
		}
		return err
	})
	eventually(t, time.Minute, "the released volume gone", func(ctx context.Context) error {
		if _, err := p.pvs(p.cp.Client).Get(ctx, pv.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return errorf("still there (%v)", err)
		}
		return nil
	})
	// Its claim still may not move to another namespace.
	moved := p.policyPV("policy-release-moved", p.nodeA)
	moved.Spec.CSI.NodeStageSecretRef = ref(p.ns)
	if _, err := p.pvs(p.cp.Client).Create(c, moved, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.pvs(p.cp.Client).Delete(context.Background(), moved.Name, metav1.DeleteOptions{}) })
	_, err := p.pvs(p.asNode).Patch(c, moved.Name, types.MergePatchType,
		[]byte(`{"spec":{"claimRef":{"namespace":"kube-system"}}}`), metav1.PatchOptions{})
	refused(t, err, "may only name Secrets of the claim namespace kube-system")
	if err := p.pvs(p.asNode).Delete(c, moved.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("node %s deleting a volume: %v", p.nodeA, err)
	}
}

// policyPV is a Cistern PersistentVolume pinned to node and bound to a claim of the Cistern
// class, as the provisioner makes them.
func (p *policyScenario) policyPV(name, node string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:         corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: policyClass,
			ClaimRef:         &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: p.ns, Name: "claim-" + name},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: consts.DriverName, VolumeHandle: "fast-" + name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: consts.TopologyKey,
					Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		},
	}
}

// claims: RBAC lets the node ServiceAccount update any claim (its provisioner selects its node
// for a claim of an Immediate class, gives back a claim it cannot provision, protects a clone's
// source); the policies hold it to those changes, for its own node: no label, no other annotation,
// no volumeName, no other node, and no claim the scheduler places (WaitForFirstConsumer).
func (p *policyScenario) claims(t *testing.T) {
	c := ctx(t)
	const selected = "volume.kubernetes.io/selected-node"
	claim := func(name, class, node string) {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(class),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
		if node != "" {
			pvc.Annotations = map[string]string{selected: node}
		}
		if _, err := p.cp.Client.CoreV1().PersistentVolumeClaims(p.ns).Create(c, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// update changes the claim as c would (RBAC grants update, not patch), as a dry run, from a
	// fresh read: kube-controller-manager annotates the claims meanwhile.
	update := func(as kubernetes.Interface, name string, change func(*corev1.PersistentVolumeClaim)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pvc, err := p.cp.Client.CoreV1().PersistentVolumeClaims(p.ns).Get(c, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(pvc)
			_, err = as.CoreV1().PersistentVolumeClaims(p.ns).Update(c, pvc, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		})
	}
	annotate := func(node string) func(*corev1.PersistentVolumeClaim) {
		return func(pvc *corev1.PersistentVolumeClaim) {
			if pvc.Annotations == nil {
				pvc.Annotations = map[string]string{}
			}
			if node == "" {
				delete(pvc.Annotations, selected)
			} else {
				pvc.Annotations[selected] = node
			}
		}
	}
	claim("claim-immediate", policyImmediateClass, "")
	claim("claim-scheduled", policyClass, "")
	claim("claim-of-a", policyClass, p.nodeA)
	claim("claim-of-b", policyClass, p.nodeB)

	eventually(t, time.Minute, "a claim relabelled by a node refused", func(context.Context) error {
		if update(p.asNode, "claim-of-b", func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Labels = map[string]string{"leaderworkerset.sigs.k8s.io/name": "train"}
		}) == nil {
			return errorf("updated")
		}
		return nil
	})
	// The provisioner's own changes.
	if err := update(p.asNode, "claim-immediate", annotate(p.nodeA)); err != nil {
		t.Errorf("node %s taking a claim of an Immediate class: %v", p.nodeA, err)
	}
	if err := update(p.asNode, "claim-of-a", annotate("")); err != nil {
		t.Errorf("node %s giving back a claim it was selected for: %v", p.nodeA, err)
	}
	if err := update(p.asNode, "claim-of-a", func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Finalizers = append(pvc.Finalizers, "provisioner.storage.kubernetes.io/cloning-protection")
	}); err != nil {
		t.Errorf("node %s protecting a clone's source: %v", p.nodeA, err)
	}

	const onlyThose = "may only change a claim's volume.kubernetes.io/selected-node annotation"
	refused(t, update(p.asNode, "claim-scheduled", annotate(p.nodeA)), "only select its node for a claim of an Immediate StorageClass")
	refused(t, update(p.asNode, "claim-immediate", annotate(p.nodeB)), "may only select that node")
	refused(t, update(p.asNode, "claim-of-b", annotate(p.nodeA)), "may only select that node")
	refused(t, update(p.asNode, "claim-of-b", annotate("")), "may only select that node")
	refused(t, update(p.asNode, "claim-of-a", func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Labels = map[string]string{"leaderworkerset.sigs.k8s.io/name": "train"}
	}), onlyThose)
	refused(t, update(p.asNode, "claim-of-a", func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Annotations["workloads.cistern.dev/keep-on-node-loss"] = "false"
	}), onlyThose)
	refused(t, update(p.asNode, "claim-of-a", func(pvc *corev1.PersistentVolumeClaim) { pvc.Spec.VolumeName = "policy-forged" }), onlyThose)
	refused(t, update(p.asNode, "claim-of-a", func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Finalizers = append(pvc.Finalizers, "example.com/hold")
	}), onlyThose)
	refused(t, update(p.unbound, "claim-immediate", annotate(p.nodeA)), "not bound to a pod on a node")
}

// storagePools: a node publishes, annotates and deletes its own node-local StoragePools; it can
// neither create, rewrite (labels, status, inventory) nor delete another node's, nor put an
// inventory or peer endpoint on a shared one.
func (p *policyScenario) storagePools(t *testing.T) {
	c := ctx(t)
	admin, err := poolpublisher.NewClient(p.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	asNode, err := poolpublisher.NewClient(framework.PodServiceAccountConfig(t, p.cp, cluster.DaemonSetPod(t, p.cp, p.nodeA)))
	if err != nil {
		t.Fatal(err)
	}
	unbound, err := poolpublisher.NewClient(framework.ServiceAccountConfig(t, p.cp, cluster.Namespace, cluster.NodeServiceAccount))
	if err != nil {
		t.Fatal(err)
	}
	pool := func(name, node string, shared bool) *spapi.StoragePool {
		sp := &spapi.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{consts.LabelPool: "fast"}},
			Spec: spapi.StoragePoolSpec{Driver: consts.DriverName}}
		if shared {
			sp.Labels[consts.LabelShared] = "true"
		} else {
			sp.Labels[consts.LabelNode] = node
		}
		return sp
	}
	cleanup := func(name string) {
		t.Cleanup(func() { _ = admin.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}

	eventually(t, time.Minute, "a StoragePool of another node refused", func(ctx context.Context) error {
		sp, err := asNode.Create(ctx, pool("policy-b-fast", p.nodeB, false), metav1.CreateOptions{})
		if err == nil {
			_ = admin.Delete(ctx, sp.Name, metav1.DeleteOptions{})
			return errorf("created")
		}
		return nil
	})
	_, err = asNode.Create(c, pool("policy-b-fast", p.nodeB, false), metav1.CreateOptions{})
	refused(t, err, "may only manage the StoragePools of that node")
	_, err = unbound.Create(c, pool("policy-a-unbound", p.nodeA, false), metav1.CreateOptions{})
	refused(t, err, "not bound to a pod on a node")

	// Its own pool: created, its status and inventory written, annotated with its peer
	// endpoint, deleted.
	own, err := asNode.Create(c, pool("policy-a-fast", p.nodeA, false), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node %s creating its own StoragePool: %v", p.nodeA, err)
	}
	cleanup(own.Name)
	// The sidecar patches status (server-side apply); RBAC grants patch only.
	if _, err = asNode.Patch(c, own.Name, types.MergePatchType, []byte(fmt.Sprintf(
		`{"status":{"accessibleNodes":[%q],"capacity":{"total":"1Gi"},"cache":{"total":1,"ready":1,"staging":0,"failed":0,"datasets":[{"id":"0123456789abcdef","state":"Ready"}]}}}`, p.nodeA)),
		metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("node %s writing its own StoragePool's status: %v", p.nodeA, err)
	}
	if _, err := asNode.Patch(c, own.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"peer.cistern.csi.dev/endpoint":"127.0.0.1:7443"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("node %s annotating its own StoragePool: %v", p.nodeA, err)
	}
	_, err = asNode.Patch(c, own.Name, types.MergePatchType,
		[]byte(fmt.Sprintf(`{"status":{"accessibleNodes":[%q,%q]}}`, p.nodeA, p.nodeB)), metav1.PatchOptions{}, "status")
	refused(t, err, "may not list other nodes in a node-local StoragePool")
	_, err = asNode.Patch(c, own.Name, types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, consts.LabelNode, p.nodeB)), metav1.PatchOptions{})
	refused(t, err, "may only manage the StoragePools of that node")
	if err := asNode.Delete(c, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("node %s deleting its own StoragePool: %v", p.nodeA, err)
	}

	// Another node's pool: no dataset advertised on it, no capacity inflated, not deleted.
	theirs, err := admin.Create(c, pool("policy-b-fast", p.nodeB, false), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cleanup(theirs.Name)
	_, err = asNode.Patch(c, theirs.Name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"dataset.cistern.csi.dev/0123456789abcdef":"true"}}}`), metav1.PatchOptions{})
	refused(t, err, "may only manage the StoragePools of that node")
	_, err = asNode.Patch(c, theirs.Name, types.MergePatchType,
		[]byte(`{"status":{"capacity":{"total":"1Pi","available":"1Pi"}}}`), metav1.PatchOptions{}, "status")
	refused(t, err, "may only manage the StoragePools of that node")
	refused(t, asNode.Delete(c, theirs.Name, metav1.DeleteOptions{}), "may only manage the StoragePools of that node")

	// A shared pool: written by the nodes that reach it, never with an inventory or a peer
	// endpoint, deleted only by a node it lists.
	shared, err := asNode.Create(c, pool("policy-shared", "", true), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node %s creating a shared StoragePool: %v", p.nodeA, err)
	}
	cleanup(shared.Name)
	_, err = asNode.Patch(c, shared.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"peer.cistern.csi.dev/endpoint":"127.0.0.1:7443"}}}`), metav1.PatchOptions{})
	refused(t, err, "carries no dataset inventory and no peer endpoint")
	_, err = asNode.Patch(c, shared.Name, types.MergePatchType,
		[]byte(`{"status":{"cache":{"total":1,"ready":1,"staging":0,"failed":0,"datasets":[{"id":"0123456789abcdef","state":"Ready"}]}}}`), metav1.PatchOptions{}, "status")
	refused(t, err, "carries no dataset inventory and no peer endpoint")
	sharedB, err := admin.Create(c, pool("policy-shared-b", "", true), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cleanup(sharedB.Name)
	sharedB.Status.AccessibleNodes = []string{p.nodeB}
	if _, err := admin.UpdateStatus(c, sharedB, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused(t, asNode.Delete(c, sharedB.Name, metav1.DeleteOptions{}), "may only delete a shared StoragePool it can reach")
}

// controllerWrites: the workload-controller's ServiceAccount, which RBAC lets create any
// PersistentVolume and pod, creates the VolumeManager volumes, stager pods and notebook pods its
// builders make (server-side dry runs: admission runs, nothing is stored), and nothing else.
func (p *policyScenario) controllerWrites(t *testing.T) {
	c := ctx(t)
	asController := kubernetes.NewForConfigOrDie(framework.ServiceAccountConfig(t, p.cp, cluster.Namespace, cluster.ControllerServiceAccount))
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	vm := &datav1alpha1.VolumeManager{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: "vm", UID: "0123"}}
	vc := &datav1alpha1.VolumeConfig{ID: "data", Replicas: 1, SourceType: datav1alpha1.SourceS3, SourceURL: "s3://b/p/",
		Options: map[string]string{datav1alpha1.OptionSecretName: "creds"}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: p.nodeA, Labels: map[string]string{corev1.LabelHostname: p.nodeA}}}
	createPV := func(pv *corev1.PersistentVolume) error {
		_, err := asController.CoreV1().PersistentVolumes().Create(c, pv, dry)
		return err
	}
	createPod := func(pod *corev1.Pod) error {
		_, err := asController.CoreV1().Pods(p.ns).Create(c, pod, dry)
		return err
	}

	vmPV := volumemanager.PersistentVolume(vm, vc, []string{p.nodeA}, map[string]string{"source": "s3://b/p/"}, volumemanager.Config{})
	eventually(t, time.Minute, "a hostPath PersistentVolume refused", func(context.Context) error {
		hp := vmPV.DeepCopy()
		hp.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}
		if createPV(hp) == nil {
			return errorf("created")
		}
		return nil
	})
	if err := createPV(vmPV); err != nil {
		t.Fatalf("a VolumeManager PersistentVolume: %v", err)
	}
	stager := volumemanager.StagerPod(vm, vc, "vm-data", node, p.nodeA, "cistern/workload-controller:dev")
	if err := createPod(stager); err != nil {
		t.Fatalf("a stager pod: %v", err)
	}
	job := &nbv1alpha1.NotebookValidationJob{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: "nb"},
		Spec: nbv1alpha1.NotebookValidationJobSpec{
			Notebook:  nbv1alpha1.NotebookSource{Git: nbv1alpha1.GitSource{URL: "https://git.example.com/nb.git", Ref: "main"}, Path: "a.ipynb"},
			PodConfig: nbv1alpha1.PodConfig{ContainerImage: "jupyter/minimal:1"}}}
	if err := createPod(notebook.BuildPod(job, notebook.Images{Git: "alpine/git:2.49.1", Compare: "cistern/workload-controller:dev"})); err != nil {
		t.Fatalf("a notebook pod: %v", err)
	}

	other := vmPV.DeepCopy()
	other.Spec.CSI.Driver = "other.csi.dev"
	refused(t, createPV(other), "only manage VolumeManager PersistentVolumes")
	plain := vmPV.DeepCopy()
	plain.Spec.CSI.VolumeHandle = "fast-0123"
	refused(t, createPV(plain), "only manage VolumeManager PersistentVolumes")
	secret := vmPV.DeepCopy()
	secret.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Name: "admin", Namespace: "kube-system"}
	refused(t, createPV(secret), "names only Secrets of that claim's namespace")

	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bare"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "c", Image: "busybox:1.37"}}}}
	refused(t, createPod(bare), "may only create stager pods and notebook pods")
	privileged := stager.DeepCopy()
	privileged.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
	privileged.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
	refused(t, createPod(privileged), "a stager pod has no token")
	hostPath := stager.DeepCopy()
	hostPath.Spec.Volumes = append(hostPath.Spec.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
	refused(t, createPod(hostPath), "a stager pod has no token")
	token := stager.DeepCopy()
	token.Spec.AutomountServiceAccountToken = nil
	refused(t, createPod(token), "a stager pod has no token")
	hostNB := notebook.BuildPod(job, notebook.Images{Git: "alpine/git:2.49.1"})
	hostNB.Spec.HostNetwork = true
	refused(t, createPod(hostNB), "no host namespace")
}

// controllerStatefulSets: the workload-controller's ServiceAccount, which RBAC lets create and
// update any StatefulSet and create any Service, writes those of LeaderWorkerSets as its builders
// make them (server-side dry runs), and no other: none without a LeaderWorkerSet or leader pod
// controlling it by name, none turned into a LeaderWorkerSet's from another's, no Service that
// is not headless.
func (p *policyScenario) controllerStatefulSets(t *testing.T) {
	c := ctx(t)
	asController := kubernetes.NewForConfigOrDie(framework.ServiceAccountConfig(t, p.cp, cluster.Namespace, cluster.ControllerServiceAccount))
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	createSTS := func(sts *appsv1.StatefulSet) error {
		_, err := asController.AppsV1().StatefulSets(p.ns).Create(c, sts, dry)
		return err
	}
	createSvc := func(svc *corev1.Service) error {
		_, err := asController.CoreV1().Services(p.ns).Create(c, svc, dry)
		return err
	}
	set := &nbv1alpha1.LeaderWorkerSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: nbv1alpha1.GroupVersion.String(), Kind: "LeaderWorkerSet"},
		ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: "train", UID: "0123"},
		Spec: nbv1alpha1.LeaderWorkerSetSpec{Replicas: ptr.To[int32](1), LeaderWorkerTemplate: nbv1alpha1.LeaderWorkerTemplate{
			Size: ptr.To[int32](2), WorkerTemplate: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/app:1"}}}}}},
	}
	owner := metav1.OwnerReference{APIVersion: set.APIVersion, Kind: set.Kind, Name: set.Name, UID: set.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	leader, err := lws.LeaderStatefulSet(set, "rev", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	leader.OwnerReferences = []metav1.OwnerReference{owner}
	eventually(t, time.Minute, "a StatefulSet of no LeaderWorkerSet refused", func(context.Context) error {
		plain := leader.DeepCopy()
		plain.OwnerReferences = nil
		if createSTS(plain) == nil {
			return errorf("created")
		}
		return nil
	})
	if err := createSTS(leader); err != nil {
		t.Fatalf("a leader StatefulSet: %v", err)
	}
	leaderPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: "train-0", UID: "4567",
		Labels: map[string]string{nbv1alpha1.GroupIndexLabelKey: "0", nbv1alpha1.RevisionKey: "rev"}}}
	workers := lws.WorkerStatefulSet(set, leaderPod, nil)
	if err := createSTS(workers); err != nil {
		t.Fatalf("a worker StatefulSet: %v", err)
	}
	shared := lws.HeadlessService(set, set.Name, map[string]string{nbv1alpha1.SetNameLabelKey: set.Name})
	shared.OwnerReferences = []metav1.OwnerReference{owner}
	if err := createSvc(shared); err != nil {
		t.Fatalf("a LeaderWorkerSet's headless Service: %v", err)
	}

	const notLWS = "may only write the StatefulSets and Services of LeaderWorkerSets"
	deployment := leader.DeepCopy()
	deployment.OwnerReferences[0].APIVersion, deployment.OwnerReferences[0].Kind = "apps/v1", "Deployment"
	refused(t, createSTS(deployment), notLWS)
	renamed := leader.DeepCopy()
	renamed.Name = "kube-proxy"
	refused(t, createSTS(renamed), notLWS)
	stray := workers.DeepCopy()
	stray.OwnerReferences[0].Name = "etcd-0"
	refused(t, createSTS(stray), notLWS)
	unlabelled := leader.DeepCopy()
	delete(unlabelled.Labels, nbv1alpha1.SetNameLabelKey)
	refused(t, createSTS(unlabelled), notLWS)
	uncontrolled := leader.DeepCopy()
	uncontrolled.OwnerReferences[0].Controller = nil
	refused(t, createSTS(uncontrolled), notLWS)
	otherPods := leader.DeepCopy()
	otherPods.Spec.Template.Labels[nbv1alpha1.SetNameLabelKey] = "other"
	otherPods.Spec.Selector.MatchLabels[nbv1alpha1.SetNameLabelKey] = "other"
	refused(t, createSTS(otherPods), "makes pods labelled leaderworkerset.sigs.k8s.io/name with its set")
	balancer := shared.DeepCopy()
	balancer.Spec.ClusterIP, balancer.Spec.Type = "", corev1.ServiceTypeLoadBalancer
	balancer.Spec.Ports = []corev1.ServicePort{{Port: 80}}
	refused(t, createSvc(balancer), "is headless")
	external := shared.DeepCopy()
	external.Spec.ClusterIP, external.Spec.ExternalIPs = "", []string{"192.0.2.1"}
	external.Spec.Ports = []corev1.ServicePort{{Port: 80}}
	refused(t, createSvc(external), "is headless")
	unowned := shared.DeepCopy()
	unowned.OwnerReferences = nil
	refused(t, createSvc(unowned), notLWS)

	// Someone else's StatefulSet is not made a LeaderWorkerSet's: the object before the update
	// counts too.
	theirs := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: "train", Labels: map[string]string{"app": "db"}},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "db"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "registry.invalid/db:1"}}}}}}
	if _, err := p.cp.Client.AppsV1().StatefulSets(p.ns).Create(c, theirs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cp.Client.AppsV1().StatefulSets(p.ns).Delete(context.Background(), theirs.Name, metav1.DeleteOptions{})
	})
	// RBAC grants the controller update, not patch. kube-controller-manager writes the
	// StatefulSet's status meanwhile: an update that lost to it is made again on the new object.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		taken, err := p.cp.Client.AppsV1().StatefulSets(p.ns).Get(c, theirs.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		taken.Labels = map[string]string{nbv1alpha1.SetNameLabelKey: set.Name}
		taken.Spec.Template.Labels[nbv1alpha1.SetNameLabelKey] = set.Name
		taken.OwnerReferences = []metav1.OwnerReference{owner}
		_, err = asController.AppsV1().StatefulSets(p.ns).Update(c, taken, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	refused(t, err, notLWS)
}
