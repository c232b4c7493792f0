package notebook

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

func testJob(mod ...func(*v1alpha1.NotebookValidationJob)) *v1alpha1.NotebookValidationJob {
	j := &v1alpha1.NotebookValidationJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nb", Namespace: "ns"},
		Spec: v1alpha1.NotebookValidationJobSpec{
			Notebook: v1alpha1.NotebookSource{
				Git:  v1alpha1.GitSource{URL: "https://example.com/repo.git", Ref: "main"},
				Path: "notebooks/train.ipynb",
			},
			PodConfig: v1alpha1.PodConfig{ContainerImage: "jupyter/papermill:1"},
			Timeout:   &metav1.Duration{Duration: 5 * time.Minute},
		},
	}
	for _, m := range mod {
		m(j)
	}
	return j
}

func TestBuildPod(t *testing.T) {
	job := testJob(func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.PodConfig.Env = []corev1.EnvVar{{Name: "EPOCHS", Value: "3"}, {Name: EnvNotebookPath, Value: "evil"}}
		j.Spec.PodConfig.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}
		j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{
			{Name: "models", PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "models-pvc"}},
			{Name: "dataset", CSI: &v1alpha1.CSIVolumeSource{Driver: "cistern.csi.dev", ReadOnly: ptr.To(true),
				VolumeAttributes: map[string]string{"source": "s3://bucket/data"}}},
			{Name: "unmounted", EmptyDir: &v1alpha1.EmptyDirVolumeSource{}},
		}
		j.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{
			{Name: "models", MountPath: "/models"}, {Name: "dataset", MountPath: "/data", ReadOnly: true},
		}
		j.Spec.PodConfig.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptr.To[int64](1000)}
		j.Spec.PodConfig.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
	})
	own := []corev1.EnvVar{
		{Name: EnvGitURL, Value: "https://example.com/repo.git"},
		{Name: EnvGitRef, Value: "main"},
		{Name: EnvNotebookPath, Value: "notebooks/train.ipynb"},
		{Name: EnvNotebookInput, Value: "/workspace/repo/notebooks/train.ipynb"},
		{Name: EnvNotebookOutput, Value: "/output/train.output.ipynb"},
	}
	// Every container as Pod Security "restricted" wants it; the controller's own run as a fixed
	// user, with requests and limits.
	restrictedContainer := &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	helper := restrictedContainer.DeepCopy()
	helper.RunAsUser = ptr.To[int64](65532)
	want := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "nb-validation", Namespace: "ns", Labels: map[string]string{JobLabel: "nb"}},
		Spec: corev1.PodSpec{
			RestartPolicy:         corev1.RestartPolicyNever,
			ActiveDeadlineSeconds: ptr.To[int64](300),
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), FSGroup: ptr.To[int64](1000),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "registry"}},
			InitContainers: []corev1.Container{{
				Name: "git-clone", Image: "git:1", Command: []string{"/bin/sh", "-c", cloneScript},
				Env:                      append(append([]corev1.EnvVar{}, own[:2]...), corev1.EnvVar{Name: "HOME", Value: "/workspace"}),
				VolumeMounts:             []corev1.VolumeMount{{Name: "git-clone", MountPath: "/workspace"}},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi")}},
				SecurityContext: helper,
			}},
			Containers: []corev1.Container{{
				Name: "notebook", Image: "jupyter/papermill:1",
				Command:    []string{"papermill"},
				Args:       []string{"$(NOTEBOOK_INPUT)", "$(NOTEBOOK_OUTPUT)", "--log-output"},
				WorkingDir: "/workspace/repo/notebooks",
				Env:        append(append([]corev1.EnvVar{}, own...), corev1.EnvVar{Name: "EPOCHS", Value: "3"}),
				Resources:  corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "git-clone", MountPath: "/workspace"}, {Name: "notebook-data", MountPath: "/output"},
					{Name: "models", MountPath: "/models"}, {Name: "dataset", MountPath: "/data", ReadOnly: true},
				},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				SecurityContext:          restrictedContainer,
			}},
			Volumes: []corev1.Volume{
				{Name: "git-clone", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "notebook-data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "models", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "models-pvc"}}},
				{Name: "dataset", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "cistern.csi.dev", ReadOnly: ptr.To(true),
					VolumeAttributes: map[string]string{"source": "s3://bucket/data"}}}},
				{Name: "unmounted", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		},
	}
	if d := cmp.Diff(want, BuildPod(job, Images{Git: "git:1"})); d != "" {
		t.Errorf("pod (-want +got):\n%s", d)
	}
}

