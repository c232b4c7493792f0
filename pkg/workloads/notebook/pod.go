// Package notebook runs NotebookValidationJobs: a pure pod builder (pod.go), admission checks
// (validation.go, webhook.go) and the reconciler that drives a job through its phases
// (controller.go).
package notebook

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook/compare"
)

// Names the controller's own part of the pod uses; user volumes and mounts may not take them.
const (
	GitCloneVolume       = "git-clone"
	NotebookDataVolume   = "notebook-data"
	GitCredentialsVolume = "git-credentials"
	// GoldenCredentialsVolume holds the golden repository's own credentials.
	GoldenCredentialsVolume = "golden-git-credentials"
	// ServiceAccountVolumePrefix is the prefix of the token volume the API server adds to pods.
	ServiceAccountVolumePrefix = "kube-api-access-"

	WorkspacePath = "/workspace"
	OutputPath    = "/output"
	repoDir       = WorkspacePath + "/repo"
	goldenDir     = WorkspacePath + "/golden"
	// CredentialsPath is where the git-clone container, and only it, sees the credentials Secret;
	// GoldenCredentialsPath the golden repository's.
	CredentialsPath       = "/etc/git-credentials"
	GoldenCredentialsPath = "/etc/golden-git-credentials"

	GitCloneContainer = "git-clone"
	NotebookContainer = "notebook"
	CompareContainer  = "golden-compare"

	// JobLabel names the NotebookValidationJob on its pod.
	JobLabel = "workloads.cistern.dev/notebook-job"
)

// Environment variables the controller sets; a user variable of the same name is dropped.
const (
	EnvGitURL         = "GIT_URL"
	EnvGitRef         = "GIT_REF"
	EnvNotebookPath   = "NOTEBOOK_PATH"
	EnvNotebookInput  = "NOTEBOOK_INPUT"
	EnvNotebookOutput = "NOTEBOOK_OUTPUT"
	// The golden notebook's repository, when it is not the notebook's (git-clone only).
	EnvGoldenGitURL = "GOLDEN_GIT_URL"
	EnvGoldenGitRef = "GOLDEN_GIT_REF"
)

// ReservedEnv lists the controller's variables.
var ReservedEnv = []string{EnvGitURL, EnvGitRef, EnvNotebookPath, EnvNotebookInput, EnvNotebookOutput}

// Images are the controller's own container images.
type Images struct {
	// Git clones the repository; it must have sh and git.
	Git string
	// Compare compares the executed notebook with the golden one: the workload-controller's own
	// image, whose binary has the compare-notebook subcommand.
	Compare string
}

// compareBinary is the workload-controller binary in its image (Dockerfile).
const compareBinary = "/usr/local/bin/workload-controller"

// PodName is the name of a job's pod for its current run: <job>-validation, then
// <job>-validation-<n> for the n-th retry. A failed run's pod stays, with its log, until the job
// is deleted.
func PodName(job *v1alpha1.NotebookValidationJob) string {
	if n := job.Status.Retries; n > 0 {
		return fmt.Sprintf("%s-validation-%d", job.Name, n)
	}
	return job.Name + "-validation"
}

// outputVolume is the volume mounted at OutputPath: spec.output's, else the job's emptyDir.
func outputVolume(spec *v1alpha1.NotebookValidationJobSpec) string {
	if spec.Output != nil {
		return spec.Output.Volume
	}
	return NotebookDataVolume
}

// OutputTarget is the outputTarget of spec.output's volume for the current run: the target with
// the pod's name under it, so that each run (a retry has a pod of its own) keeps its notebook.
func OutputTarget(job *v1alpha1.NotebookValidationJob) string {
	return outputTarget(job, PodName(job))
}

func outputTarget(job *v1alpha1.NotebookValidationJob, pod string) string {
	if job.Spec.Output == nil {
		return ""
	}
	return strings.TrimRight(job.Spec.Output.Target, "/") + "/" + pod
}

