package lws

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
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
// defaulting webhook to srv.
func RegisterWebhooks(srv webhook.Server, scheme *runtime.Scheme) {
	srv.Register(MutateLeaderWorkerSetPath, admission.WithDefaulter[*v1alpha1.LeaderWorkerSet](scheme, lwsDefaulter{}))
	srv.Register(ValidateLeaderWorkerSetPath, admission.WithValidator[*v1alpha1.LeaderWorkerSet](scheme, lwsValidator{}))
	srv.Register(MutatePodPath, admission.WithDefaulter[*corev1.Pod](scheme, podDefaulter{}))
}

type lwsDefaulter struct{}

func (lwsDefaulter) Default(_ context.Context, lws *v1alpha1.LeaderWorkerSet) error {
	SetDefaults(lws)
	return nil
}

type lwsValidator struct{}

func (lwsValidator) ValidateCreate(_ context.Context, lws *v1alpha1.LeaderWorkerSet) (admission.Warnings, error) {
	return nil, invalid(lws, ValidateCreate(lws))
}

func (lwsValidator) ValidateUpdate(_ context.Context, old, cur *v1alpha1.LeaderWorkerSet) (admission.Warnings, error) {
	return nil, invalid(cur, ValidateUpdate(old, cur))
}

func (lwsValidator) ValidateDelete(context.Context, *v1alpha1.LeaderWorkerSet) (admission.Warnings, error) {
	return nil, nil
}

func invalid(lws *v1alpha1.LeaderWorkerSet, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("LeaderWorkerSet").GroupKind(), lws.Name, errs)
}

type podDefaulter struct{}

func (podDefaulter) Default(_ context.Context, pod *corev1.Pod) error {
	return DefaultPod(pod)
}
