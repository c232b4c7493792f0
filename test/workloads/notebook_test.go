package workloads_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/util/retry"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

func newJob(ns, name string, mods ...func(*v1alpha1.NotebookValidationJob)) *v1alpha1.NotebookValidationJob {
	j := &v1alpha1.NotebookValidationJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.NotebookValidationJobSpec{
			Notebook: v1alpha1.NotebookSource{
				Git:  v1alpha1.GitSource{URL: "https://git.invalid/notebooks.git", Ref: "main"},
				Path: "eda/explore.ipynb",
			},
			PodConfig: v1alpha1.PodConfig{ContainerImage: "registry.invalid/papermill:1",
				Env: []corev1.EnvVar{{Name: "EPOCHS", Value: "2"}}},
		},
	}
	for _, m := range mods {
		m(j)
	}
	return j
}

func getJob(t *testing.T, j *v1alpha1.NotebookValidationJob) *v1alpha1.NotebookValidationJob {
	t.Helper()
	var got v1alpha1.NotebookValidationJob
	if err := cl.Get(testutil.Context(t), client.ObjectKeyFromObject(j), &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

// setPodPhase reports a phase for the job's pod, as a kubelet would.
func setPodPhase(t *testing.T, ns, name string, phase corev1.PodPhase, exit int32) {
	t.Helper()
	var pod corev1.Pod
	if err := cl.Get(testutil.Context(t), types.NamespacedName{Namespace: ns, Name: name}, &pod); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	pod.Status.Phase = phase
	pod.Status.StartTime = &now
	if phase == corev1.PodFailed || phase == corev1.PodSucceeded {
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "notebook", Image: pod.Spec.Containers[0].Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: "Error",
				Message: "PapermillExecutionError", StartedAt: now, FinishedAt: now}}}}
	}
	if err := cl.Status().Update(testutil.Context(t), &pod); err != nil {
		t.Fatal(err)
	}
}

func waitPhase(t *testing.T, j *v1alpha1.NotebookValidationJob, phase v1alpha1.NotebookPhase) *v1alpha1.NotebookValidationJob {
	t.Helper()
	var got *v1alpha1.NotebookValidationJob
	testutil.Eventually(t, time.Minute, "phase "+string(phase), func() error {
		got = getJob(t, j)
		if got.Status.Phase != phase {
			return fmt.Errorf("phase %q (%s)", got.Status.Phase, got.Status.Message)
		}
		return nil
	})
	return got
}

// waitPod waits for a pod the controller creates.
func waitPod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	testutil.Eventually(t, time.Minute, "pod "+name, func() error {
		return cl.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &pod)
	})
	return &pod
}

// TestNotebookJobRuns: a valid job gets its pod (git-clone init container, papermill, the user's
// volumes where asked, env merged) and follows the pod to Succeeded or Failed.
func TestNotebookJobRuns(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "nb-run")
	if err := cl.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "params"}, Data: map[string]string{"a": "1"}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		phase corev1.PodPhase
		want  v1alpha1.NotebookPhase
	}{{"ok", corev1.PodSucceeded, v1alpha1.NotebookPhaseSucceeded}, {"broken", corev1.PodFailed, v1alpha1.NotebookPhaseFailed}} {
		t.Run(tc.name, func(t *testing.T) {
			job := newJob(ns, tc.name, func(j *v1alpha1.NotebookValidationJob) {
				j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{
					{Name: "params", ConfigMap: &v1alpha1.ConfigMapVolumeSource{Name: "params"}},
					{Name: "dataset", CSI: &v1alpha1.CSIVolumeSource{Driver: "cistern.csi.dev", VolumeAttributes: map[string]string{"source": "s3://b/p"}}},
				}
				j.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{{Name: "params", MountPath: "/params", ReadOnly: true}}
			})
			if err := cl.Create(ctx, job); err != nil {
				t.Fatal(err)
			}
			got := waitPhase(t, job, v1alpha1.NotebookPhasePending)
			testutil.Eventually(t, time.Minute, "pod created", func() error {
				got = getJob(t, job)
				if got.Status.PodName == "" {
					return fmt.Errorf("no pod yet")
				}
				return nil
			})
			var pod corev1.Pod
			if err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: got.Status.PodName}, &pod); err != nil {
				t.Fatal(err)
			}
			if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Name != "git-clone" ||
				pod.Spec.Containers[0].Command[0] != "papermill" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("pod shape: %+v", pod.Spec)
			}
			mounts := map[string]string{}
			for _, m := range pod.Spec.Containers[0].VolumeMounts {
				mounts[m.Name] = m.MountPath
			}
			if mounts["params"] != "/params" || mounts["git-clone"] != "/workspace" || mounts["notebook-data"] != "/output" || mounts["dataset"] != "" {
				t.Errorf("mounts %v", mounts)
			}
			env := map[string]string{}
			for _, e := range pod.Spec.Containers[0].Env {
				env[e.Name] = e.Value
			}
			if env["EPOCHS"] != "2" || env["NOTEBOOK_PATH"] != "eda/explore.ipynb" {
				t.Errorf("env %v", env)
			}

			setPodPhase(t, ns, pod.Name, corev1.PodRunning, 0)
			got = waitPhase(t, job, v1alpha1.NotebookPhaseRunning)
			if got.Status.StartTime == nil {
				t.Error("no start time")
			}
			setPodPhase(t, ns, pod.Name, tc.phase, map[corev1.PodPhase]int32{corev1.PodFailed: 1}[tc.phase])
			got = waitPhase(t, job, tc.want)
			if got.Status.CompletionTime == nil || !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.NotebookConditionComplete) {
				t.Errorf("completion: %+v", got.Status)
			}
			if tc.want == v1alpha1.NotebookPhaseFailed && !strings.Contains(got.Status.Message, "container notebook exited with code 1") {
				t.Errorf("failure message %q", got.Status.Message)
			}
		})
	}
}

