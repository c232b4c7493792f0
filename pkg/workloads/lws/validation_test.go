package lws

import (
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// errorsToString joins errors as the webhook's message does; "" for none.
func errorsToString(errs field.ErrorList) string {
	if len(errs) == 0 {
		return ""
	}
	return fmt.Sprint(errs.ToAggregate())
}

func TestValidateCreate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*v1alpha1.LeaderWorkerSet)
		want []string // substrings of the aggregated message; empty means valid
	}{
		{name: "valid with claims and scheduling policy", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{claim("data")}
			l.Spec.LeaderWorkerTemplate.SchedulingPolicy = &v1alpha1.SchedulingPolicy{
				ReplicaUniqueNodeSelector: "cistern.dev/replica",
				ReplicaUniqueToleration:   &v1alpha1.ReplicaUniqueToleration{Key: "cistern.dev/replica", Effect: corev1.TaintEffectPreferNoSchedule}}
		}},
		{name: "a 50-character name, as long as 10 groups of more than one pod allow", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Name, l.Spec.Replicas = strings.Repeat("a", 50), ptr.To[int32](10)
		}},
		{name: "a 52-character name for groups of one pod", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Name, l.Spec.LeaderWorkerTemplate.Size = strings.Repeat("a", 52), ptr.To[int32](1)
		}},
		{name: "failure case - name too long for its pods' labels", mod: func(l *v1alpha1.LeaderWorkerSet) { l.Name = strings.Repeat("a", 51) },
			want: []string{"metadata.name: Invalid value", "must be no more than 50 characters for 2 groups of 3 pods"}},
		{name: "failure case - 11 groups with the surge leave 49 characters", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Name, l.Spec.Replicas = strings.Repeat("a", 50), ptr.To[int32](10)
			l.Spec.RolloutStrategy.RollingUpdateConfiguration = &v1alpha1.RollingUpdateConfiguration{MaxUnavailable: intstr.FromInt32(1), MaxSurge: intstr.FromInt32(1)}
		}, want: []string{"must be no more than 49 characters for 11 groups of 3 pods"}},
		{name: "failure case - upstream's 63-character maximum", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Name, l.Spec.LeaderWorkerTemplate.Size = strings.Repeat("a", 63), ptr.To[int32](1)
		}, want: []string{"must be no more than 52 characters for 2 groups of 1 pods"}},
		{name: "failure case - not a DNS-1035 label", mod: func(l *v1alpha1.LeaderWorkerSet) { l.Name = "1st-model" },
			want: []string{`metadata.name: Invalid value: "1st-model": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character`}},
		{name: "failure case - replicas x size above int32", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.Replicas, l.Spec.LeaderWorkerTemplate.Size = ptr.To[int32](65536), ptr.To[int32](32768)
		}, want: []string{"spec.replicas: Invalid value: 65536: the product of replicas and worker replicas must not exceed 2147483647"}},
		{name: "failure case - size 0", mod: func(l *v1alpha1.LeaderWorkerSet) { l.Spec.LeaderWorkerTemplate.Size = ptr.To[int32](0) },
			want: []string{"spec.leaderWorkerTemplate.size: Invalid value: 0: must be >= 1"}},
		{name: "failure case - maxUnavailable and maxSurge both 0", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.RolloutStrategy.RollingUpdateConfiguration = &v1alpha1.RollingUpdateConfiguration{MaxUnavailable: intstr.FromInt32(0), MaxSurge: intstr.FromInt32(0)}
		}, want: []string{"maxUnavailable", "must not be 0 when maxSurge is 0"}},
		{name: "failure case - percentage above 100", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.RolloutStrategy.RollingUpdateConfiguration = &v1alpha1.RollingUpdateConfiguration{MaxUnavailable: intstr.FromString("150%")}
		}, want: []string{"spec.rolloutStrategy.rollingUpdateConfiguration.maxUnavailable"}},
		{name: "failure case - bad toleration effect", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.SchedulingPolicy = &v1alpha1.SchedulingPolicy{
				ReplicaUniqueToleration: &v1alpha1.ReplicaUniqueToleration{Key: "k", Effect: "Always"}}
		}, want: []string{`spec.leaderWorkerTemplate.schedulingPolicy.replicaUniqueToleration.effect: Unsupported value: "Always"`}},
		{name: "failure case - bad node selector key", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.SchedulingPolicy = &v1alpha1.SchedulingPolicy{ReplicaUniqueNodeSelector: "not a key"}
		}, want: []string{"spec.leaderWorkerTemplate.schedulingPolicy.replicaUniqueNodeSelector", "must be a node label key"}},
		{name: "failure case - duplicate claim, no storage request", mod: func(l *v1alpha1.LeaderWorkerSet) {
			c := claim("data")
			c.Spec.Resources.Requests = nil
			l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{claim("data"), c}
		}, want: []string{"volumeClaimTemplates[1].metadata.name: Duplicate value", "volumeClaimTemplates[1].spec.resources.requests.storage: Required"}},
		{name: "failure case - unknown retention policy", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{WhenDeleted: "Keep", WhenScaled: "Retain"}
		}, want: []string{`persistentVolumeClaimRetentionPolicy.whenDeleted: Unsupported value: "Keep"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := testLWS(tc.mod)
			got := errorsToString(ValidateCreate(l))
			if len(tc.want) == 0 && got != "" {
				t.Fatalf("unexpected errors: %s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("errors %q do not contain %q", got, w)
				}
			}
		})
	}
}

func TestValidateUpdateClaimTemplates(t *testing.T) {
	old := testLWS(func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{claim("data")}
	})
	tests := []struct {
		name  string
		mod   func(*v1alpha1.LeaderWorkerSet)
		wantF bool
	}{
		{name: "scale and image change are allowed", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.Replicas = ptr.To[int32](9)
			l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image = "new"
		}},
		{name: "claim labels may change", mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates[0].Labels = map[string]string{"b": "c"}
		}},
		{name: "failure case - claim size changed", wantF: true, mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
		}},
		{name: "failure case - claim added", wantF: true, mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates = append(l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates, claim("more"))
		}},
		{name: "failure case - claims removed", wantF: true, mod: func(l *v1alpha1.LeaderWorkerSet) {
			l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates = nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cur := old.DeepCopy()
			tc.mod(cur)
			got := errorsToString(ValidateUpdate(old, cur))
			const msg = "spec.leaderWorkerTemplate.volumeClaimTemplates: Forbidden: volumeClaimTemplates cannot be changed"
			if tc.wantF != strings.Contains(got, msg) {
				t.Errorf("errors = %q, want forbidden=%v", got, tc.wantF)
			}
		})
	}
}
