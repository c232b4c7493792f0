package lws

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

func container(name string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: "busybox"}}}}
}

func claim(name string) corev1.PersistentVolumeClaim {
	return corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "x"}, UID: "dropped"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
}

func testLWS(mod ...func(*v1alpha1.LeaderWorkerSet)) *v1alpha1.LeaderWorkerSet {
	l := &v1alpha1.LeaderWorkerSet{
		ObjectMeta: metav1.ObjectMeta{Name: "lws", Namespace: "ns", Labels: map[string]string{"team": "a"}},
		Spec: v1alpha1.LeaderWorkerSetSpec{
			Replicas:             ptr.To[int32](2),
			LeaderWorkerTemplate: v1alpha1.LeaderWorkerTemplate{Size: ptr.To[int32](3), WorkerTemplate: container("worker")},
		},
	}
	for _, m := range mod {
		m(l)
	}
	SetDefaults(l)
	return l
}

var retain = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
	WhenDeleted: appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
	WhenScaled:  appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
}

func withoutHash(sts *appsv1.StatefulSet) *appsv1.StatefulSet {
	if sts.Annotations[SpecHashAnnotationKey] == "" {
		panic("spec hash annotation missing")
	}
	delete(sts.Annotations, SpecHashAnnotationKey)
	return sts
}

func TestSetDefaults(t *testing.T) {
	l := &v1alpha1.LeaderWorkerSet{}
	SetDefaults(l)
	want := v1alpha1.LeaderWorkerSetSpec{
		Replicas: ptr.To[int32](1),
		LeaderWorkerTemplate: v1alpha1.LeaderWorkerTemplate{
			Size:                                 ptr.To[int32](1),
			RestartPolicy:                        v1alpha1.RecreateGroupOnPodRestart,
			PersistentVolumeClaimRetentionPolicy: retain,
		},
		RolloutStrategy: v1alpha1.RolloutStrategy{
			Type: v1alpha1.RollingUpdateStrategyType,
			RollingUpdateConfiguration: &v1alpha1.RollingUpdateConfiguration{
				MaxUnavailable: intstr.FromInt32(1), MaxSurge: intstr.FromInt32(0), Partition: ptr.To[int32](0),
			},
		},
		StartupPolicy: v1alpha1.LeaderCreatedStartupPolicy,
		NetworkConfig: &v1alpha1.NetworkConfig{SubdomainPolicy: ptr.To(v1alpha1.SubdomainShared)},
	}
	if d := cmp.Diff(want, l.Spec); d != "" {
		t.Errorf("defaults (-want +got):\n%s", d)
	}
	sg := &v1alpha1.LeaderWorkerSet{Spec: v1alpha1.LeaderWorkerSetSpec{LeaderWorkerTemplate: v1alpha1.LeaderWorkerTemplate{
		SubGroupPolicy: &v1alpha1.SubGroupPolicy{SubGroupSize: ptr.To[int32](2)}}}}
	SetDefaults(sg)
	if got := sg.Spec.LeaderWorkerTemplate.SubGroupPolicy.Type; got == nil || *got != v1alpha1.SubGroupPolicyTypeLeaderWorker {
		t.Errorf("subGroupPolicyType defaulted to %v, want LeaderWorker", got)
	}

	old := &v1alpha1.LeaderWorkerSet{}
	old.Spec.LeaderWorkerTemplate.RestartPolicy = v1alpha1.DeprecatedDefaultRestartPolicy
	old.Spec.LeaderWorkerTemplate.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{WhenDeleted: appsv1.DeletePersistentVolumeClaimRetentionPolicyType}
	SetDefaults(old)
	if got := old.Spec.LeaderWorkerTemplate.RestartPolicy; got != v1alpha1.NoneRestartPolicy {
		t.Errorf("Default restart policy became %q, want None", got)
	}
	if got := *old.Spec.LeaderWorkerTemplate.PersistentVolumeClaimRetentionPolicy; got.WhenDeleted != "Delete" || got.WhenScaled != "Retain" {
		t.Errorf("retention policy = %+v, want Delete/Retain", got)
	}
}

