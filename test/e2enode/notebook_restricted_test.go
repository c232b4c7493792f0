package e2enode

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/test/framework/realnode"
)

// testRestrictedTimestamps: in a namespace that enforces Pod Security "restricted", a notebook at a
// commit SHA, whose cells print the time, runs on the real kubelet and matches a golden notebook
// recorded at another time once timestamps are ignored (Succeeded, the commit in its status); the
// same job without the ignore pattern fails on the first timestamp.
func testRestrictedTimestamps(t *testing.T, c *cluster, cl client.Client, git *realnode.GitServer) {
	ctx := context.Background()
	url := git.CreateRepo(t, "stamped", map[string]string{
		"notebooks/stamped.ipynb": notebookJSON(t, "timestamps", "date started at", "print accuracy 0.9120", "date finished at"),
		"golden/stamped.ipynb": goldenJSON(t, "started at 2024-01-02T03:04:05.123456789Z\n", "accuracy 0.9120\n",
			"finished at 2024-01-02T03:05:00Z\n"),
	})
	sha := git.Head(t, "stamped")

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "restricted-",
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	ns, err := c.cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cp.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})

	job := func(name string, ignore bool) *v1alpha1.NotebookValidationJob {
		j := newNotebookJob(ns.Name, name, url, sha, "notebooks/stamped.ipynb", c.bins.Images["papermill"].Ref)
		j.Spec.PodConfig.Resources = &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")}}
		j.Spec.GoldenNotebook = &v1alpha1.GoldenNotebook{Path: "golden/stamped.ipynb"}
		if ignore {
			j.Spec.GoldenNotebook.IgnorePatterns = []string{`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`}
		}
		return j
	}
	ignoring, strict := job("stamped", true), job("stamped-strict", false)
	for _, j := range []*v1alpha1.NotebookValidationJob{ignoring, strict} {
		if err := cl.Create(ctx, j); err != nil {
			t.Fatalf("creating NotebookValidationJob %s: %v", j.Name, err)
		}
	}
	got := waitJobDone(t, c.cp, cl, ignoring)
	if got.Status.Phase != v1alpha1.NotebookPhaseSucceeded || got.Status.Commit != sha {
		t.Errorf("job %s is %s (commit %q, want %s): %s", got.Name, got.Status.Phase, got.Status.Commit, sha, got.Status.Message)
	}
	got = waitJobDone(t, c.cp, cl, strict)
	complete := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionComplete)
	if got.Status.Phase != v1alpha1.NotebookPhaseFailed || complete == nil || complete.Reason != v1alpha1.ReasonGoldenMismatch ||
		!strings.Contains(got.Status.Message, "cell 1: stream stdout differs") {
		t.Errorf("job %s without the pattern: %s %+v: %s", got.Name, got.Status.Phase, complete, got.Status.Message)
	}
	for _, j := range []*v1alpha1.NotebookValidationJob{ignoring, strict} {
		_ = cl.Delete(ctx, j)
	}
}
