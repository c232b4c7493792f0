package lws

import (
	"fmt"
	"math"

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

// revisionHashLength is the longest hash the StatefulSet controller appends to a StatefulSet's name
// for its pods' controller-revision-hash label (the decimal FNV-32 hash, safe-encoded).
const revisionHashLength = 10

// ValidateCreate checks a defaulted LeaderWorkerSet.
func ValidateCreate(lws *v1alpha1.LeaderWorkerSet) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	replicas, size := ptr.Deref(lws.Spec.Replicas, 1), ptr.Deref(lws.Spec.LeaderWorkerTemplate.Size, 1)
	if replicas < 0 {
		errs = append(errs, field.Invalid(spec.Child("replicas"), replicas, "must be >= 0"))
	}
	tplPath := spec.Child("leaderWorkerTemplate")
	tpl := &lws.Spec.LeaderWorkerTemplate
	if size < 1 {
		errs = append(errs, field.Invalid(tplPath.Child("size"), size, "must be >= 1"))
	}
	// As upstream: the pods of the set are numbered in int32.
	if int64(replicas)*int64(size) > math.MaxInt32 {
		errs = append(errs, field.Invalid(spec.Child("replicas"), replicas,
			fmt.Sprintf("the product of replicas and worker replicas must not exceed %d", math.MaxInt32)))
	}
	if len(errs) == 0 {
		errs = append(errs, validateName(lws)...)
	}
	errs = append(errs, validateRollout(lws)...)
	errs = append(errs, validateClaims(tpl, tplPath)...)
	errs = append(errs, validateSchedulingPolicy(tpl.SchedulingPolicy, tplPath.Child("schedulingPolicy"))...)
	errs = append(errs, validateSubGroupPolicy(tpl, tplPath.Child("subGroupPolicy"))...)
	errs = append(errs, validatePlacementAnnotations(lws)...)
	return errs
}

// validateName checks the name as upstream does — a DNS-1035 label, since it names the headless
// Service — and, unlike upstream, against what the StatefulSet controller derives from it: it
// labels every pod with its own name (statefulset.kubernetes.io/pod-name, <name>-<group>-<worker>
// for workers) and with its StatefulSet's revision (controller-revision-hash,
// <statefulset>-<hash>), and label values are at most 63 characters. Upstream accepts names up to
// 63 whose pods can then never be created; here the name may be as long as the groups it will
// have (replicas plus the surge) allow: 50 for up to 10 groups of more than one pod, 52 for
// groups of one.
func validateName(lws *v1alpha1.LeaderWorkerSet) field.ErrorList {
	p := field.NewPath("metadata", "name")
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1035Label(lws.Name) {
		errs = append(errs, field.Invalid(p, lws.Name, msg))
	}
	if len(errs) > 0 {
		return errs
	}
	replicas, size := ptr.Deref(lws.Spec.Replicas, 1), ptr.Deref(lws.Spec.LeaderWorkerTemplate.Size, 1)
	groups := replicas + surgeOf(lws)
	lastGroup := len(fmt.Sprint(max(groups-1, 0)))
	// The leader StatefulSet <name> labels its pods <name>-<hash>.
	limit := validation.LabelValueMaxLength - 1 - revisionHashLength
	if size > 1 {
		// A worker StatefulSet <name>-<group> labels its pods <name>-<group>-<hash>, and names
		// them <name>-<group>-<worker>.
		limit = min(limit,
			validation.LabelValueMaxLength-1-lastGroup-1-revisionHashLength,
			validation.LabelValueMaxLength-1-lastGroup-1-len(fmt.Sprint(size-1)))
	}
	if len(lws.Name) > limit {
		errs = append(errs, field.Invalid(p, lws.Name, fmt.Sprintf("must be no more than %d characters for %d groups of %d pods: "+
			"the StatefulSet controller labels each pod with its name and its StatefulSet's revision (<name>-<group>-<%d-character hash>), "+
			"and label values are at most %d characters", limit, groups, size, revisionHashLength, validation.LabelValueMaxLength)))
	}
	return errs
}

// surgeOf is the most groups a rolling update adds: maxSurge rounded up against replicas, at most
// replicas (as the rollout takes it).
func surgeOf(lws *v1alpha1.LeaderWorkerSet) int32 {
	ru := lws.Spec.RolloutStrategy.RollingUpdateConfiguration
	if ru == nil {
		return 0
	}
	replicas := ptr.Deref(lws.Spec.Replicas, 1)
	n, err := intstr.GetScaledValueFromIntOrPercent(&ru.MaxSurge, int(replicas), true)
	if err != nil || n < 0 {
		return 0
	}
	return min(int32(n), replicas)
}