// OutputURL is where the executed notebook of the run in the named pod is uploaded; empty
// without spec.output.
func OutputURL(job *v1alpha1.NotebookValidationJob, pod string) string {
	if job.Spec.Output == nil {
		return ""
	}
	return outputTarget(job, pod) + "/" + path.Base(OutputFile(job))
}

// OutputFile is where the executed notebook is written inside the pod.
func OutputFile(job *v1alpha1.NotebookValidationJob) string {
	base := strings.TrimSuffix(path.Base(job.Spec.Notebook.Path), ".ipynb")
	return OutputPath + "/" + base + ".output.ipynb"
}

// cloneScript clones $GIT_URL at $GIT_REF, and the golden notebook's repository when it is
// another one (with its own credentials directory); the values come from the environment so
// nothing from the spec is ever parsed by the shell. A branch or tag is cloned shallow; a commit
// SHA (which git clone --branch does not take, and not every server lets a client fetch by
// itself) is checked out of a full clone. The commits used are the termination message, from
// which the controller records them in the status.
const cloneScript = `set -eu
clone() {
  case "$2" in
  "") git clone --depth 1 -- "$1" "$3" ;;
  *[!0-9a-f]*) git clone --depth 1 --branch "$2" -- "$1" "$3" ;;
  *)
    if [ ${#2} -ne 40 ] && [ ${#2} -ne 64 ]; then
      git clone --depth 1 --branch "$2" -- "$1" "$3"
    else
      git clone --no-checkout -- "$1" "$3"
      git -C "$3" checkout --detach "$2"
    fi ;;
  esac
}
export GIT_CREDENTIALS_DIR=` + CredentialsPath + `
clone "$GIT_URL" "${GIT_REF:-}" ` + repoDir + `
commits="commit=$(git -C ` + repoDir + ` rev-parse HEAD)"
if [ -n "${GOLDEN_GIT_URL:-}" ]; then
  GIT_CREDENTIALS_DIR=` + GoldenCredentialsPath + `
  clone "$GOLDEN_GIT_URL" "${GOLDEN_GIT_REF:-}" ` + goldenDir + `
  commits="$commits golden-commit=$(git -C ` + goldenDir + ` rev-parse HEAD)"
fi
echo "$commits" >"${TERMINATION_LOG:-` + terminationLog + `}"`

// terminationLog is the git-clone container's terminationMessagePath.
const terminationLog = "/dev/termination-log"

// credentialHelper hands git the HTTPS credentials from the mounted Secret when a server asks
// (git runs it with "get"): username (default "git") and password, or token. They are read from
// the files at that moment: never in the pod spec, the environment or a log. The clone script
// points GIT_CREDENTIALS_DIR at the Secret of the repository being cloned; without one mounted
// there, the helper answers nothing.
const credentialHelper = `!f() { test "$1" = get || exit 0; d=$GIT_CREDENTIALS_DIR; test -d "$d" || exit 0; ` +
	`if [ -f $d/username ]; then echo "username=$(cat $d/username)"; else echo username=git; fi; ` +
	`if [ -f $d/password ]; then echo "password=$(cat $d/password)"; elif [ -f $d/token ]; then echo "password=$(cat $d/token)"; fi; }; f`

// sshCommand uses the Secret's key and known hosts for SSH URLs; an unknown host is refused. git
// runs it through the shell, which expands GIT_CREDENTIALS_DIR.
const sshCommand = `ssh -i "$GIT_CREDENTIALS_DIR/ssh-privatekey" -o IdentitiesOnly=yes -o UserKnownHostsFile="$GIT_CREDENTIALS_DIR/known_hosts" -o StrictHostKeyChecking=yes`

// Resources of the controller's own containers when podConfig.helperResources is unset.
var defaultHelperResources = corev1.ResourceRequirements{
	Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
	Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("512Mi")},
}

// helperUser runs the controller's own containers (its images need no user of their own).
const helperUser = 65532

