package lws

import (
	"context"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// The restart policies as upstream's pod controller applies them: a worker that restarted a
// container recreates its group (the leader is deleted) unless the group restarts only once
// started and has not: a pod not created yet or one Pending.
func TestApplyRestartPolicy(t *testing.T) {
	const ns, key = "ns", "group-0-key"
	groupPod := func(name string, worker int, phase corev1.PodPhase) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: k8stypes.UID("uid-" + name),
				Labels: map[string]string{v1alpha1.SetNameLabelKey: "lws", v1alpha1.GroupIndexLabelKey: "0",
					v1alpha1.GroupUniqueHashLabelKey: key, v1alpha1.WorkerIndexLabelKey: fmt.Sprint(worker)}},
			Status: corev1.PodStatus{Phase: phase},
		}
		if worker > 0 {
			p.Annotations = map[string]string{v1alpha1.LeaderPodNameAnnotationKey: "lws-0"}
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "lws-0", UID: "sts-uid", Controller: ptr.To(true)}}
		}
		return p
	}
	leader := groupPod("lws-0", 0, corev1.PodRunning)
	workers := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lws-0", UID: "sts-uid",
		OwnerReferences: []metav1.OwnerReference{podOwnerRef(leader)}}}
	restarted := groupPod("lws-0-1", 1, corev1.PodRunning)
	restarted.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", RestartCount: 1}}

	for _, tc := range []struct {
		name       string
		policy     v1alpha1.RestartPolicyType
		annotated  bool
		others     []*corev1.Pod // the group's pods besides the leader and the restarted worker
		wantDelete bool
	}{
		{name: "RecreateGroupOnPodRestart recreates at once", policy: v1alpha1.RecreateGroupOnPodRestart, wantDelete: true},
		{name: "RecreateGroupAfterStart, started", policy: v1alpha1.RecreateGroupAfterStart,
			others: []*corev1.Pod{groupPod("lws-0-2", 2, corev1.PodRunning)}, wantDelete: true},
		{name: "RecreateGroupAfterStart, a pod not created yet", policy: v1alpha1.RecreateGroupAfterStart},
		{name: "RecreateGroupAfterStart, a pod Pending", policy: v1alpha1.RecreateGroupAfterStart,
			others: []*corev1.Pod{groupPod("lws-0-2", 2, corev1.PodPending)}},
		{name: "the experimental annotation, a pod not created yet", policy: v1alpha1.RecreateGroupOnPodRestart, annotated: true},
		{name: "the experimental annotation, started", policy: v1alpha1.RecreateGroupOnPodRestart, annotated: true,
			others: []*corev1.Pod{groupPod("lws-0-2", 2, corev1.PodRunning)}, wantDelete: true},
		{name: "None leaves it to the StatefulSet", policy: v1alpha1.NoneRestartPolicy,
			others: []*corev1.Pod{groupPod("lws-0-2", 2, corev1.PodRunning)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lws := testLWS(func(l *v1alpha1.LeaderWorkerSet) {
				l.Spec.LeaderWorkerTemplate.RestartPolicy = tc.policy
				if tc.annotated {
					l.Annotations = map[string]string{v1alpha1.RecreateGroupAfterStartAnnotationKey: "true"}
				}
			})
			objs := []runtime.Object{leader.DeepCopy(), restarted.DeepCopy(), workers.DeepCopy()}
			for _, p := range tc.others {
				objs = append(objs, p.DeepCopy())
			}
			scheme := runtime.NewScheme()
			_ = corev1.AddToScheme(scheme)
			_ = appsv1.AddToScheme(scheme)
			c := fake.NewClientBuilder().WithScheme(scheme).WithRuntimeObjects(objs...).Build()
			r := &PodReconciler{Client: c, Recorder: events.NewFakeRecorder(10)}
			recreating, err := r.applyRestartPolicy(context.Background(), restarted.DeepCopy(), lws)
			if err != nil {
				t.Fatal(err)
			}
			err = c.Get(context.Background(), client.ObjectKeyFromObject(leader), &corev1.Pod{})
			deleted := apierrors.IsNotFound(err)
			if deleted != tc.wantDelete || recreating != tc.wantDelete {
				t.Errorf("leader deleted %v, recreating %v; want %v", deleted, recreating, tc.wantDelete)
			}
		})
	}
}
