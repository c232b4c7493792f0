package lws

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// maxNameLength keeps "<name>-<group>-<worker>" plus the StatefulSet controller's
// controller-revision-hash suffix within a 63-character label value.
const maxNameLength = 40

// ValidateCreate checks a defaulted LeaderWorkerSet.
func ValidateCreate(lws *v1alpha1.LeaderWorkerSet) field.ErrorList {
	var errs field.ErrorList
	if len(lws.Name) > maxNameLength {
		errs = append(errs, field.TooLong(field.NewPath("metadata", "name"), lws.Name, maxNameLength))
	}
	spec := field.NewPath("spec")
	if r := ptr.Deref(lws.Spec.Replicas, 1); r < 0 {
		errs = append(errs, field.Invalid(spec.Child("replicas"), r, "must be >= 0"))
	}
	tplPath := spec.Child("leaderWorkerTemplate")
	tpl := &lws.Spec.LeaderWorkerTemplate
	if s := ptr.Deref(tpl.Size, 1); s < 1 {
		errs = append(errs, field.Invalid(tplPath.Child("size"), s, "must be >= 1"))
	}
	errs = append(errs, validateRollout(lws)...)
	errs = append(errs, validateClaims(tpl, tplPath)...)
	errs = append(errs, validateSchedulingPolicy(tpl.SchedulingPolicy, tplPath.Child("schedulingPolicy"))...)
	return errs
}

// ValidateUpdate checks an update: everything ValidateCreate checks, plus the claim templates,
// which a StatefulSet cannot change, must stay as they are.
func ValidateUpdate(old, cur *v1alpha1.LeaderWorkerSet) field.ErrorList {
	errs := ValidateCreate(cur)
	p := field.NewPath("spec", "leaderWorkerTemplate", "volumeClaimTemplates")
	if !apiequality.Semantic.DeepEqual(claimSpecs(old), claimSpecs(cur)) {
		errs = append(errs, field.Forbidden(p, "volumeClaimTemplates cannot be changed once the LeaderWorkerSet exists "+
			"(StatefulSets cannot change theirs); delete and recreate the LeaderWorkerSet to change them"))
	}
	return errs
}

// claimSpecs is what of the claim templates reaches the StatefulSets.
func claimSpecs(lws *v1alpha1.LeaderWorkerSet) []corev1.PersistentVolumeClaim {
	out := claimTemplates(lws)
	for i := range out {
		out[i].Labels, out[i].Annotations = nil, nil
	}
	return out
}

func validateRollout(lws *v1alpha1.LeaderWorkerSet) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec", "rolloutStrategy", "rollingUpdateConfiguration")
	ru := lws.Spec.RolloutStrategy.RollingUpdateConfiguration
	if ru == nil {
		return nil
	}
	replicas := int(ptr.Deref(lws.Spec.Replicas, 1))
	mu, err := intstr.GetScaledValueFromIntOrPercent(&ru.MaxUnavailable, replicas, false)
	if err != nil || mu < 0 || (ru.MaxUnavailable.Type == intstr.String && percentOver100(ru.MaxUnavailable)) {
		errs = append(errs, field.Invalid(p.Child("maxUnavailable"), ru.MaxUnavailable.String(), "must be a non-negative number or a percentage up to 100%"))
	}
	ms, err := intstr.GetScaledValueFromIntOrPercent(&ru.MaxSurge, replicas, true)
	if err != nil || ms < 0 || (ru.MaxSurge.Type == intstr.String && percentOver100(ru.MaxSurge)) {
		errs = append(errs, field.Invalid(p.Child("maxSurge"), ru.MaxSurge.String(), "must be a non-negative number or a percentage up to 100%"))
	}
	if len(errs) == 0 && mu == 0 && ms == 0 && replicas > 0 {
		errs = append(errs, field.Invalid(p.Child("maxUnavailable"), ru.MaxUnavailable.String(), "must not be 0 when maxSurge is 0"))
	}
	return errs
}

func percentOver100(v intstr.IntOrString) bool {
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, 100, true)
	return err != nil || n > 100
}

func validateClaims(tpl *v1alpha1.LeaderWorkerTemplate, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := sets.New[string]()
	for i, c := range tpl.VolumeClaimTemplates {
		cp := p.Child("volumeClaimTemplates").Index(i)
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			errs = append(errs, field.Invalid(cp.Child("metadata", "name"), c.Name, msg))
		}
		if names.Has(c.Name) {
			errs = append(errs, field.Duplicate(cp.Child("metadata", "name"), c.Name))
		}
		names.Insert(c.Name)
		if len(c.Spec.AccessModes) == 0 {
			errs = append(errs, field.Required(cp.Child("spec", "accessModes"), "at least one access mode"))
		}
		if _, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
			errs = append(errs, field.Required(cp.Child("spec", "resources", "requests", "storage"), "a storage request"))
		}
	}
	if rp := tpl.PersistentVolumeClaimRetentionPolicy; rp != nil {
		rpp := p.Child("persistentVolumeClaimRetentionPolicy")
		for _, f := range []struct {
			name string
			v    appsv1.PersistentVolumeClaimRetentionPolicyType
		}{{"whenDeleted", rp.WhenDeleted}, {"whenScaled", rp.WhenScaled}} {
			if f.v != appsv1.RetainPersistentVolumeClaimRetentionPolicyType && f.v != appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
				errs = append(errs, field.NotSupported(rpp.Child(f.name), f.v, []string{"Retain", "Delete"}))
			}
		}
	}
	return errs
}

func validateSchedulingPolicy(sp *v1alpha1.SchedulingPolicy, p *field.Path) field.ErrorList {
	if sp == nil {
		return nil
	}
	var errs field.ErrorList
	if k := sp.ReplicaUniqueNodeSelector; k != "" {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(p.Child("replicaUniqueNodeSelector"), k, "must be a node label key: "+msg))
		}
	}
	if t := sp.ReplicaUniqueToleration; t != nil {
		tp := p.Child("replicaUniqueToleration")
		for _, msg := range validation.IsQualifiedName(t.Key) {
			errs = append(errs, field.Invalid(tp.Child("key"), t.Key, "must be a taint key: "+msg))
		}
		switch t.Effect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			errs = append(errs, field.NotSupported(tp.Child("effect"), t.Effect, []string{
				string(corev1.TaintEffectNoSchedule), string(corev1.TaintEffectPreferNoSchedule), string(corev1.TaintEffectNoExecute)}))
		}
	}
	return errs
}
