package framework

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// FakeKubelet does for the pods that pods selects (fields.Everything() for all) and that are
// bound to one of nodes what a kubelet that starts every container at once would: it reports
// them Running and Ready, and confirms their deletion (a bound pod is only removed once its
// kubelet says so). It stops when the test ends. Nodes made by CreateNode have no kubelet; this
// stands in for one where a test needs pods to run or go away.
func FakeKubelet(t TB, c kubernetes.Interface, pods fields.Selector, nodes ...string) {
	t.Helper()
	mine := map[string]bool{}
	for _, n := range nodes {
		mine[n] = true
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	handle := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !mine[pod.Spec.NodeName] {
			return
		}
		if pod.DeletionTimestamp != nil {
			_ = c.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
				GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
			return
		}
		if pod.Status.Phase == corev1.PodRunning {
			return
		}
		_, _ = c.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, RunningPod(pod), metav1.UpdateOptions{})
	}
	lw := cache.NewFilteredListWatchFromClient(c.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.FieldSelector = pods.String() })
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Pod{},
		ResyncPeriod:  2 * time.Second, // retries updates that lost a race
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    handle,
			UpdateFunc: func(_, n any) { handle(n) },
		},
	})
	wg.Add(1)
	go func() { defer wg.Done(); informer.Run(ctx.Done()) }()
}

// RunningPod is pod as its kubelet reports it once every container started and is ready.
func RunningPod(pod *corev1.Pod) *corev1.Pod {
	p := pod.DeepCopy()
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.StartTime = &now
	p.Status.PodIP = "127.0.0.1"
	p.Status.PodIPs = []corev1.PodIP{{IP: "127.0.0.1"}}
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	p.Status.ContainerStatuses = nil
	for _, ctr := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: ctr.Name, Image: ctr.Image, ImageID: ctr.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	return p
}