func TestLeaderStatefulSet(t *testing.T) {
	tests := []struct {
		name string
		lws  *v1alpha1.LeaderWorkerSet
		want func(*appsv1.StatefulSet)
	}{
		{
			name: "worker template used for leader, shared subdomain",
			lws:  testLWS(),
			want: func(*appsv1.StatefulSet) {},
		},
		{
			name: "leader template, claims, delete policy, scheduling policy, unique subdomain",
			lws: testLWS(func(l *v1alpha1.LeaderWorkerSet) {
				lt := container("leader")
				lt.Labels = map[string]string{"role": "leader"}
				l.Spec.LeaderWorkerTemplate.LeaderTemplate = &lt
				l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{claim("data")}
				l.Spec.LeaderWorkerTemplate.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
					WhenDeleted: appsv1.DeletePersistentVolumeClaimRetentionPolicyType, WhenScaled: appsv1.DeletePersistentVolumeClaimRetentionPolicyType}
				l.Spec.LeaderWorkerTemplate.SchedulingPolicy = &v1alpha1.SchedulingPolicy{
					ReplicaUniqueNodeSelector: "pool",
					ReplicaUniqueToleration:   &v1alpha1.ReplicaUniqueToleration{Key: "dedicated", Effect: corev1.TaintEffectNoSchedule},
				}
				l.Spec.NetworkConfig = &v1alpha1.NetworkConfig{SubdomainPolicy: ptr.To(v1alpha1.SubdomainUniquePerReplica)}
				l.Spec.RolloutStrategy.RollingUpdateConfiguration = &v1alpha1.RollingUpdateConfiguration{
					MaxUnavailable: intstr.FromString("50%"), MaxSurge: intstr.FromInt32(1)}
			}),
			want: func(s *appsv1.StatefulSet) {
				s.Spec.Template.Spec.Containers[0].Name = "leader"
				s.Spec.Template.Labels["role"] = "leader"
				s.Spec.Template.Annotations[v1alpha1.SubdomainPolicyAnnotationKey] = "UniquePerReplica"
				s.Spec.Template.Annotations[v1alpha1.ReplicaUniqueNodeSelectorAnnotationKey] = "pool"
				s.Spec.Template.Annotations[v1alpha1.ReplicaUniqueTolerationKeyAnnotationKey] = "dedicated"
				s.Spec.Template.Annotations[v1alpha1.ReplicaUniqueTolerationEffectAnnotationKey] = "NoSchedule"
				c := claim("data")
				c.UID = ""
				s.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{c}
				s.Spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{WhenDeleted: "Delete", WhenScaled: "Delete"}
				s.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(2)) // 50% of 2 + 1
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := &appsv1.StatefulSet{
				TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
				ObjectMeta: metav1.ObjectMeta{
					Name: "lws", Namespace: "ns",
					Labels:      map[string]string{"team": "a", v1alpha1.SetNameLabelKey: "lws", v1alpha1.RevisionKey: "rev"},
					Annotations: map[string]string{v1alpha1.ReplicasAnnotationKey: "2"},
				},
				Spec: appsv1.StatefulSetSpec{
					Replicas:            ptr.To[int32](2),
					ServiceName:         "lws",
					PodManagementPolicy: appsv1.ParallelPodManagement,
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{
						v1alpha1.SetNameLabelKey: "lws", v1alpha1.WorkerIndexLabelKey: "0"}},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{
							Labels:      map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.WorkerIndexLabelKey: "0", v1alpha1.RevisionKey: "rev"},
							Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "3"},
						},
						Spec: container("worker").Spec,
					},
					UpdateStrategy: appsv1.StatefulSetUpdateStrategy{
						Type: appsv1.RollingUpdateStatefulSetStrategyType,
						RollingUpdate: &appsv1.RollingUpdateStatefulSetStrategy{
							Partition: ptr.To[int32](0), MaxUnavailable: ptr.To(intstr.FromInt32(1))},
					},
					PersistentVolumeClaimRetentionPolicy: retain,
				},
			}
			tc.want(want)
			got, err := LeaderStatefulSet(tc.lws, "rev", *tc.lws.Spec.Replicas, 0)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, withoutHash(got)); d != "" {
				t.Errorf("leader StatefulSet (-want +got):\n%s", d)
			}
		})
	}
}

func leaderPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: "lws-1", Namespace: "ns", UID: "uid-1",
		Labels: map[string]string{
			v1alpha1.SetNameLabelKey: "lws", v1alpha1.WorkerIndexLabelKey: "0", v1alpha1.GroupIndexLabelKey: "1",
			v1alpha1.GroupUniqueHashLabelKey: "key1", v1alpha1.RevisionKey: "rev-old",
		},
	}}
}