func TestMergeEnv(t *testing.T) {
	got := MergeEnv([]corev1.EnvVar{{Name: "A", Value: "own"}}, []corev1.EnvVar{{Name: "B", Value: "1"}, {Name: "A", Value: "user"}})
	want := []corev1.EnvVar{{Name: "A", Value: "own"}, {Name: "B", Value: "1"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("MergeEnv (-want +got):\n%s", d)
	}
}

func TestValidate(t *testing.T) {
	pvc := func(name string) v1alpha1.PodVolume {
		return v1alpha1.PodVolume{Name: name, PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}
	}
	tests := []struct {
		name string
		mod  func(*v1alpha1.NotebookValidationJob)
		raw  []map[string]any
		want []string
	}{
		{name: "valid job with every allowed source", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{
				pvc("a"),
				{Name: "b", ConfigMap: &v1alpha1.ConfigMapVolumeSource{Name: "cm"}},
				{Name: "c", Secret: &v1alpha1.SecretVolumeSource{SecretName: "s"}},
				{Name: "d", EmptyDir: &v1alpha1.EmptyDirVolumeSource{}},
				{Name: "e", CSI: &v1alpha1.CSIVolumeSource{Driver: "cistern.csi.dev"}},
			}
			j.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{{Name: "a", MountPath: "/a"}, {Name: "e", MountPath: "/e", SubPath: "x/y"}}
		}},
		{name: "failure case - hostPath", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "host"}}
		}, raw: []map[string]any{{"name": "host", "hostPath": map[string]any{"path": "/etc"}}},
			want: []string{"spec.podConfig.volumes[0].hostPath: Forbidden: volume type hostPath is not allowed"}},
		{name: "failure case - nfs next to a pvc", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{pvc("a")}
		}, raw: []map[string]any{{"name": "a", "persistentVolumeClaim": map[string]any{}, "nfs": map[string]any{}}},
			want: []string{"spec.podConfig.volumes[0].nfs: Forbidden"}},
		{name: "failure case - no source", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "a"}}
		}, want: []string{"spec.podConfig.volumes[0]: Required value: exactly one volume source"}},
		{name: "failure case - two sources", mod: func(j *v1alpha1.NotebookValidationJob) {
			v := pvc("a")
			v.EmptyDir = &v1alpha1.EmptyDirVolumeSource{}
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{v}
		}, want: []string{`spec.podConfig.volumes[0]: Invalid value: "persistentVolumeClaim, emptyDir": must have exactly one volume source`}},
		{name: "failure case - duplicate volume name", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{pvc("a"), pvc("a")}
		}, want: []string{`spec.podConfig.volumes[1].name: Duplicate value: "a"`}},
		{name: "failure case - reserved volume names", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{pvc("git-clone"), pvc("notebook-data"), pvc("kube-api-access-x")}
		}, want: []string{"volumes[0].name: Invalid value: \"git-clone\": is used by the controller",
			"volumes[1].name: Invalid value: \"notebook-data\"", "volumes[2].name: Invalid value: \"kube-api-access-x\""}},
		{name: "failure case - csi of another driver", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "a", CSI: &v1alpha1.CSIVolumeSource{Driver: "other.csi"}}}
		}, want: []string{`spec.podConfig.volumes[0].csi.driver: Unsupported value: "other.csi"`}},
		{name: "failure case - mount of no volume, relative path, duplicate path, reserved path", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{pvc("a")}
			j.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{
				{Name: "nope", MountPath: "/x"}, {Name: "a", MountPath: "rel"}, {Name: "a", MountPath: "/x/"},
				{Name: "a", MountPath: "/workspace/sub"}, {Name: "a", MountPath: "/output"},
			}
		}, want: []string{
			`spec.podConfig.volumeMounts[0].name: Not found: "nope"`,
			`spec.podConfig.volumeMounts[1].mountPath: Invalid value: "rel": must be an absolute path`,
			`spec.podConfig.volumeMounts[2].mountPath: Duplicate value: "/x/"`,
			`spec.podConfig.volumeMounts[3].mountPath: Invalid value: "/workspace/sub": collides with the controller's mount /workspace`,
			`spec.podConfig.volumeMounts[4].mountPath: Invalid value: "/output": collides`,
		}},
		{name: "failure case - notebook path escapes the repository", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.Notebook.Path = "a/../../etc/x.ipynb"
		}, want: []string{`spec.notebook.path: Invalid value: "a/../../etc/x.ipynb": must not contain '..'`}},
		{name: "failure case - absolute notebook path, not a notebook, option-like url", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.Notebook.Path = "/etc/passwd"
			j.Spec.Notebook.Git.URL = "--upload-pack=touch"
		}, want: []string{"spec.notebook.path: Invalid value: \"/etc/passwd\": must be a relative path", "must name a .ipynb file",
			"spec.notebook.git.url: Invalid value"}},
		{name: "failure case - item path traversal, absolute item path, mode bits, default mode", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{
				{Name: "a", ConfigMap: &v1alpha1.ConfigMapVolumeSource{Name: "cm", DefaultMode: ptr.To[int32](0o1777),
					Items: []corev1.KeyToPath{{Key: "k", Path: "../../etc/cron.d/x"}, {Key: "k", Path: "/abs"}, {Key: "k", Path: "ok", Mode: ptr.To[int32](01000)}}}},
				{Name: "b", Secret: &v1alpha1.SecretVolumeSource{SecretName: "s",
					Items: []corev1.KeyToPath{{Key: "k", Path: "a/../../b"}, {Key: "", Path: "x"}, {Key: "k", Path: "..data"}}}},
			}
		}, want: []string{
			`spec.podConfig.volumes[0].configMap.defaultMode: Invalid value: "01777": must be a number between 0 and 0777`,
			`spec.podConfig.volumes[0].configMap.items[0].path: Invalid value: "../../etc/cron.d/x": must not start with '..'`,
			`spec.podConfig.volumes[0].configMap.items[1].path: Invalid value: "/abs": must be a relative path`,
			`spec.podConfig.volumes[0].configMap.items[2].mode: Invalid value: "01000"`,
			`spec.podConfig.volumes[1].secret.items[0].path: Invalid value: "a/../../b": must not contain '..'`,
			`spec.podConfig.volumes[1].secret.items[1].key: Required value`,
			`spec.podConfig.volumes[1].secret.items[2].path: Invalid value: "..data": must not start with '..'`,
		}},
		{name: "failure case - emptyDir medium and size, object names", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{
				{Name: "a", EmptyDir: &v1alpha1.EmptyDirVolumeSource{Medium: "Disk"}},
				{Name: "b", EmptyDir: &v1alpha1.EmptyDirVolumeSource{Medium: "HugePages-x", SizeLimit: resourceQ("-1Gi")}},
				{Name: "c", Secret: &v1alpha1.SecretVolumeSource{SecretName: "Not_A_Name"}},
			}
		}, want: []string{
			`spec.podConfig.volumes[0].emptyDir.medium: Unsupported value: "Disk"`,
			`spec.podConfig.volumes[1].emptyDir.medium: Unsupported value: "HugePages-x"`,
			`spec.podConfig.volumes[1].emptyDir.sizeLimit: Invalid value: "-1Gi": must not be negative`,
			`spec.podConfig.volumes[2].secret.secretName: Invalid value: "Not_A_Name"`,
		}},
		{name: "valid emptyDir media", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{
				{Name: "a", EmptyDir: &v1alpha1.EmptyDirVolumeSource{Medium: "Memory", SizeLimit: resourceQ("1Gi")}},
				{Name: "b", EmptyDir: &v1alpha1.EmptyDirVolumeSource{Medium: "HugePages-2Mi"}},
				{Name: "c", ConfigMap: &v1alpha1.ConfigMapVolumeSource{Name: "cm", DefaultMode: ptr.To[int32](0o644),
					Items: []corev1.KeyToPath{{Key: "k.json", Path: "conf/k.json", Mode: ptr.To[int32](0o400)}}}},
			}
		}},
		{name: "failure case - env names and sources, resources", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Env = []corev1.EnvVar{
				{Name: "1BAD=x", Value: "v"},
				{Name: "OK", Value: "v", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "F", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.containers"}}},
				{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "k"}}},
				{Name: "E", ValueFrom: &corev1.EnvVarSource{}},
			}
			j.Spec.PodConfig.Resources = &corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
			}
		}, want: []string{
			`spec.podConfig.env[0].name: Invalid value: "1BAD=x"`,
			"spec.podConfig.env[1].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty",
			`spec.podConfig.env[2].valueFrom.fieldRef.fieldPath: Unsupported value: "spec.containers"`,
			`spec.podConfig.env[3].valueFrom.secretKeyRef.name: Required value`,
			"spec.podConfig.env[4].valueFrom: Invalid value: \"\": must specify one of",
			`spec.podConfig.resources.requests[cpu]: Invalid value: "2": must be less than or equal to cpu limit of 1`,
		}},
		{name: "valid env sources", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Env = []corev1.EnvVar{
				{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
				{Name: "MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory"}}},
				{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "token"}}},
				{Name: "my.var-1", Value: "x"},
			}
		}},
		{name: "failure case - subPath escapes", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{pvc("a")}
			j.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{{Name: "a", MountPath: "/a", SubPath: "../b"}}
		}, want: []string{"spec.podConfig.volumeMounts[0].subPath"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := Validate(testJob(tc.mod), tc.raw)
			got := ""
			if len(errs) > 0 {
				got = errs.ToAggregate().Error()
			}
			if len(tc.want) == 0 && got != "" {
				t.Fatalf("unexpected errors: %s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("errors %q\ndo not contain %q", got, w)
				}
			}
		})
	}
}