// TestNotebookJobMissingVolume: a job whose PVC does not exist says so in a condition and starts
// once the claim appears.
func TestNotebookJobMissingVolume(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "nb-missing")
	job := newJob(ns, "waits", func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "models",
			PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "models"}}}
		j.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{{Name: "models", MountPath: "/models"}}
	})
	if err := cl.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "VolumesReady=False naming the claim", func() error {
		c := meta.FindStatusCondition(getJob(t, job).Status.Conditions, v1alpha1.NotebookConditionVolumesReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonVolumeMissing ||
			!strings.Contains(c.Message, `PersistentVolumeClaim "models" (volume "models") not found`) {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	if err := cl.Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "models"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resourceQ("1Gi")}}},
	}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "pod created once the claim exists", func() error {
		got := getJob(t, job)
		if !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.NotebookConditionVolumesReady) || got.Status.PodName == "" {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
}

// TestNotebookJobTimeout: a run past its timeout fails and its pod is deleted.
func TestNotebookJobTimeout(t *testing.T) {
	cp := setup(t)
	ns := framework.CreateNamespace(t, cp, "nb-timeout")
	job := newJob(ns, "slow", func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.Timeout = &metav1.Duration{Duration: 3 * time.Second}
	})
	if err := cl.Create(testutil.Context(t), job); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "pod", func() error {
		if getJob(t, job).Status.PodName == "" {
			return fmt.Errorf("no pod")
		}
		return nil
	})
	setPodPhase(t, ns, "slow-validation", corev1.PodRunning, 0)
	got := waitPhase(t, job, v1alpha1.NotebookPhaseFailed)
	if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionComplete); c == nil || c.Reason != v1alpha1.ReasonTimedOut {
		t.Errorf("condition %+v", c)
	}
	testutil.Eventually(t, time.Minute, "pod deleted or terminating", func() error {
		var pod corev1.Pod
		err := cl.Get(testutil.Context(t), types.NamespacedName{Namespace: ns, Name: "slow-validation"}, &pod)
		if err == nil && pod.DeletionTimestamp == nil {
			return fmt.Errorf("pod still there")
		}
		return nil
	})
}