// restricted is what every container needs under the Pod Security "restricted" profile.
func restricted() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// podSecurityContext is the user's, with what "restricted" needs filled where unset.
func podSecurityContext(user *corev1.PodSecurityContext) *corev1.PodSecurityContext {
	sc := user.DeepCopy()
	if sc == nil {
		sc = &corev1.PodSecurityContext{}
	}
	if sc.RunAsNonRoot == nil {
		sc.RunAsNonRoot = ptr.To(true)
	}
	if sc.SeccompProfile == nil {
		sc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	return sc
}

// credentialsEnv configures git in the git-clone container to use the mounted credentials
// (GIT_CONFIG_* is git's configuration from the environment).
var credentialsEnv = []corev1.EnvVar{
	{Name: "GIT_TERMINAL_PROMPT", Value: "0"},
	{Name: "GIT_CONFIG_COUNT", Value: "1"},
	{Name: "GIT_CONFIG_KEY_0", Value: "credential.helper"},
	{Name: "GIT_CONFIG_VALUE_0", Value: credentialHelper},
	{Name: "GIT_SSH_COMMAND", Value: sshCommand},
}

// GoldenFile is where the golden notebook is inside the pod.
func GoldenFile(job *v1alpha1.NotebookValidationJob) string {
	g := job.Spec.GoldenNotebook
	if g == nil {
		return ""
	}
	if g.Git != nil {
		return goldenDir + "/" + g.Path
	}
	return repoDir + "/" + g.Path
}

// BuildPod builds the validation pod of a job whose spec passed Validate: a git-clone init
// container filling the workspace volume, and a notebook container running papermill with the
// user's volumes mounted only where asked. Every container passes the Pod Security "restricted"
// profile and has resources.
func BuildPod(job *v1alpha1.NotebookValidationJob, images Images) *corev1.Pod {
	spec := &job.Spec
	own := []corev1.EnvVar{
		{Name: EnvGitURL, Value: spec.Notebook.Git.URL},
		{Name: EnvGitRef, Value: spec.Notebook.Git.Ref},
		{Name: EnvNotebookPath, Value: spec.Notebook.Path},
		{Name: EnvNotebookInput, Value: repoDir + "/" + spec.Notebook.Path},
		{Name: EnvNotebookOutput, Value: OutputFile(job)},
	}
	volumes := []corev1.Volume{
		{Name: GitCloneVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	if spec.Output == nil {
		volumes = append(volumes, corev1.Volume{Name: NotebookDataVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	for _, v := range spec.PodConfig.Volumes {
		cv := ConvertVolume(v)
		if o := spec.Output; o != nil && v.Name == o.Volume && cv.CSI != nil {
			// The node's write-back uploads what the pod wrote in it, the executed notebook
			// among it, once the pod has ended.
			if cv.CSI.VolumeAttributes == nil {
				cv.CSI.VolumeAttributes = map[string]string{}
			}
			cv.CSI.VolumeAttributes[consts.ParamOutputTarget] = OutputTarget(job)
		}
		volumes = append(volumes, cv)
	}
	nb := notebookContainer(spec, own)
	clone, credentials := cloneContainer(spec, images, own[:2])
	volumes = append(volumes, credentials...)
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      PodName(job),
			Namespace: job.Namespace,
			Labels:    map[string]string{JobLabel: job.Name},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:      corev1.RestartPolicyNever,
			InitContainers:     []corev1.Container{clone},
			Containers:         []corev1.Container{nb},
			Volumes:            volumes,
			ServiceAccountName: spec.PodConfig.ServiceAccountName,
			NodeSelector:       maps.Clone(spec.PodConfig.NodeSelector),
			Affinity:           spec.PodConfig.Affinity.DeepCopy(),
			SecurityContext:    podSecurityContext(spec.PodConfig.SecurityContext),
			ImagePullSecrets:   slices.Clone(spec.PodConfig.ImagePullSecrets),
		},
	}
	for _, t := range spec.PodConfig.Tolerations {
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, *t.DeepCopy())
	}
	if spec.GoldenNotebook != nil || spec.Output != nil {
		// The notebook runs to the end first, then its cells are checked (and compared with the
		// golden notebook's): papermill becomes an init container and the check the pod's
		// container, so a failed run never reaches it.
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, nb)
		pod.Spec.Containers = []corev1.Container{compareContainer(job, images)}
	}
	if t := spec.Timeout; t != nil {
		// The kubelet enforces the deadline too, so a run ends even while the controller is down.
		pod.Spec.ActiveDeadlineSeconds = ptr.To(int64(t.Seconds()))
	}
	return pod
}

// notebookContainer runs papermill on the notebook with the user's volumes mounted only where
// asked; own are the job's variables, which the user's env may not override.
func notebookContainer(spec *v1alpha1.NotebookValidationJobSpec, own []corev1.EnvVar) corev1.Container {
	mounts := []corev1.VolumeMount{
		{Name: GitCloneVolume, MountPath: WorkspacePath},
		{Name: outputVolume(spec), MountPath: OutputPath},
	}
	for _, m := range spec.PodConfig.VolumeMounts {
		mounts = append(mounts, corev1.VolumeMount{Name: m.Name, MountPath: m.MountPath, SubPath: m.SubPath, ReadOnly: m.ReadOnly})
	}
	nb := corev1.Container{
		Name:         NotebookContainer,
		Image:        spec.PodConfig.ContainerImage,
		Command:      []string{"papermill"},
		Args:         []string{"$(" + EnvNotebookInput + ")", "$(" + EnvNotebookOutput + ")", "--log-output"},
		WorkingDir:   path.Dir(repoDir + "/" + spec.Notebook.Path),
		Env:          MergeEnv(own, spec.PodConfig.Env),
		VolumeMounts: mounts,
		// papermill reports a failed cell on stderr only: the log's tail becomes the
		// termination message, and so the job's message.
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext:          restricted(),
	}
	if r := spec.PodConfig.Resources; r != nil {
		nb.Resources = *r.DeepCopy()
	}
	for _, e := range spec.PodConfig.EnvFrom {
		nb.EnvFrom = append(nb.EnvFrom, *e.DeepCopy())
	}
	return nb
}

// helperResources are the resources of the controller's own containers.
func helperResources(spec *v1alpha1.NotebookValidationJobSpec) corev1.ResourceRequirements {
	if r := spec.PodConfig.HelperResources; r != nil {
		return *r.DeepCopy()
	}
	return *defaultHelperResources.DeepCopy()
}

// helperSecurity is the securityContext of the controller's own containers.
func helperSecurity() *corev1.SecurityContext {
	sc := restricted()
	sc.RunAsUser = ptr.To[int64](helperUser)
	return sc
}

// cloneContainer clones the notebook's (and the golden notebook's) repository into the
// workspace; gitEnv names the notebook's repository. It also returns the volumes of the git
// credentials, which only this container mounts: each repository gets its own Secret's, so the
// golden repository's host never sees the notebook repository's.
func cloneContainer(spec *v1alpha1.NotebookValidationJobSpec, images Images, gitEnv []corev1.EnvVar) (corev1.Container, []corev1.Volume) {
	clone := corev1.Container{
		Name:         GitCloneContainer,
		Image:        images.Git,
		Command:      []string{"/bin/sh", "-c", cloneScript},
		Env:          append(slices.Clone(gitEnv), corev1.EnvVar{Name: "HOME", Value: WorkspacePath}),
		VolumeMounts: []corev1.VolumeMount{{Name: GitCloneVolume, MountPath: WorkspacePath}},
		// So is git's "fatal: ..." when the clone fails; on success the script writes the commits.
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		Resources:                helperResources(spec),
		SecurityContext:          helperSecurity(),
	}
	credentials := []struct{ secret, volume, path string }{{spec.Notebook.Git.CredentialsSecret, GitCredentialsVolume, CredentialsPath}}
	if g := spec.GoldenNotebook; g != nil && g.Git != nil {
		clone.Env = append(clone.Env, corev1.EnvVar{Name: EnvGoldenGitURL, Value: g.Git.URL}, corev1.EnvVar{Name: EnvGoldenGitRef, Value: g.Git.Ref})
		credentials = append(credentials, struct{ secret, volume, path string }{g.Git.CredentialsSecret, GoldenCredentialsVolume, GoldenCredentialsPath})
	}
	var volumes []corev1.Volume
	for _, c := range credentials {
		if c.secret == "" {
			continue
		}
		volumes = append(volumes, corev1.Volume{Name: c.volume, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: c.secret, DefaultMode: ptr.To[int32](0o400)}}})
		clone.VolumeMounts = append(clone.VolumeMounts, corev1.VolumeMount{Name: c.volume, MountPath: c.path, ReadOnly: true})
	}
	if len(volumes) > 0 {
		clone.Env = append(clone.Env, credentialsEnv...)
	}
	return clone, volumes
}