func TestValidateWarnsOnReservedEnv(t *testing.T) {
	_, warnings := Validate(testJob(func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.PodConfig.Env = []corev1.EnvVar{{Name: "GIT_URL", Value: "x"}}
	}), nil)
	if len(warnings) != 2 || !strings.Contains(warnings[0], "spec.podConfig.resources is unset") ||
		!strings.Contains(warnings[1], "spec.podConfig.env[0].name: GIT_URL is set by the controller") {
		t.Errorf("warnings = %q", warnings)
	}
	_, warnings = Validate(testJob(func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.PodConfig.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}
	}), nil)
	if len(warnings) != 0 {
		t.Errorf("warnings = %q", warnings)
	}
}

func resourceQ(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// A private repository, GPU placement and a golden notebook: the credentials reach only the clone,
// the placement the pod, and the comparison runs after papermill.
func TestBuildPodPrivateRepoPlacementGolden(t *testing.T) {
	job := testJob(func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.Notebook.Git.CredentialsSecret = "git-creds"
		j.Spec.PodConfig.ServiceAccountName = "trainer"
		j.Spec.PodConfig.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "hf-token"}}}}
		j.Spec.PodConfig.NodeSelector = map[string]string{"nvidia.com/gpu.present": "true"}
		j.Spec.PodConfig.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		j.Spec.PodConfig.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: corev1.NodeSelectorOpIn, Values: []string{"a100"}}}}}}}}
		j.Spec.GoldenNotebook = &v1alpha1.GoldenNotebook{Git: &v1alpha1.GitSource{URL: "https://example.com/golden.git", Ref: "v1", CredentialsSecret: "golden-creds"},
			Path: "golden/train.ipynb", NumericTolerance: "1e-3",
			IgnoreOutputTypes: []v1alpha1.OutputType{"stderr"}, IgnorePatterns: []string{`\d\d:\d\d:\d\d`}}
		j.Spec.PodConfig.HelperResources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}
	})
	pod := BuildPod(job, Images{Git: "git:1", Compare: "controller:1"})

	if pod.Spec.ServiceAccountName != "trainer" || pod.Spec.NodeSelector["nvidia.com/gpu.present"] != "true" ||
		len(pod.Spec.Tolerations) != 1 || pod.Spec.Affinity == nil {
		t.Errorf("placement not on the pod: %+v", pod.Spec)
	}
	if len(pod.Spec.InitContainers) != 2 || pod.Spec.InitContainers[0].Name != GitCloneContainer || pod.Spec.InitContainers[1].Name != NotebookContainer {
		t.Fatalf("init containers %v", pod.Spec.InitContainers)
	}
	clone, nb := pod.Spec.InitContainers[0], pod.Spec.InitContainers[1]
	want := corev1.Container{
		Name: CompareContainer, Image: "controller:1",
		Command: []string{"/usr/local/bin/workload-controller", "compare-notebook"},
		Args: []string{"--executed", "/output/train.output.ipynb", "--results-file", "/dev/termination-log",
			"--golden", "/workspace/golden/golden/train.ipynb", "--tolerance", "1e-3",
			"--ignore-output-type", "stderr", "--ignore-pattern", `\d\d:\d\d:\d\d`},
		VolumeMounts: []corev1.VolumeMount{{Name: "git-clone", MountPath: "/workspace", ReadOnly: true},
			{Name: "notebook-data", MountPath: "/output", ReadOnly: true}},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		Resources:                corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
		SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), RunAsUser: ptr.To[int64](65532),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("containers %v", pod.Spec.Containers)
	}
	if d := cmp.Diff(want, pod.Spec.Containers[0]); d != "" {
		t.Errorf("compare container (-want +got):\n%s", d)
	}
	if len(nb.EnvFrom) != 1 || nb.EnvFrom[0].SecretRef.Name != "hf-token" {
		t.Errorf("notebook envFrom %v", nb.EnvFrom)
	}
	// The credentials: a Secret volume mounted only in the clone, read by git's credential helper.
	var vol *corev1.Volume
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == GitCredentialsVolume {
			vol = &pod.Spec.Volumes[i]
		}
	}
	if vol == nil || vol.Secret == nil || vol.Secret.SecretName != "git-creds" || *vol.Secret.DefaultMode != 0o400 {
		t.Fatalf("credentials volume %+v", vol)
	}
	mounted := func(c corev1.Container, volume, path string) bool {
		for _, m := range c.VolumeMounts {
			if m.Name == volume && m.MountPath == path {
				return true
			}
		}
		return false
	}
	// The golden repository's own credentials, beside the notebook repository's, in the clone only.
	for _, v := range []struct{ volume, path string }{{GitCredentialsVolume, CredentialsPath}, {GoldenCredentialsVolume, GoldenCredentialsPath}} {
		if !mounted(clone, v.volume, v.path) || mounted(nb, v.volume, v.path) || mounted(pod.Spec.Containers[0], v.volume, v.path) {
			t.Errorf("%s must be mounted in git-clone at %s and nowhere else", v.volume, v.path)
		}
	}
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == GoldenCredentialsVolume && v.Secret != nil && v.Secret.SecretName == "golden-creds"
	}) {
		t.Errorf("no golden credentials volume: %v", pod.Spec.Volumes)
	}
	env := map[string]string{}
	for _, e := range clone.Env {
		env[e.Name] = e.Value
	}
	if env["GIT_CONFIG_KEY_0"] != "credential.helper" || !strings.Contains(env["GIT_CONFIG_VALUE_0"], "d=$GIT_CREDENTIALS_DIR; ") || !strings.Contains(env["GIT_CONFIG_VALUE_0"], "cat $d/password") ||
		!strings.Contains(env["GIT_SSH_COMMAND"], `-i "$GIT_CREDENTIALS_DIR/ssh-privatekey"`) || env["GIT_TERMINAL_PROMPT"] != "0" ||
		env[EnvGoldenGitURL] != "https://example.com/golden.git" || env[EnvGoldenGitRef] != "v1" {
		t.Errorf("git-clone env %v", env)
	}
	for _, e := range nb.Env {
		if strings.HasPrefix(e.Name, "GIT_CONFIG") || e.Name == "GIT_SSH_COMMAND" {
			t.Errorf("notebook container has %s", e.Name)
		}
	}
	// Same repository: the golden notebook comes from the clone.
	same := testJob(func(j *v1alpha1.NotebookValidationJob) {
		j.Spec.GoldenNotebook = &v1alpha1.GoldenNotebook{Path: "golden/train.ipynb"}
	})
	if got := GoldenFile(same); got != "/workspace/repo/golden/train.ipynb" {
		t.Errorf("golden file %s", got)
	}
}

func TestValidateRealNotebookFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*v1alpha1.NotebookValidationJob)
		want []string
	}{
		{name: "valid private repo, placement and golden", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.Notebook.Git.CredentialsSecret = "git-creds"
			j.Spec.PodConfig.ServiceAccountName = "trainer"
			j.Spec.PodConfig.EnvFrom = []corev1.EnvFromSource{{Prefix: "HF_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "hf"}}}}
			j.Spec.PodConfig.NodeSelector = map[string]string{"nvidia.com/gpu.present": "true"}
			j.Spec.PodConfig.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
			j.Spec.GoldenNotebook = &v1alpha1.GoldenNotebook{Path: "golden.ipynb", NumericTolerance: "0.01"}
		}},
		{name: "failure case - bad names, envFrom without source, tolerations, golden", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.Notebook.Git.CredentialsSecret = "Bad_Secret"
			j.Spec.PodConfig.ServiceAccountName = "Bad SA"
			j.Spec.PodConfig.EnvFrom = []corev1.EnvFromSource{{}}
			j.Spec.PodConfig.NodeSelector = map[string]string{"bad key!": "v"}
			j.Spec.PodConfig.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, Value: "v"}, {Key: "k", Effect: "Sometimes"}}
			j.Spec.GoldenNotebook = &v1alpha1.GoldenNotebook{Path: "../golden.ipynb", NumericTolerance: "-1",
				Git:               &v1alpha1.GitSource{URL: "--upload-pack=x", CredentialsSecret: "Other_Secret"},
				IgnoreOutputTypes: []v1alpha1.OutputType{"html"}, IgnorePatterns: []string{"\\d+", "(unclosed"}}
		}, want: []string{
			`spec.notebook.git.credentialsSecret: Invalid value: "Bad_Secret"`,
			`spec.podConfig.serviceAccountName: Invalid value: "Bad SA"`,
			"spec.podConfig.envFrom[0]: Invalid value: \"\": must specify one of: `configMapRef` or `secretRef`",
			`spec.podConfig.nodeSelector[bad key!]: Invalid value: "bad key!"`,
			`spec.podConfig.tolerations[0].value: Invalid value: "v": value must be empty when`,
			`spec.podConfig.tolerations[1].effect: Unsupported value: "Sometimes"`,
			`spec.goldenNotebook.path: Invalid value: "../golden.ipynb": must not contain '..'`,
			`spec.goldenNotebook.numericTolerance: Invalid value: "-1"`,
			`spec.goldenNotebook.git.url: Invalid value: "--upload-pack=x"`,
			`spec.goldenNotebook.git.credentialsSecret: Invalid value: "Other_Secret"`,
			`spec.goldenNotebook.ignoreOutputTypes[0]: Unsupported value: "html"`,
			"spec.goldenNotebook.ignorePatterns[1]: Invalid value: \"(unclosed\": not a regular expression (RE2 syntax)",
		}},
		{name: "failure case - reserved credentials volume name", mod: func(j *v1alpha1.NotebookValidationJob) {
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "git-credentials", EmptyDir: &v1alpha1.EmptyDirVolumeSource{}}}
		}, want: []string{`spec.podConfig.volumes[0].name: Invalid value: "git-credentials": is used by the controller`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := Validate(testJob(tc.mod), nil)
			got := ""
			if len(errs) > 0 {
				got = errs.ToAggregate().Error()
			}
			if len(tc.want) == 0 && got != "" {
				t.Fatalf("unexpected errors: %s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("errors %q\ndo not contain %q", got, w)
				}
			}
		})
	}
}

// The credential helper, run as git runs a "!" helper (sh -c '<helper> "$@"' <helper> get), on a
// copy of the Secret's files.
func TestCredentialHelper(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"basic-auth Secret", map[string]string{"username": "alice", "password": "s3cret"}, "username=alice\npassword=s3cret\n"},
		{"token only", map[string]string{"token": "ghp_x"}, "username=git\npassword=ghp_x\n"},
		{"ssh Secret: no HTTPS password", map[string]string{"ssh-privatekey": "KEY"}, "username=git\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o400); err != nil {
					t.Fatal(err)
				}
			}
			helper := strings.TrimPrefix(credentialHelper, "!")
			run := func(op string) *exec.Cmd {
				cmd := exec.Command("/bin/sh", "-c", helper+` "$@"`, helper, op)
				cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GIT_CREDENTIALS_DIR=" + dir}
				return cmd
			}
			out, err := run("get").Output()
			if err != nil || string(out) != tc.want {
				t.Errorf("helper get: %q %v, want %q", out, err, tc.want)
			}
			if out, _ := run("store").Output(); len(out) != 0 {
				t.Errorf("helper store printed %q", out)
			}
		})
	}
}
