package lws

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// Webhook paths served for LeaderWorkerSets and their pods.
const (
	MutateLeaderWorkerSetPath   = "/mutate-leaderworkerset"
	ValidateLeaderWorkerSetPath = "/validate-leaderworkerset"
	MutatePodPath               = "/mutate-pod"
)

// RegisterWebhooks adds the LeaderWorkerSet defaulting and validating webhooks and the pod
// defaulting webhook to srv. The scheme says which group LeaderWorkerSet is served under.
func RegisterWebhooks(srv webhook.Server, scheme *runtime.Scheme) error {
	gvk, err := apiutil.GVKForObject(&v1alpha1.LeaderWorkerSet{}, scheme)
	if err != nil {
		return err
	}
	srv.Register(MutateLeaderWorkerSetPath, admission.WithDefaulter[*v1alpha1.LeaderWorkerSet](scheme, lwsDefaulter{}))
	srv.Register(ValidateLeaderWorkerSetPath, admission.WithValidator[*v1alpha1.LeaderWorkerSet](scheme, lwsValidator{kind: gvk.GroupKind()}))
	srv.Register(MutatePodPath, admission.WithDefaulter[*corev1.Pod](scheme, podDefaulter{}))
	return nil
}

type lwsDefaulter struct{}

func (lwsDefaulter) Default(_ context.Context, lws *v1alpha1.LeaderWorkerSet) error {
	SetDefaults(lws)
	return nil
}

type lwsValidator struct {
	kind schema.GroupKind
}

func (v lwsValidator) ValidateCreate(_ context.Context, lws *v1alpha1.LeaderWorkerSet) (admission.Warnings, error) {
	return nil, v.invalid(lws, ValidateCreate(lws))
}

func (v lwsValidator) ValidateUpdate(_ context.Context, old, cur *v1alpha1.LeaderWorkerSet) (admission.Warnings, error) {
	return nil, v.invalid(cur, ValidateUpdate(old, cur))
}

func (lwsValidator) ValidateDelete(context.Context, *v1alpha1.LeaderWorkerSet) (admission.Warnings, error) {
	return nil, nil
}

func (v lwsValidator) invalid(lws *v1alpha1.LeaderWorkerSet, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(v.kind, lws.Name, errs)
}

type podDefaulter struct{}

func (podDefaulter) Default(_ context.Context, pod *corev1.Pod) error {
	return DefaultPod(pod)
}
