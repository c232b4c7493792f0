package workloads_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook"
)

// TestNotebookJobRestrictedNamespace: in a namespace that enforces Pod Security "restricted" and
// has a ResourceQuota on requests and limits (and no LimitRange), a job with a commit SHA ref, a
// golden notebook in another repository with credentials of its own and volatile output to
// ignore, an image pull Secret and one retry gets its pod admitted by the API server, is retried
// once after a failed run, and Succeeds with the commit the clone used in its status. (The pods
// run for real, on a kubelet, in test/e2enode.)
func TestNotebookJobRestrictedNamespace(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "nb-restricted")
	var nsObj corev1.Namespace
	if err := cl.Get(ctx, client.ObjectKey{Name: ns}, &nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if err := cl.Update(ctx, &nsObj); err != nil {
		t.Fatal(err)
	}
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "compute"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests.cpu": resource.MustParse("8"), "limits.cpu": resource.MustParse("8"),
			"requests.memory": resource.MustParse("16Gi"), "limits.memory": resource.MustParse("16Gi")}}}
	if err := cl.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	const sha = "3f786850e387550fdab836ed7e6dc881de23001b"
	const goldenSHA = "89e6c98d92887913cadf06b2adb97f26cde4849b"
	job := newJob(ns, "hardened", func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.Notebook.Git.Ref = sha
		j.Spec.Retries = ptr.To[int32](1)
		j.Spec.PodConfig.Env = nil
		j.Spec.PodConfig.Resources = &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("2Gi")}}
		j.Spec.PodConfig.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000)}
		j.Spec.PodConfig.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
		j.Spec.GoldenNotebook = &v1alpha1.GoldenNotebook{Path: "golden/explore.ipynb",
			Git:               &v1alpha1.GitSource{URL: "https://git.invalid/golden.git", Ref: "v1", CredentialsSecret: "golden-creds"},
			IgnoreOutputTypes: []v1alpha1.OutputType{"stderr"},
			IgnorePatterns:    []string{`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?`}}
	})
	if err := cl.Create(ctx, job); err != nil {
		t.Fatal(err)
	}

	pod := waitPod(t, ns, "hardened-validation")
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || c.Resources.Limits.Cpu().IsZero() {
			t.Errorf("container %s: securityContext %+v resources %+v", c.Name, c.SecurityContext, c.Resources)
		}
	}
	if len(pod.Spec.ImagePullSecrets) != 1 || pod.Spec.ImagePullSecrets[0].Name != "registry" {
		t.Errorf("imagePullSecrets %v", pod.Spec.ImagePullSecrets)
	}
	// The namespace does enforce: the same pod without the controller's securityContext is refused.
	bare := pod.DeepCopy()
	bare.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: "bare"}
	bare.Spec.SecurityContext = nil
	for i := range bare.Spec.InitContainers {
		bare.Spec.InitContainers[i].SecurityContext = nil
	}
	bare.Spec.Containers[0].SecurityContext = nil
	if err := cl.Create(ctx, bare, client.DryRunAll); err == nil || !strings.Contains(err.Error(), `violates PodSecurity "restricted`) {
		t.Errorf("a pod without securityContext in the restricted namespace: %v", err)
	}

	// The first run fails after the clone resolved the SHA: retried, in a pod of its own.
	finishPod(t, pod, "commit="+sha+" golden-commit="+goldenSHA, notebook.NotebookContainer, 1)
	retry := waitPod(t, ns, "hardened-validation-1")
	got := getJob(t, job)
	if got.Status.Retries != 1 || got.Status.Commit != sha {
		t.Errorf("after the failed run: %+v", got.Status)
	}
	finishPod(t, retry, "commit="+sha+" golden-commit="+goldenSHA, notebook.CompareContainer, 0)
	got = waitPhase(t, job, v1alpha1.NotebookPhaseSucceeded)
	if got.Status.Commit != sha || got.Status.GoldenCommit != goldenSHA || got.Status.Retries != 1 {
		t.Errorf("status %+v", got.Status)
	}
}

// finishPod reports, as a kubelet would, a pod whose clone succeeded with message cloneMsg and
// whose container last exited with exit.
func finishPod(t *testing.T, pod *corev1.Pod, cloneMsg, last string, exit int32) {
	t.Helper()
	now := metav1.Now()
	pod.Status.Phase = corev1.PodSucceeded
	if exit != 0 {
		pod.Status.Phase = corev1.PodFailed
	}
	pod.Status.StartTime = &now
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: notebook.GitCloneContainer,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Message: cloneMsg, StartedAt: now, FinishedAt: now}}}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: last,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Message: fmt.Sprint("exit ", exit), StartedAt: now, FinishedAt: now}}}}
	if err := cl.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}
