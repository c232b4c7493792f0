package lws

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

func TestDefaultPod(t *testing.T) {
	env := func(addr, size, idx string, rest ...corev1.EnvVar) []corev1.EnvVar {
		return append([]corev1.EnvVar{
			{Name: v1alpha1.LwsLeaderAddress, Value: addr},
			{Name: v1alpha1.LwsGroupSize, Value: size},
			{Name: v1alpha1.LwsWorkerIndex, Value: idx},
		}, rest...)
	}
	tests := []struct {
		name    string
		pod     *corev1.Pod
		want    *corev1.Pod
		wantErr string
	}{
		{
			name: "not a LeaderWorkerSet pod is left alone",
			pod:  &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x-0", Labels: map[string]string{"a": "b"}}},
			want: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x-0", Labels: map[string]string{"a": "b"}}},
		},
		{
			name: "leader gets group index, group key and env first, replacing user LWS_ values",
			pod: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "lws-1", Namespace: "ns",
					Labels:      map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.WorkerIndexLabelKey: "0"},
					Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "3"}},
				Spec: corev1.PodSpec{Subdomain: "lws", Containers: []corev1.Container{{Name: "c", Env: []corev1.EnvVar{
					{Name: v1alpha1.LwsGroupSize, Value: "99"}, {Name: "A", Value: "$(LWS_GROUP_SIZE)"},
					{Name: v1alpha1.LwsLeaderAddress, Value: "elsewhere"}}}}},
			},
			want: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "lws-1", Namespace: "ns",
					Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.WorkerIndexLabelKey: "0",
						v1alpha1.GroupIndexLabelKey: "1", v1alpha1.GroupUniqueHashLabelKey: GroupKey("ns", "lws-1")},
					Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "3"}},
				Spec: corev1.PodSpec{Subdomain: "lws", Containers: []corev1.Container{{Name: "c",
					Env: env("lws-1.lws.ns", "3", "0", corev1.EnvVar{Name: "A", Value: "$(LWS_GROUP_SIZE)"})}}},
			},
		},
		{
			name: "unique-per-replica leader gets its own subdomain",
			pod: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "lws-0", Namespace: "ns",
					Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.WorkerIndexLabelKey: "0"},
					Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "1",
						v1alpha1.SubdomainPolicyAnnotationKey: "UniquePerReplica"}},
				Spec: corev1.PodSpec{Subdomain: "lws", Containers: []corev1.Container{{Name: "c"}}},
			},
			want: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "lws-0", Namespace: "ns",
					Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.WorkerIndexLabelKey: "0",
						v1alpha1.GroupIndexLabelKey: "0", v1alpha1.GroupUniqueHashLabelKey: GroupKey("ns", "lws-0")},
					Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "1",
						v1alpha1.SubdomainPolicyAnnotationKey: "UniquePerReplica"}},
				Spec: corev1.PodSpec{Subdomain: "lws-0", Containers: []corev1.Container{{Name: "c", Env: env("lws-0.lws-0.ns", "1", "0")}}},
			},
		},
		{
			name: "worker gets its index, env in init containers too (replacing a user LWS_WORKER_INDEX), and the scheduling policy",
			pod: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "lws-1-2", Namespace: "ns",
					Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.GroupIndexLabelKey: "1"},
					Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "3", v1alpha1.LeaderPodNameAnnotationKey: "lws-1",
						v1alpha1.ReplicaUniqueNodeSelectorAnnotationKey:     "pool",
						v1alpha1.ReplicaUniqueTolerationKeyAnnotationKey:    "dedicated",
						v1alpha1.ReplicaUniqueTolerationEffectAnnotationKey: "NoExecute"}},
				Spec: corev1.PodSpec{Subdomain: "lws", InitContainers: []corev1.Container{{Name: "i"}},
					Containers:   []corev1.Container{{Name: "c", Env: []corev1.EnvVar{{Name: v1alpha1.LwsWorkerIndex, Value: "mine"}}}},
					NodeSelector: map[string]string{"zone": "a"}},
			},
			want: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "lws-1-2", Namespace: "ns",
					Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.GroupIndexLabelKey: "1", v1alpha1.WorkerIndexLabelKey: "2"},
					Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "3", v1alpha1.LeaderPodNameAnnotationKey: "lws-1",
						v1alpha1.ReplicaUniqueNodeSelectorAnnotationKey:     "pool",
						v1alpha1.ReplicaUniqueTolerationKeyAnnotationKey:    "dedicated",
						v1alpha1.ReplicaUniqueTolerationEffectAnnotationKey: "NoExecute"}},
				Spec: corev1.PodSpec{Subdomain: "lws",
					InitContainers: []corev1.Container{{Name: "i", Env: env("lws-1.lws.ns", "3", "2")}},
					Containers:     []corev1.Container{{Name: "c", Env: env("lws-1.lws.ns", "3", "2")}},
					NodeSelector:   map[string]string{"zone": "a", "pool": "lws-1"},
					Tolerations:    []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "lws-1", Effect: corev1.TaintEffectNoExecute}},
				},
			},
		},
		{
			name: "leader scheduling policy uses its own name",
			pod: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "lws-0", Namespace: "ns",
					Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.WorkerIndexLabelKey: "0"},
					Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "2",
						v1alpha1.ReplicaUniqueNodeSelectorAnnotationKey: "pool"}},
				Spec: corev1.PodSpec{Subdomain: "lws"},
			},
			want: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "lws-0", Namespace: "ns",
					Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.WorkerIndexLabelKey: "0",
						v1alpha1.GroupIndexLabelKey: "0", v1alpha1.GroupUniqueHashLabelKey: GroupKey("ns", "lws-0")},
					Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "2",
						v1alpha1.ReplicaUniqueNodeSelectorAnnotationKey: "pool"}},
				Spec: corev1.PodSpec{Subdomain: "lws", NodeSelector: map[string]string{"pool": "lws-0"}},
			},
		},
		{
			name:    "failure case - size annotation missing",
			pod:     &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lws-0", Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws"}}},
			wantErr: "annotation leaderworkerset.sigs.k8s.io/size is missing",
		},
		{
			name: "failure case - bad toleration effect",
			pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lws-0",
				Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.WorkerIndexLabelKey: "0"},
				Annotations: map[string]string{v1alpha1.SizeAnnotationKey: "1",
					v1alpha1.ReplicaUniqueTolerationKeyAnnotationKey: "k", v1alpha1.ReplicaUniqueTolerationEffectAnnotationKey: "Sometimes"}}},
			wantErr: `replicaUniqueTolerationEffect="Sometimes" is not NoSchedule, PreferNoSchedule or NoExecute`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := DefaultPod(tc.pod)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, tc.pod); d != "" {
				t.Errorf("pod (-want +got):\n%s", d)
			}
			// Defaulting twice changes nothing (the webhook may be called again on retries).
			again := tc.pod.DeepCopy()
			if err := DefaultPod(again); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.pod, again); d != "" {
				t.Errorf("second defaulting changed the pod:\n%s", d)
			}
		})
	}
}
