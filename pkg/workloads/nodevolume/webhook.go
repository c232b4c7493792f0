// Package nodevolume is the admission webhook that holds node plugins to the PersistentVolumes
// their provisioner makes. A node DaemonSet's external-provisioner (node-deployment mode) creates
// the volumes of the claims the scheduler gave its node, which RBAC can only grant as "any
// PersistentVolume", and a volume bound (claimRef) to a claim of a pod on the node makes the Node
// authorizer hand that node the Secrets the volume names. The ValidatingAdmissionPolicies of
// deploy/csi/driver/node-pv-policy.yaml see only the volume; a compromised node could still name
// any claim of a pod on it — of another driver, bound elsewhere — and any Secret of that claim's
// namespace. This webhook reads the claim and its class and admits a node's new volume only as the
// provisioner would have made it for that claim, on that node.
package nodevolume

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// The claim and its class are read by name from the API server, not a cache: the scheduler sets
// a claim's selected node just before the provisioner acts on it.
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get
// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get

// Path is where the webhook is served.
const Path = "/validate-node-persistentvolume"

// ServiceAccountExpression matches the node plugin's ServiceAccount, by name in any namespace, as
// the node ValidatingAdmissionPolicies do: the webhook configuration sends only its requests.
const ServiceAccountExpression = `request.userInfo.username.matches('^system:serviceaccount:[^:]+:cistern-node$')`

// nodeNameKey is the user extra the API server puts in a token bound to a pod scheduled to a node.
const nodeNameKey = "authentication.kubernetes.io/node-name"

// selectedNodeAnnotation is the claim's node: the scheduler's choice (WaitForFirstConsumer), or
// the node whose provisioner took the claim (Immediate binding in node-deployment mode).
const selectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// Register adds the webhook to srv. reader must read from the API server, not a cache.
func Register(srv webhook.Server, scheme *runtime.Scheme, reader client.Reader, driverName string) {
	srv.Register(Path, admission.WithValidator[*corev1.PersistentVolume](scheme, &Validator{Reader: reader, DriverName: driverName}))
}

// Validator admits a node plugin's PersistentVolume when it is the volume its provisioner makes
// for a claim: on create, the claimRef names, with its UID, a claim of a StorageClass of the
// driver, of the volume's class, not bound to another volume, whose selected node is the node the
// request's token is bound to; and the volume names exactly the Secrets the class's
// csi.storage.k8s.io/*-secret-name and -namespace parameters resolve to for that claim. An update
// may not change the claimRef (the provisioner never does). Deletes are the policy's.
type Validator struct {
	Reader     client.Reader
	DriverName string
}

var pvResource = schema.GroupResource{Resource: "persistentvolumes"}

// ValidateCreate admits a node's new volume made for a claim of its node.
func (v *Validator) ValidateCreate(ctx context.Context, pv *corev1.PersistentVolume) (admission.Warnings, error) {
	node, err := requestNode(ctx)
	if err != nil {
		return nil, apierrors.NewForbidden(pvResource, pv.Name, err)
	}
	if err := v.check(ctx, pv, node); err != nil {
		klog.FromContext(ctx).V(2).Info("Refused a node's PersistentVolume", "pv", pv.Name, "node", node, "err", err)
		if apierrors.IsInternalError(err) {
			return nil, err
		}
		return nil, apierrors.NewForbidden(pvResource, pv.Name, err)
	}
	return nil, nil
}

// ValidateUpdate keeps a volume bound to the claim it was created for.
func (v *Validator) ValidateUpdate(_ context.Context, old, pv *corev1.PersistentVolume) (admission.Warnings, error) {
	if !equality.Semantic.DeepEqual(claimKey(old.Spec.ClaimRef), claimKey(pv.Spec.ClaimRef)) {
		return nil, apierrors.NewForbidden(pvResource, pv.Name,
			fmt.Errorf("the node plugin may not bind a PersistentVolume to another claim (claimRef %v, was %v)", claimKey(pv.Spec.ClaimRef), claimKey(old.Spec.ClaimRef)))
	}
	return nil, nil
}

// ValidateDelete admits every delete: the configuration sends none.
func (v *Validator) ValidateDelete(context.Context, *corev1.PersistentVolume) (admission.Warnings, error) {
	return nil, nil
}

type claimID struct {
	Namespace, Name string
	UID             types.UID
}

func claimKey(ref *corev1.ObjectReference) *claimID {
	if ref == nil {
		return nil
	}
	return &claimID{Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID}
}

// requestNode is the node the request's token is bound to.
func requestNode(ctx context.Context) (string, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return "", err
	}
	if v := req.UserInfo.Extra[nodeNameKey]; len(v) == 1 && v[0] != "" {
		return v[0], nil
	}
	return "", fmt.Errorf("the node plugin's token is not bound to a pod on a node")
}

// check says why pv is not the volume the provisioner of node makes for the claim it names, or
// nil. Errors reading the claim or class are internal errors: the provisioner tries again.
func (v *Validator) check(ctx context.Context, pv *corev1.PersistentVolume, node string) error {
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.Namespace == "" || ref.Name == "" || ref.UID == "" {
		return fmt.Errorf("a node's PersistentVolume names its claim (claimRef namespace, name and uid)")
	}
	var pvc corev1.PersistentVolumeClaim
	if err := v.Reader.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, &pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s/%s does not exist", ref.Namespace, ref.Name)
		}
		return apierrors.NewInternalError(fmt.Errorf("reading claim %s/%s: %w", ref.Namespace, ref.Name, err))
	}
	switch class := pv.Spec.StorageClassName; {
	case pvc.UID != ref.UID:
		return fmt.Errorf("claim %s/%s is %s, not %s", ref.Namespace, ref.Name, pvc.UID, ref.UID)
	case pvc.Spec.VolumeName != "":
		return fmt.Errorf("claim %s/%s is bound to volume %s", ref.Namespace, ref.Name, pvc.Spec.VolumeName)
	case class == "" || pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != class:
		return fmt.Errorf("claim %s/%s is not of the volume's StorageClass %q", ref.Namespace, ref.Name, class)
	case pvc.Annotations[selectedNodeAnnotation] != node:
		return fmt.Errorf("claim %s/%s is for node %q, not %s (annotation %s)", ref.Namespace, ref.Name,
			pvc.Annotations[selectedNodeAnnotation], node, selectedNodeAnnotation)
	}
	var sc storagev1.StorageClass
	if err := v.Reader.Get(ctx, types.NamespacedName{Name: pv.Spec.StorageClassName}, &sc); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("StorageClass %s does not exist", pv.Spec.StorageClassName)
		}
		return apierrors.NewInternalError(fmt.Errorf("reading StorageClass %s: %w", pv.Spec.StorageClassName, err))
	}
	if sc.Provisioner != v.DriverName {
		return fmt.Errorf("StorageClass %s is provisioned by %s, not %s", sc.Name, sc.Provisioner, v.DriverName)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != v.DriverName {
		return fmt.Errorf("a node's PersistentVolume is a CSI volume of %s", v.DriverName)
	}
	want, err := SecretReferences(sc.Parameters, pv.Name, &pvc)
	if err != nil {
		return fmt.Errorf("StorageClass %s: %w", sc.Name, err)
	}
	if got := secretReferencesOf(pv.Spec.CSI); !equality.Semantic.DeepEqual(got, want) {
		return fmt.Errorf("the volume names Secrets %s; StorageClass %s names %s for claim %s/%s", got, sc.Name, want, pvc.Namespace, pvc.Name)
	}
	return nil
}