// compareContainer checks the executed notebook's cells and compares their outputs with the
// golden notebook's (when there is one), leaving out the output types and matches the golden
// notebook says to ignore. Its termination message carries the per-cell results and the
// executed notebook's SHA-256 to the controller.
func compareContainer(job *v1alpha1.NotebookValidationJob, images Images) corev1.Container {
	args := []string{"--executed", OutputFile(job), "--results-file", terminationLog}
	if g := job.Spec.GoldenNotebook; g != nil {
		tol := g.NumericTolerance
		if tol == "" {
			tol = "0"
		}
		args = append(args, "--golden", GoldenFile(job), "--tolerance", tol)
		for _, t := range g.IgnoreOutputTypes {
			args = append(args, "--ignore-output-type", string(t))
		}
		for _, p := range g.IgnorePatterns {
			args = append(args, "--ignore-pattern", p)
		}
	}
	return corev1.Container{
		Name:            CompareContainer,
		Image:           images.Compare,
		Command:         []string{compareBinary, compare.Command},
		Args:            args,
		Resources:       helperResources(&job.Spec),
		SecurityContext: helperSecurity(),
		VolumeMounts: []corev1.VolumeMount{
			{Name: GitCloneVolume, MountPath: WorkspacePath, ReadOnly: true},
			{Name: outputVolume(&job.Spec), MountPath: OutputPath, ReadOnly: true},
		},
		// It writes its message and results there; the log's tail when it could not.
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

// MergeEnv returns the controller's variables followed by the user's, leaving out user variables
// that would shadow one of the controller's.
func MergeEnv(own, user []corev1.EnvVar) []corev1.EnvVar {
	out := make([]corev1.EnvVar, 0, len(own)+len(user))
	taken := make(map[string]bool, len(own))
	for _, e := range own {
		out = append(out, e)
		taken[e.Name] = true
	}
	for _, e := range user {
		if !taken[e.Name] {
			out = append(out, *e.DeepCopy())
		}
	}
	return out
}

// ConvertVolume converts an API volume to the core type. Only the allowed sources exist on
// PodVolume, so nothing else (hostPath in particular) can reach the pod.
func ConvertVolume(v v1alpha1.PodVolume) corev1.Volume {
	out := corev1.Volume{Name: v.Name}
	switch {
	case v.PersistentVolumeClaim != nil:
		out.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{
			ClaimName: v.PersistentVolumeClaim.ClaimName, ReadOnly: v.PersistentVolumeClaim.ReadOnly}
	case v.ConfigMap != nil:
		out.ConfigMap = &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: v.ConfigMap.Name},
			Items:                v.ConfigMap.Items, DefaultMode: v.ConfigMap.DefaultMode, Optional: v.ConfigMap.Optional}
	case v.Secret != nil:
		out.Secret = &corev1.SecretVolumeSource{SecretName: v.Secret.SecretName,
			Items: v.Secret.Items, DefaultMode: v.Secret.DefaultMode, Optional: v.Secret.Optional}
	case v.EmptyDir != nil:
		out.EmptyDir = &corev1.EmptyDirVolumeSource{Medium: v.EmptyDir.Medium, SizeLimit: v.EmptyDir.SizeLimit}
	case v.CSI != nil:
		out.CSI = &corev1.CSIVolumeSource{Driver: v.CSI.Driver, ReadOnly: v.CSI.ReadOnly,
			VolumeAttributes: v.CSI.VolumeAttributes, NodePublishSecretRef: v.CSI.NodePublishSecretRef}
	}
	return *out.DeepCopy()
}