// validateSubGroupPolicy checks subGroupSize against size as upstream does: at least 1, at most
// size, dividing size or size-1 (size-1 under LeaderExcluded).
func validateSubGroupPolicy(tpl *v1alpha1.LeaderWorkerTemplate, p *field.Path) field.ErrorList {
	sg := tpl.SubGroupPolicy
	if sg == nil {
		return nil
	}
	sp := p.Child("subGroupSize")
	if sg.SubGroupSize == nil {
		return field.ErrorList{field.Required(sp, "the number of pods per subgroup")}
	}
	n, size := *sg.SubGroupSize, ptr.Deref(tpl.Size, 1)
	switch {
	case n < 1:
		return field.ErrorList{field.Invalid(sp, n, "must be >= 1")}
	case n > size:
		return field.ErrorList{field.Invalid(sp, n, fmt.Sprintf("must not be greater than size (%d)", size))}
	case ptr.Deref(sg.Type, v1alpha1.SubGroupPolicyTypeLeaderWorker) == v1alpha1.SubGroupPolicyTypeLeaderExcluded:
		if (size-1)%n != 0 {
			return field.ErrorList{field.Invalid(sp, n, fmt.Sprintf("size-1 (%d) must be divisible by subGroupSize under LeaderExcluded", size-1))}
		}
	case size%n != 0 && (size-1)%n != 0:
		return field.ErrorList{field.Invalid(sp, n, fmt.Sprintf("size (%d) or size-1 must be divisible by subGroupSize", size))}
	}
	if t := sg.Type; t != nil && *t != v1alpha1.SubGroupPolicyTypeLeaderWorker && *t != v1alpha1.SubGroupPolicyTypeLeaderExcluded {
		return field.ErrorList{field.NotSupported(p.Child("subGroupPolicyType"), *t, []string{
			string(v1alpha1.SubGroupPolicyTypeLeaderWorker), string(v1alpha1.SubGroupPolicyTypeLeaderExcluded)})}
	}
	return nil
}

// validatePlacementAnnotations checks the exclusive-placement annotations: node label keys, and
// the subgroup one only with a subGroupPolicy.
func validatePlacementAnnotations(lws *v1alpha1.LeaderWorkerSet) field.ErrorList {
	var errs field.ErrorList
	ap := field.NewPath("metadata", "annotations")
	for _, key := range []string{v1alpha1.ExclusiveKeyAnnotationKey, v1alpha1.SubGroupExclusiveKeyAnnotationKey} {
		v, ok := lws.Annotations[key]
		if !ok {
			continue
		}
		for _, msg := range validation.IsQualifiedName(v) {
			errs = append(errs, field.Invalid(ap.Key(key), v, "must be a node label key: "+msg))
		}
	}
	if _, ok := lws.Annotations[v1alpha1.SubGroupExclusiveKeyAnnotationKey]; ok && lws.Spec.LeaderWorkerTemplate.SubGroupPolicy == nil {
		errs = append(errs, field.Invalid(ap.Key(v1alpha1.SubGroupExclusiveKeyAnnotationKey),
			lws.Annotations[v1alpha1.SubGroupExclusiveKeyAnnotationKey], "needs spec.leaderWorkerTemplate.subGroupPolicy"))
	}
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
	// Pods are labelled with their subgroup when created; a change would leave groups split two ways.
	oldSG, curSG := old.Spec.LeaderWorkerTemplate.SubGroupPolicy, cur.Spec.LeaderWorkerTemplate.SubGroupPolicy
	sgp := field.NewPath("spec", "leaderWorkerTemplate", "subGroupPolicy")
	switch {
	case oldSG == nil && curSG != nil:
		errs = append(errs, field.Forbidden(sgp, "cannot be added once the LeaderWorkerSet exists"))
	case oldSG != nil && curSG == nil:
		errs = append(errs, field.Forbidden(sgp, "cannot be removed once set"))
	case oldSG != nil && ptr.Deref(oldSG.SubGroupSize, 0) != ptr.Deref(curSG.SubGroupSize, 0):
		errs = append(errs, field.Invalid(sgp.Child("subGroupSize"), ptr.Deref(curSG.SubGroupSize, 0), "field is immutable"))
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
	if ru.Partition != nil && *ru.Partition < 0 {
		errs = append(errs, field.Invalid(p.Child("partition"), *ru.Partition, "must be >= 0"))
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