func TestWorkerStatefulSet(t *testing.T) {
	tests := []struct {
		name string
		lws  *v1alpha1.LeaderWorkerSet
		want func(*appsv1.StatefulSet)
	}{
		{name: "shared subdomain, no claims", lws: testLWS(), want: func(*appsv1.StatefulSet) {}},
		{
			name: "unique subdomain, claims and scheduling policy",
			lws: testLWS(func(l *v1alpha1.LeaderWorkerSet) {
				l.Spec.NetworkConfig = &v1alpha1.NetworkConfig{SubdomainPolicy: ptr.To(v1alpha1.SubdomainUniquePerReplica)}
				l.Spec.LeaderWorkerTemplate.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{claim("data")}
				l.Spec.LeaderWorkerTemplate.SchedulingPolicy = &v1alpha1.SchedulingPolicy{ReplicaUniqueNodeSelector: "pool"}
			}),
			want: func(s *appsv1.StatefulSet) {
				s.Spec.ServiceName = "lws-1"
				c := claim("data")
				c.UID = ""
				s.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{c}
				s.Spec.Template.Annotations[v1alpha1.ReplicaUniqueNodeSelectorAnnotationKey] = "pool"
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			group := map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.GroupIndexLabelKey: "1", v1alpha1.GroupUniqueHashLabelKey: "key1"}
			labels := map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.GroupIndexLabelKey: "1", v1alpha1.GroupUniqueHashLabelKey: "key1", v1alpha1.RevisionKey: "rev-old"}
			withTeam := map[string]string{"team": "a"}
			for k, v := range labels {
				withTeam[k] = v
			}
			want := &appsv1.StatefulSet{
				TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
				ObjectMeta: metav1.ObjectMeta{
					Name: "lws-1", Namespace: "ns", Labels: withTeam, Annotations: map[string]string{},
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "lws-1", UID: "uid-1",
						Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
				},
				Spec: appsv1.StatefulSetSpec{
					Replicas:            ptr.To[int32](2),
					ServiceName:         "lws",
					PodManagementPolicy: appsv1.ParallelPodManagement,
					Ordinals:            &appsv1.StatefulSetOrdinals{Start: 1},
					Selector:            &metav1.LabelSelector{MatchLabels: group},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{
							Labels:      labels,
							Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "3", v1alpha1.LeaderPodNameAnnotationKey: "lws-1"},
						},
						Spec: container("worker").Spec,
					},
					PersistentVolumeClaimRetentionPolicy: retain,
				},
			}
			tc.want(want)
			if d := cmp.Diff(want, withoutHash(WorkerStatefulSet(tc.lws, leaderPod(), nil))); d != "" {
				t.Errorf("worker StatefulSet (-want +got):\n%s", d)
			}
		})
	}
}

func TestHeadlessService(t *testing.T) {
	got := HeadlessService(testLWS(), "lws", map[string]string{v1alpha1.SetNameLabelKey: "lws"})
	want := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "lws", Namespace: "ns", Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws"}},
		Spec: corev1.ServiceSpec{ClusterIP: "None", Selector: map[string]string{v1alpha1.SetNameLabelKey: "lws"},
			PublishNotReadyAddresses: true},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("service (-want +got):\n%s", d)
	}
}

func TestTemplateHash(t *testing.T) {
	base := TemplateHash(testLWS())
	if h := TemplateHash(testLWS(func(l *v1alpha1.LeaderWorkerSet) { l.Spec.Replicas = ptr.To[int32](7) })); h != base {
		t.Errorf("scaling changed the revision: %s != %s", h, base)
	}
	if h := TemplateHash(testLWS(func(l *v1alpha1.LeaderWorkerSet) {
		l.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Image = "other"
	})); h == base {
		t.Error("changing the worker image kept the revision")
	}
	if h := TemplateHash(testLWS(func(l *v1alpha1.LeaderWorkerSet) { l.Spec.LeaderWorkerTemplate.Size = ptr.To[int32](4) })); h == base {
		t.Error("changing the size kept the revision")
	}
}

func TestLeaderStatefulSetHashIgnoresNothingThatMatters(t *testing.T) {
	a, _ := LeaderStatefulSet(testLWS(), "rev", 2, 0)
	b, _ := LeaderStatefulSet(testLWS(func(l *v1alpha1.LeaderWorkerSet) { l.Spec.Replicas = ptr.To[int32](3) }), "rev", 3, 0)
	if a.Annotations[SpecHashAnnotationKey] == b.Annotations[SpecHashAnnotationKey] {
		t.Error("a scale did not change the leader StatefulSet's spec hash")
	}
	c, _ := LeaderStatefulSet(testLWS(), "rev", 2, 0)
	if a.Annotations[SpecHashAnnotationKey] != c.Annotations[SpecHashAnnotationKey] {
		t.Error("the same input gave two spec hashes")
	}
	d, _ := LeaderStatefulSet(testLWS(), "rev", 2, 1)
	if a.Annotations[SpecHashAnnotationKey] == d.Annotations[SpecHashAnnotationKey] {
		t.Error("a partition change did not change the leader StatefulSet's spec hash")
	}
}

func TestParentNameAndOrdinal(t *testing.T) {
	for _, tc := range []struct {
		in     string
		parent string
		ord    int
	}{
		{"lws-0", "lws", 0}, {"lws-12-3", "lws-12", 3}, {"my-lws-4", "my-lws", 4},
		{"lws", "", -1}, {"lws-", "", -1}, {"lws-a", "", -1}, {"lws-01", "", -1},
	} {
		p, o := ParentNameAndOrdinal(tc.in)
		if p != tc.parent || o != tc.ord {
			t.Errorf("ParentNameAndOrdinal(%q) = %q, %d; want %q, %d", tc.in, p, o, tc.parent, tc.ord)
		}
	}
}
