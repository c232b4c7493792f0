package notebook

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// The reconciler on a fake client: phases, the missing-volume condition and the timeout. The same
// flows run against a real API server in test/integration/workloads.
func TestReconcilerPhases(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	job := testJob(func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "models",
			PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "models-pvc"}}}
	})
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(job).WithStatusSubresource(job).Build()
	now := time.Now()
	r := &Reconciler{Client: c, APIReader: c, Images: Images{Git: "git"}, Now: func() time.Time { return now }}
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "ns", Name: "nb"}
	reconcile := func() (ctrl.Result, *v1alpha1.NotebookValidationJob) {
		t.Helper()
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		if err != nil {
			t.Fatal(err)
		}
		var got v1alpha1.NotebookValidationJob
		if err := c.Get(ctx, key, &got); err != nil {
			t.Fatal(err)
		}
		return res, &got
	}

	res, got := reconcile()
	cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionVolumesReady)
	if got.Status.Phase != v1alpha1.NotebookPhasePending || cond == nil || cond.Status != metav1.ConditionFalse ||
		!strings.Contains(cond.Message, `PersistentVolumeClaim "models-pvc" (volume "models") not found`) || res.RequeueAfter == 0 {
		t.Fatalf("missing PVC: phase %q, condition %+v, result %+v", got.Status.Phase, cond, res)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods); err != nil || len(pods.Items) != 0 {
		t.Fatalf("pod created while its PVC is missing: %v %d", err, len(pods.Items))
	}

	if err := c.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "models-pvc"}}); err != nil {
		t.Fatal(err)
	}
	_, got = reconcile()
	if got.Status.PodName != "nb-validation" || !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.NotebookConditionVolumesReady) {
		t.Fatalf("after the PVC appeared: %+v", got.Status)
	}

	var pod corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "nb-validation"}, &pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.CreationTimestamp = metav1.NewTime(now)
	if err := c.Status().Update(ctx, &pod); err != nil {
		t.Fatal(err)
	}
	res, got = reconcile()
	if got.Status.Phase != v1alpha1.NotebookPhaseRunning || got.Status.StartTime == nil || res.RequeueAfter <= 0 {
		t.Fatalf("running: %+v, %+v", got.Status, res)
	}

	// Past the 5-minute timeout the pod is deleted and the job fails.
	now = now.Add(6 * time.Minute)
	_, got = reconcile()
	if got.Status.Phase != v1alpha1.NotebookPhaseFailed || got.Status.CompletionTime == nil ||
		meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionComplete).Reason != v1alpha1.ReasonTimedOut {
		t.Fatalf("timeout: %+v", got.Status)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(&pod), &pod); err == nil {
		t.Fatal("pod not deleted on timeout")
	}
}

func TestFailureMessage(t *testing.T) {
	pod := &corev1.Pod{Status: corev1.PodStatus{
		InitContainerStatuses: []corev1.ContainerStatus{{Name: "git-clone", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "Error", Message: "repository not found"}}}},
	}}
	if got, want := failureMessage(pod), "container git-clone exited with code 128 (Error): repository not found"; got != want {
		t.Errorf("failureMessage = %q, want %q", got, want)
	}
}
