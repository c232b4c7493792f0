package notebook

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

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
	reconcile := func() (ctrl.Result, *v1alpha1.NotebookValidationJob) { return reconcileJob(t, r, c) }

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

// A pod the API server refuses: invalid fails the job with the server's message; anything else
// (here a quota) keeps it Pending with PodCreated=False and is tried again, and the condition goes
// once the pod is created.
func TestReconcilerPodCreateRefused(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	podGR := schema.GroupResource{Resource: "pods"}
	tests := []struct {
		name      string
		refusal   error
		wantPhase v1alpha1.NotebookPhase
		retried   bool
	}{
		{
			name: "failure case - invalid pod fails the job",
			refusal: apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "nb-validation", field.ErrorList{
				field.Invalid(field.NewPath("spec", "volumes").Index(2).Child("configMap", "items").Index(0).Child("path"), "../x", "must not contain '..'")}),
			wantPhase: v1alpha1.NotebookPhaseFailed,
		},
		{
			name:      "failure case - quota keeps the job pending and retries",
			refusal:   apierrors.NewForbidden(podGR, "nb-validation", errors.New("exceeded quota: pods, requested: pods=1, used: pods=10, limited: pods=10")),
			wantPhase: v1alpha1.NotebookPhasePending,
			retried:   true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			job := testJob()
			refuse := true
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(job).WithStatusSubresource(job).
				WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					if _, ok := obj.(*corev1.Pod); ok && refuse {
						return tc.refusal
					}
					return c.Create(ctx, obj, opts...)
				}}).Build()
			r := &Reconciler{Client: c, APIReader: c, Images: Images{Git: "git"}}
			ctx := context.Background()
			key := client.ObjectKeyFromObject(job)
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
			if err != nil {
				t.Fatal(err)
			}
			var got v1alpha1.NotebookValidationJob
			if err := c.Get(ctx, key, &got); err != nil {
				t.Fatal(err)
			}
			if got.Status.Phase != tc.wantPhase || !strings.Contains(got.Status.Message, tc.refusal.Error()) {
				t.Fatalf("phase %q message %q, want %q with %q", got.Status.Phase, got.Status.Message, tc.wantPhase, tc.refusal.Error())
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionPodCreated)
			if !tc.retried {
				if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionComplete); c == nil || c.Reason != v1alpha1.ReasonPodCreateFailed {
					t.Fatalf("Complete condition %+v", c)
				}
				return
			}
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != v1alpha1.ReasonPodCreateFailed || res.RequeueAfter == 0 {
				t.Fatalf("PodCreated %+v, result %+v", cond, res)
			}
			refuse = false
			if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
				t.Fatal(err)
			}
			if err := c.Get(ctx, key, &got); err != nil {
				t.Fatal(err)
			}
			if got.Status.PodName != "nb-validation" || meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionPodCreated) != nil {
				t.Fatalf("after the quota freed: %+v", got.Status)
			}
		})
	}
}

// A failed run is retried in a new pod up to spec.retries; the commit the clone resolved is
// recorded; the last failure fails the job.
func TestReconcilerRetriesAndCommits(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	sha := strings.Repeat("ab", 20)
	job := testJob(func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.Notebook.Git.Ref = sha
		j.Spec.Retries = ptr.To[int32](1)
	})
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(job).WithStatusSubresource(job).Build()
	r := &Reconciler{Client: c, APIReader: c, Images: Images{Git: "git"}}
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "ns", Name: "nb"}
	reconcile := func() *v1alpha1.NotebookValidationJob {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
			t.Fatal(err)
		}
		var got v1alpha1.NotebookValidationJob
		if err := c.Get(ctx, key, &got); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	fail := func(name string) {
		t.Helper()
		var pod corev1.Pod
		if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: name}, &pod); err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = corev1.PodFailed
		pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: GitCloneContainer,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Message: "commit=" + sha + "\n"}}}}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: NotebookContainer,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "PapermillExecutionError"}}}}
		if err := c.Status().Update(ctx, &pod); err != nil {
			t.Fatal(err)
		}
	}
	if got := reconcile(); got.Status.PodName != "nb-validation" {
		t.Fatalf("first run: %+v", got.Status)
	}
	fail("nb-validation")
	got := reconcile()
	if got.Status.Phase != v1alpha1.NotebookPhasePending || got.Status.Retries != 1 || got.Status.Commit != sha ||
		!strings.Contains(got.Status.Message, "run failed, retrying (1 of 1): container notebook exited with code 1") {
		t.Fatalf("after the first failure: %+v", got.Status)
	}
	if got := reconcile(); got.Status.PodName != "nb-validation-1" {
		t.Fatalf("retry: %+v", got.Status)
	}
	fail("nb-validation-1")
	got = reconcile()
	if got.Status.Phase != v1alpha1.NotebookPhaseFailed || got.Status.Retries != 1 {
		t.Fatalf("after the last failure: %+v", got.Status)
	}
	// Both pods stay, with their logs, until the job goes.
	var pods corev1.PodList
	if err := c.List(ctx, &pods); err != nil || len(pods.Items) != 2 {
		t.Errorf("pods %d %v", len(pods.Items), err)
	}
}

// reconcileJob reconciles the job ns/nb once and reads it back from c.
func reconcileJob(t *testing.T, r *Reconciler, c client.Client) (ctrl.Result, *v1alpha1.NotebookValidationJob) {
	t.Helper()
	key := types.NamespacedName{Namespace: "ns", Name: "nb"}
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key})
	if err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.NotebookValidationJob
	if err := c.Get(context.Background(), key, &got); err != nil {
		t.Fatal(err)
	}
	return res, &got
}

// laggingCache is a client whose cache has not seen any pod yet.
type laggingCache struct{ client.Client }

func (l laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Pod); ok {
		return apierrors.NewNotFound(corev1.Resource("pods"), key.Name)
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

// TestReconcilerPodNotCachedYet: a job whose status names the pod it created, reconciled before
// the cache has seen that pod, waits for it rather than failing as if it were deleted; once the
// API server has no such pod either, it fails.
func TestReconcilerPodNotCachedYet(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	job := testJob(func(j *v1alpha1.NotebookValidationJob) {
		j.Status = v1alpha1.NotebookValidationJobStatus{Phase: v1alpha1.NotebookPhasePending, PodName: "nb-validation"}
	})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nb-validation"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(job, pod).WithStatusSubresource(job).Build()
	r := &Reconciler{Client: laggingCache{c}, APIReader: c, Images: Images{Git: "git"}}
	ctx := context.Background()
	reconcile := func() (ctrl.Result, v1alpha1.NotebookValidationJobStatus) {
		res, got := reconcileJob(t, r, c)
		return res, got.Status
	}
	if res, st := reconcile(); st.Phase != v1alpha1.NotebookPhasePending || res.RequeueAfter <= 0 {
		t.Fatalf("pod not in the cache yet: %+v, %+v; want Pending and a requeue", st, res)
	}
	if err := c.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, st := reconcile(); st.Phase != v1alpha1.NotebookPhaseFailed || !strings.Contains(st.Message, "deleted before it finished") {
		t.Fatalf("pod gone: %+v, want Failed", st)
	}
}
