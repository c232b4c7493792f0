package framework

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// CreateNamespace creates a namespace named <prefix>-<random> and deletes it when the test ends,
// so that tests sharing a control plane do not see each other's objects.
func CreateNamespace(t TB, cp *ControlPlane, prefix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	ns, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		_ = cp.Client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// DeleteAllPods deletes the pods of namespace and waits, until ctx ends, for them to be gone
// (with a kubelet: until it has torn their volumes down).
func DeleteAllPods(ctx context.Context, cp *ControlPlane, namespace string) error {
	pods := cp.Client.CoreV1().Pods(namespace)
	// A failed delete shows as pods that do not go.
	_ = pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	return wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := pods.List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, nil
	})
}
