// Package lws implements LeaderWorkerSet: pure builders for the StatefulSets, Services and pod
// defaults (construct.go, pod.go), admission (validation.go, webhook.go) and the reconcilers that
// apply them (leaderworkerset_controller.go, pod_controller.go).
package lws

import (
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// SetDefaults fills every optional field the way upstream's defaulting webhook does, and writes the
// claim retention policy out explicitly (Retain/Retain) so what the StatefulSets get is visible on
// the LeaderWorkerSet itself.
func SetDefaults(lws *v1alpha1.LeaderWorkerSet) {
	spec := &lws.Spec
	if spec.Replicas == nil {
		spec.Replicas = ptr.To[int32](1)
	}
	tpl := &spec.LeaderWorkerTemplate
	if tpl.Size == nil {
		tpl.Size = ptr.To[int32](1)
	}
	switch tpl.RestartPolicy {
	case "":
		tpl.RestartPolicy = v1alpha1.RecreateGroupOnPodRestart
	case v1alpha1.DeprecatedDefaultRestartPolicy:
		tpl.RestartPolicy = v1alpha1.NoneRestartPolicy
	}
	if spec.RolloutStrategy.Type == "" {
		spec.RolloutStrategy.Type = v1alpha1.RollingUpdateStrategyType
	}
	if spec.RolloutStrategy.RollingUpdateConfiguration == nil {
		spec.RolloutStrategy.RollingUpdateConfiguration = &v1alpha1.RollingUpdateConfiguration{
			MaxUnavailable: intstr.FromInt32(1),
			MaxSurge:       intstr.FromInt32(0),
		}
	}
	if ru := spec.RolloutStrategy.RollingUpdateConfiguration; ru.Partition == nil {
		ru.Partition = ptr.To[int32](0)
	}
	if sg := tpl.SubGroupPolicy; sg != nil && sg.Type == nil {
		sg.Type = ptr.To(v1alpha1.SubGroupPolicyTypeLeaderWorker)
	}
	if spec.StartupPolicy == "" {
		spec.StartupPolicy = v1alpha1.LeaderCreatedStartupPolicy
	}
	if spec.NetworkConfig == nil {
		spec.NetworkConfig = &v1alpha1.NetworkConfig{}
	}
	if spec.NetworkConfig.SubdomainPolicy == nil {
		spec.NetworkConfig.SubdomainPolicy = ptr.To(v1alpha1.SubdomainShared)
	}
	if tpl.PersistentVolumeClaimRetentionPolicy == nil {
		tpl.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{}
	}
	rp := tpl.PersistentVolumeClaimRetentionPolicy
	if rp.WhenDeleted == "" {
		rp.WhenDeleted = appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	}
	if rp.WhenScaled == "" {
		rp.WhenScaled = appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	}
}