// TestNotebookJobAdmission: invalid volumes are refused at admission with the field named.
func TestNotebookJobAdmission(t *testing.T) {
	cp, ns, ctx := setupNamespace(t, "nb-adm")
	// hostPath is not a field of the API: send it raw, as kubectl would.
	hostPath := fmt.Sprintf(`apiVersion: workloads.cistern.dev/v1alpha1
kind: NotebookValidationJob
metadata: {name: host, namespace: %s}
spec:
  notebook: {git: {url: "https://git.invalid/r.git"}, path: a.ipynb}
  podConfig:
    containerImage: img
    volumes: [{name: etc, hostPath: {path: /etc}}]
    volumeMounts: [{name: etc, mountPath: /host-etc}]
`, ns)
	out, err := framework.KubectlOutput(cp, hostPath, "apply", "-f", "-")
	if err == nil || !strings.Contains(out, "spec.podConfig.volumes[0].hostPath: Forbidden: volume type hostPath is not allowed") {
		t.Errorf("hostPath accepted or wrong message: %v\n%s", err, out)
	}

	for _, tc := range []struct {
		name string
		mod  func(*v1alpha1.NotebookValidationJob)
		want string
	}{
		{"reserved volume name", func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "git-clone", EmptyDir: &v1alpha1.EmptyDirVolumeSource{}}}
		}, `spec.podConfig.volumes[0].name: Invalid value: "git-clone": is used by the controller`},
		{"two sources", func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "x", EmptyDir: &v1alpha1.EmptyDirVolumeSource{},
				Secret: &v1alpha1.SecretVolumeSource{SecretName: "s"}}}
		}, "must have exactly one volume source"},
		{"mount of no volume", func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{{Name: "ghost", MountPath: "/g"}}
		}, `spec.podConfig.volumeMounts[0].name: Not found: "ghost"`},
		{"relative mount path", func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "x", EmptyDir: &v1alpha1.EmptyDirVolumeSource{}}}
			j.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{{Name: "x", MountPath: "rel"}}
		}, "must be an absolute path"},
		{"duplicate mount path", func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "x", EmptyDir: &v1alpha1.EmptyDirVolumeSource{}}}
			j.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{{Name: "x", MountPath: "/a"}, {Name: "x", MountPath: "/a"}}
		}, `spec.podConfig.volumeMounts[1].mountPath: Duplicate value: "/a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := cl.Create(ctx, newJob(ns, "bad", tc.mod))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want %q", err, tc.want)
			}
		})
	}

	// Fields the API server would refuse in the pod are refused on the job. Each job's pod is also
	// sent to the API server (dry run, bypassing the job webhook) to show the server refuses it.
	for _, tc := range []struct {
		name      string
		mod       func(*v1alpha1.NotebookValidationJob)
		want, pod string
	}{
		{"item path traversal", func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "x", ConfigMap: &v1alpha1.ConfigMapVolumeSource{Name: "cm",
				Items: []corev1.KeyToPath{{Key: "k", Path: "a/../../b"}}}}}
		}, `spec.podConfig.volumes[0].configMap.items[0].path: Invalid value: "a/../../b": must not contain '..'`, "items[0].path"},
		{"item mode bits", func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "x", Secret: &v1alpha1.SecretVolumeSource{SecretName: "s",
				Items: []corev1.KeyToPath{{Key: "k", Path: "k", Mode: ptr.To[int32](0o7777)}}}}}
		}, `spec.podConfig.volumes[0].secret.items[0].mode: Invalid value: "07777"`, "items[0].mode"},
		{"default mode bits", func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "x", ConfigMap: &v1alpha1.ConfigMapVolumeSource{Name: "cm", DefaultMode: ptr.To[int32](-1)}}}
		}, `spec.podConfig.volumes[0].configMap.defaultMode: Invalid value`, "defaultMode"},
		{"env name", func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Env = []corev1.EnvVar{{Name: "A=B", Value: "x"}}
		}, `spec.podConfig.env[0].name: Invalid value: "A=B"`, `.name: Invalid value: "A=B"`},
		{"emptyDir medium", func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "x", EmptyDir: &v1alpha1.EmptyDirVolumeSource{Medium: "HugePages-x"}}}
		}, `spec.podConfig.volumes[0].emptyDir.medium: Unsupported value: "HugePages-x"`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := newJob(ns, "bad", tc.mod)
			err := cl.Create(ctx, job)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want %q", err, tc.want)
			}
			if tc.pod == "" {
				return
			}
			pod := notebook.BuildPod(job, notebook.Images{Git: "git"})
			err = cl.Create(ctx, pod, client.DryRunAll)
			if err == nil || !strings.Contains(err.Error(), tc.pod) {
				t.Errorf("the API server's own check of the pod: %v, want %q", err, tc.pod)
			}
		})
	}
}

// TestNotebookJobPodRefused: a pod the API server refuses for a reason that may pass (a quota)
// keeps the job Pending with PodCreated=False and the server's message (status unknown, then
// exceeded quota, naming the quota); once the quota is gone
// the pod is created and the condition cleared.
func TestNotebookJobPodRefused(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "nb-quota")
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "no-pods"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}},
	}
	if err := cl.Create(ctx, quota); err != nil {
		t.Fatal(err)
	}
	job := newJob(ns, "quota")
	if err := cl.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "PodCreated=False with the quota message", func() error {
		got := getJob(t, job)
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionPodCreated)
		if got.Status.Phase != v1alpha1.NotebookPhasePending || c == nil || c.Status != metav1.ConditionFalse ||
			!strings.Contains(c.Message, "forbidden") || !strings.Contains(c.Message, "no-pods") || got.Status.Message != c.Message {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
	if err := cl.Delete(ctx, quota); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "pod created, condition cleared", func() error {
		got := getJob(t, job)
		if got.Status.PodName == "" || meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionPodCreated) != nil {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
}

// TestNotebookJobPrivateRepoGolden: a job with a credentials Secret, GPU-style placement and a
// golden notebook gets a pod whose credentials volume is mounted in git-clone only, with papermill
// before the comparison; the job is Running while papermill runs, and a failed comparison fails it
// with reason GoldenMismatch and the first differing cell.
func TestNotebookJobPrivateRepoGolden(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "nb-golden")
	job := newJob(ns, "golden", func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.Notebook.Git.CredentialsSecret = "git-creds"
		j.Spec.PodConfig.NodeSelector = map[string]string{"nvidia.com/gpu.present": "true"}
		j.Spec.PodConfig.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		j.Spec.PodConfig.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}
		j.Spec.GoldenNotebook = &v1alpha1.GoldenNotebook{Path: "eda/explore.golden.ipynb", NumericTolerance: "1e-3"}
	})
	if err := cl.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "golden-validation")
	if len(pod.Spec.InitContainers) != 2 || pod.Spec.InitContainers[1].Name != notebook.NotebookContainer ||
		len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != notebook.CompareContainer {
		t.Fatalf("containers: init %d, main %v", len(pod.Spec.InitContainers), pod.Spec.Containers)
	}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		for _, m := range c.VolumeMounts {
			if m.Name == notebook.GitCredentialsVolume && c.Name != notebook.GitCloneContainer {
				t.Errorf("credentials mounted in %s", c.Name)
			}
		}
	}
	if pod.Spec.NodeSelector["nvidia.com/gpu.present"] != "true" || len(pod.Spec.Tolerations) == 0 {
		t.Errorf("placement: %v %v", pod.Spec.NodeSelector, pod.Spec.Tolerations)
	}

	// papermill runs (an init container): the job is Running.
	now := metav1.Now()
	changePodStatus(t, pod, func(pod *corev1.Pod) {
		pod.Status.Phase = corev1.PodPending
		pod.Status.InitContainerStatuses = []corev1.ContainerStatus{
			{Name: notebook.GitCloneContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, StartedAt: now, FinishedAt: now}}},
			{Name: notebook.NotebookContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}},
		}
	})
	waitPhase(t, job, v1alpha1.NotebookPhaseRunning)

	msg := `output differs from the golden notebook: cell 2: stream stdout differs: got "accuracy 0.85\n", golden "accuracy 0.91\n" (numeric tolerance 0.001)`
	changePodStatus(t, pod, func(pod *corev1.Pod) {
		pod.Status.Phase = corev1.PodFailed
		pod.Status.InitContainerStatuses[1].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, StartedAt: now, FinishedAt: now}}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: notebook.CompareContainer, State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: msg, StartedAt: now, FinishedAt: now}}}}
	})
	got := waitPhase(t, job, v1alpha1.NotebookPhaseFailed)
	c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionComplete)
	if c == nil || c.Reason != v1alpha1.ReasonGoldenMismatch || !strings.Contains(got.Status.Message, "cell 2: stream stdout differs") {
		t.Errorf("condition %+v, message %q", c, got.Status.Message)
	}

	// Admission checks the new fields too.
	bad := newJob(ns, "bad", func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.GoldenNotebook = &v1alpha1.GoldenNotebook{Path: "/etc/passwd.ipynb", NumericTolerance: "lots"}
		j.Spec.Notebook.Git.CredentialsSecret = "Bad_Name"
	})
	err := cl.Create(ctx, bad)
	for _, want := range []string{"spec.goldenNotebook.path", "spec.goldenNotebook.numericTolerance", "spec.notebook.git.credentialsSecret"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %s", err, want)
		}
	}
}

// changePodStatus writes the status change of a pod as kubelet would, read afresh on each conflict:
// the scheduler writes the same pod's conditions meanwhile.
func changePodStatus(t *testing.T, pod *corev1.Pod, change func(*corev1.Pod)) {
	t.Helper()
	ctx := testutil.Context(t)
	if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		change(pod)
		return cl.Status().Update(ctx, pod)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestNotebookJobOutput: a job that keeps its notebook gets a pod whose dataset volume carries
// outputTarget (the target with the pod's name under it) and is mounted at /output, with the
// results container after papermill; the results container's termination message becomes
// status.cells, outputSHA256 and outputURL. Admission refuses an output volume the driver could
// not write back.
func TestNotebookJobOutput(t *testing.T) {
	_, ns, ctx := setupNamespace(t, "nb-output")
	job := newJob(ns, "keep", func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "work", CSI: &v1alpha1.CSIVolumeSource{Driver: "cistern.csi.dev",
			VolumeAttributes:     map[string]string{"source": "s3://datasets/model", "size": "1Gi"},
			NodePublishSecretRef: &corev1.LocalObjectReference{Name: "team-s3"}}}}
		j.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{{Name: "work", MountPath: "/mnt/work"}}
		j.Spec.Output = &v1alpha1.NotebookOutput{Volume: "work", Target: "s3://results/runs"}
	})
	if err := cl.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, ns, "keep-validation")
	var attrs map[string]string
	for _, v := range pod.Spec.Volumes {
		if v.Name == notebook.NotebookDataVolume {
			t.Errorf("the pod still has the emptyDir %s", v.Name)
		}
		if v.Name == "work" && v.CSI != nil {
			attrs = v.CSI.VolumeAttributes
		}
	}
	if attrs["outputTarget"] != "s3://results/runs/keep-validation" || attrs["source"] != "s3://datasets/model" {
		t.Errorf("output volume attributes %v", attrs)
	}
	if len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != notebook.CompareContainer {
		t.Fatalf("containers %v", pod.Spec.Containers)
	}

	sha := strings.Repeat("5e", 32)
	msg := "notebook ran: 3 code cells, 0 raised an error\n" +
		`cistern-results: {"sha256":"` + sha + `","passed":[1,2,4],"failed":[{"i":5,"m":"raised KeyError: 'x'"}]}` + "\n"
	now := metav1.Now()
	changePodStatus(t, pod, func(pod *corev1.Pod) {
		pod.Status.Phase = corev1.PodSucceeded
		pod.Status.InitContainerStatuses = []corev1.ContainerStatus{
			{Name: notebook.GitCloneContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, StartedAt: now, FinishedAt: now}}},
			{Name: notebook.NotebookContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, StartedAt: now, FinishedAt: now}}},
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: notebook.CompareContainer, State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: msg, StartedAt: now, FinishedAt: now}}}}
	})
	got := waitPhase(t, job, v1alpha1.NotebookPhaseSucceeded)
	want := []v1alpha1.CellResult{{Index: 1, Result: v1alpha1.CellPassed}, {Index: 2, Result: v1alpha1.CellPassed},
		{Index: 4, Result: v1alpha1.CellPassed}, {Index: 5, Result: v1alpha1.CellFailed, Reason: "raised KeyError: 'x'"}}
	if fmt.Sprint(got.Status.Cells) != fmt.Sprint(want) || got.Status.OutputSHA256 != sha ||
		got.Status.OutputURL != "s3://results/runs/keep-validation/explore.output.ipynb" ||
		!strings.Contains(got.Status.Message, "output goes to s3://results/runs/keep-validation/explore.output.ipynb") {
		t.Errorf("status: cells %v, sha %q, url %q, message %q", got.Status.Cells, got.Status.OutputSHA256, got.Status.OutputURL, got.Status.Message)
	}

	// The API server's schema and the webhook refuse what the driver could not write back.
	for _, tc := range []struct {
		mod  func(*v1alpha1.NotebookValidationJob)
		want string
	}{
		{func(j *v1alpha1.NotebookValidationJob) { j.Spec.Output.Target = "http://results" }, "spec.output.target"},
		{func(j *v1alpha1.NotebookValidationJob) { j.Spec.Output.Target = "s3://results/${pod.name}" }, "without ${...} placeholders"},
		{func(j *v1alpha1.NotebookValidationJob) { j.Spec.PodConfig.Volumes[0].CSI.ReadOnly = ptr.To(true) }, "names a readOnly volume"},
		{func(j *v1alpha1.NotebookValidationJob) { j.Spec.PodConfig.Volumes[0].CSI.NodePublishSecretRef = nil }, "without nodePublishSecretRef"},
	} {
		bad := job.DeepCopy()
		bad.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: "bad"}
		bad.Status = v1alpha1.NotebookValidationJobStatus{}
		tc.mod(bad)
		if err := cl.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("created %v: error %v, want %q", bad.Spec.Output, err, tc.want)
			_ = cl.Delete(ctx, bad)
		}
	}
}
