package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NotebookValidationJobSpec says which notebook to run, in which image, with which volumes.
type NotebookValidationJobSpec struct {
	// notebook is where the notebook lives.
	Notebook NotebookSource `json:"notebook"`

	// podConfig shapes the pod that runs the notebook.
	PodConfig PodConfig `json:"podConfig"`

	// timeout bounds the run, from the pod's start; the job fails when it passes. Default 30m.
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// goldenNotebook is the expected result: after the run, the executed notebook's outputs are
	// compared with its, cell by cell, and the job fails at the first cell that differs.
	// +optional
	GoldenNotebook *GoldenNotebook `json:"goldenNotebook,omitempty"`

	// retries is how many times a failed run (the clone or the notebook failed) is run again, in a
	// new pod, before the job fails. A timeout or a golden mismatch is not retried. Default 0.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10
	// +optional
	Retries *int32 `json:"retries,omitempty"`

	// output keeps the executed notebook beyond the pod: it is written into a writable Cistern
	// dataset volume of podConfig.volumes, whose write-back uploads it to an S3 prefix with that
	// volume's own credentials once the pod has ended. Without it the executed notebook is lost
	// with the pod.
	// +optional
	Output *NotebookOutput `json:"output,omitempty"`
}

// NotebookOutput names where the executed notebook is kept.
type NotebookOutput struct {
	// volume names a volume of podConfig.volumes: an inline csi volume of the Cistern driver, not
	// readOnly, of an S3 dataset (source s3://...), with a nodePublishSecretRef whose credentials
	// may write the target. It is mounted at /output, where papermill writes the executed
	// notebook; the node's write-back uploads what the pod created or changed in it (docs/datasets.md,
	// "Write-back"). Credentials that may not write the target stop the pod before it starts.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Volume string `json:"volume"`
	// target is s3://bucket[/prefix] on the volume's endpoint. Each run uploads under
	// <target>/<pod name>/, so a retry never overwrites an earlier run's notebook.
	// +kubebuilder:validation:MinLength=6
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$`
	Target string `json:"target"`
}

// GoldenNotebook is a notebook with the expected outputs.
type GoldenNotebook struct {
	// git is the repository holding it, with its own credentialsSecret (none when unset); the
	// notebook's own repository when unset.
	// +optional
	Git *GitSource `json:"git,omitempty"`
	// path is the golden notebook's path inside that repository.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
	// numericTolerance is how far numbers in the outputs may be apart and still match: |a-b| <=
	// tolerance * max(1, |a|, |b|). A decimal number such as "1e-6"; 0 (exact) when unset.
	// +optional
	NumericTolerance string `json:"numericTolerance,omitempty"`
	// ignoreOutputTypes leaves outputs of these types out of the comparison, in both notebooks:
	// stream (both streams), stdout, stderr, execute_result, display_data or error.
	// +kubebuilder:validation:MaxItems=6
	// +listType=set
	// +optional
	IgnoreOutputTypes []OutputType `json:"ignoreOutputTypes,omitempty"`
	// ignorePatterns are regular expressions (RE2 syntax) whose matches in output text are
	// ignored: every match is taken as equal to any other, in both notebooks, so that timestamps,
	// durations, addresses or random identifiers do not fail the comparison.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=1024
	// +listType=atomic
	// +optional
	IgnorePatterns []string `json:"ignorePatterns,omitempty"`
}

// OutputType is a kind of notebook output a comparison can leave out.
// +kubebuilder:validation:Enum={stream,stdout,stderr,execute_result,display_data,error}
type OutputType string

// NotebookSource is a notebook inside a git repository.
type NotebookSource struct {
	// git is the repository holding the notebook.
	Git GitSource `json:"git"`
	// path is the notebook's path inside the repository.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
}

// GitSource is a git repository and revision.
type GitSource struct {
	// url is the clone URL.
	// +kubebuilder:validation:MinLength=1
	URL string `json:"url"`
	// ref is a branch, a tag, or a full commit SHA (40 or 64 hexadecimal digits); the
	// repository's default branch when empty. The commit it resolved to is recorded in the status.
	// +optional
	Ref string `json:"ref,omitempty"`
	// credentialsSecret names a Secret of the job's namespace holding this repository's clone
	// credentials:
	// username and password (a token) for HTTPS, as in a kubernetes.io/basic-auth Secret, or
	// ssh-privatekey (kubernetes.io/ssh-auth) and known_hosts for SSH. Only the git-clone
	// container sees them; the controller never reads them.
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`
}

// PodConfig shapes the validation pod.
type PodConfig struct {
	// containerImage runs the notebook; it must provide papermill.
	// +kubebuilder:validation:MinLength=1
	ContainerImage string `json:"containerImage"`

	// resources of the notebook container. Under a ResourceQuota without a LimitRange, set them.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// helperResources of the controller's own containers (git-clone, golden-compare); requests
	// of 100m CPU and 128Mi of memory, limits of 1 CPU and 512Mi, when unset.
	// +optional
	HelperResources *corev1.ResourceRequirements `json:"helperResources,omitempty"`

	// securityContext of the pod. What is unset is filled so that the pod passes the Pod
	// Security "restricted" profile: runAsNonRoot and the RuntimeDefault seccomp profile (every
	// container also drops all capabilities and may not escalate privileges). An image that runs
	// as root needs runAsUser here.
	// +optional
	SecurityContext *corev1.PodSecurityContext `json:"securityContext,omitempty"`

	// imagePullSecrets name Secrets of the job's namespace for pulling the images.
	// +listType=atomic
	// +optional
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// env is added to the notebook container; the controller's own variables win on a clash.
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`

	// envFrom adds the keys of Secrets and ConfigMaps of the job's namespace to the notebook
	// container's environment.
	// +optional
	EnvFrom []corev1.EnvFromSource `json:"envFrom,omitempty"`

	// serviceAccountName runs the pod as this ServiceAccount of the job's namespace.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// nodeSelector, tolerations and affinity place the pod, e.g. on GPU nodes.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// tolerations of the pod.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// affinity of the pod.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// volumes the notebook may mount. Each names exactly one source.
	// +optional
	// +listType=atomic
	Volumes []PodVolume `json:"volumes,omitempty"`

	// volumeMounts of the notebook container.
	// +optional
	// +listType=atomic
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
}

// PodVolume is a volume of one of the allowed types. Unknown keys (hostPath, nfs, ...) are kept so
// admission can refuse them by name instead of dropping them silently.
//
// +kubebuilder:pruning:PreserveUnknownFields
type PodVolume struct {
	// name of the volume, referenced by volumeMounts.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// persistentVolumeClaim mounts an existing claim of the job's namespace.
	// +optional
	PersistentVolumeClaim *PersistentVolumeClaimVolumeSource `json:"persistentVolumeClaim,omitempty"`
	// configMap mounts a ConfigMap of the job's namespace.
	// +optional
	ConfigMap *ConfigMapVolumeSource `json:"configMap,omitempty"`
	// secret mounts a Secret of the job's namespace.
	// +optional
	Secret *SecretVolumeSource `json:"secret,omitempty"`
	// emptyDir is scratch space for the run.
	// +optional
	EmptyDir *EmptyDirVolumeSource `json:"emptyDir,omitempty"`
	// csi is an inline volume of the Cistern driver, e.g. a dataset.
	// +optional
	CSI *CSIVolumeSource `json:"csi,omitempty"`
}

// PersistentVolumeClaimVolumeSource names a claim.
type PersistentVolumeClaimVolumeSource struct {
	// claimName is the claim, in the job's namespace.
	// +kubebuilder:validation:MinLength=1
	ClaimName string `json:"claimName"`
	// readOnly mounts it read-only.
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`
}

// ConfigMapVolumeSource names a ConfigMap.
type ConfigMapVolumeSource struct {
	// name of the ConfigMap, in the job's namespace.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// items project chosen keys to chosen paths; every key when unset.
	// +optional
	Items []corev1.KeyToPath `json:"items,omitempty"`
	// defaultMode of the files, 0-0777.
	// +optional
	DefaultMode *int32 `json:"defaultMode,omitempty"`
	// optional lets the pod start without the ConfigMap.
	// +optional
	Optional *bool `json:"optional,omitempty"`
}

// SecretVolumeSource names a Secret.
type SecretVolumeSource struct {
	// secretName of the Secret, in the job's namespace.
	// +kubebuilder:validation:MinLength=1
	SecretName string `json:"secretName"`
	// items project chosen keys to chosen paths; every key when unset.
	// +optional
	Items []corev1.KeyToPath `json:"items,omitempty"`
	// defaultMode of the files, 0-0777.
	// +optional
	DefaultMode *int32 `json:"defaultMode,omitempty"`
	// optional lets the pod start without the Secret.
	// +optional
	Optional *bool `json:"optional,omitempty"`
}

// EmptyDirVolumeSource is scratch space.
type EmptyDirVolumeSource struct {
	// medium is "" (the node's disk), Memory, or HugePages[-<size>].
	// +optional
	Medium corev1.StorageMedium `json:"medium,omitempty"`
	// sizeLimit bounds the space it may take.
	// +optional
	SizeLimit *resource.Quantity `json:"sizeLimit,omitempty"`
}

// CSIVolumeSource is an inline CSI volume; only the Cistern driver is accepted.
type CSIVolumeSource struct {
	// driver must be the Cistern driver, cistern.csi.dev.
	// +kubebuilder:validation:MinLength=1
	Driver string `json:"driver"`
	// readOnly mounts it read-only.
	// +optional
	ReadOnly *bool `json:"readOnly,omitempty"`
	// volumeAttributes are the driver's inline volume parameters (docs/datasets.md).
	// +optional
	VolumeAttributes map[string]string `json:"volumeAttributes,omitempty"`
	// nodePublishSecretRef names a Secret of the job's namespace with the source's credentials.
	// +optional
	NodePublishSecretRef *corev1.LocalObjectReference `json:"nodePublishSecretRef,omitempty"`
}

// VolumeMount mounts a volume of podConfig.volumes into the notebook container.
type VolumeMount struct {
	// name of a volume of podConfig.volumes.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// mountPath is absolute.
	// +kubebuilder:validation:MinLength=1
	MountPath string `json:"mountPath"`
	// subPath mounts this relative path of the volume instead of its root.
	// +optional
	SubPath string `json:"subPath,omitempty"`
	// readOnly mounts it read-only.
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`
}

// NotebookPhase is where a job is in its life.
// +kubebuilder:validation:Enum={Pending,Running,Succeeded,Failed}
type NotebookPhase string

const (
	NotebookPhasePending   NotebookPhase = "Pending"
	NotebookPhaseRunning   NotebookPhase = "Running"
	NotebookPhaseSucceeded NotebookPhase = "Succeeded"
	NotebookPhaseFailed    NotebookPhase = "Failed"
)

// Condition types and reasons of a NotebookValidationJob.
const (
	// NotebookConditionVolumesReady is False while a referenced PVC or ConfigMap is missing.
	NotebookConditionVolumesReady = "VolumesReady"
	// NotebookConditionComplete is True once the job Succeeded or Failed.
	NotebookConditionComplete = "Complete"
	// NotebookConditionPodCreated is False while the API server refuses the pod for a reason that
	// may pass (quota, an admission webhook); the message is the API server's.
	NotebookConditionPodCreated = "PodCreated"

	ReasonVolumeMissing = "VolumeMissing"
	ReasonVolumesFound  = "VolumesFound"
	ReasonSucceeded     = "Succeeded"
	ReasonFailed        = "NotebookFailed"
	ReasonTimedOut      = "Timeout"
	ReasonPodDeleted    = "PodDeleted"
	// ReasonGoldenMismatch: the run's outputs differ from the golden notebook's.
	ReasonGoldenMismatch = "GoldenMismatch"
	// ReasonPodCreateFailed: the API server refused the pod.
	ReasonPodCreateFailed = "PodCreateFailed"
)

// CellOutcome is how one code cell of the executed notebook fared.
// +kubebuilder:validation:Enum={Passed,Failed}
type CellOutcome string

const (
	// CellPassed: the cell ran without an error and, with a golden notebook, its outputs match
	// the golden cell's.
	CellPassed CellOutcome = "Passed"
	// CellFailed: the cell raised an error, or its outputs differ from the golden cell's.
	CellFailed CellOutcome = "Failed"
)

// CellResult is the result of one code cell.
type CellResult struct {
	// index of the cell among all the notebook's cells, from 0, as Jupyter counts them.
	Index int32 `json:"index"`
	// result is Passed or Failed.
	Result CellOutcome `json:"result"`
	// reason says why a cell failed (the first differing output, or the error it raised), at
	// most 200 characters of it.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// NotebookValidationJobStatus is the observed state of a job.
type NotebookValidationJobStatus struct {
	// phase is Pending, Running, Succeeded or Failed.
	// +optional
	Phase NotebookPhase `json:"phase,omitempty"`
	// podName is the validation pod.
	// +optional
	PodName string `json:"podName,omitempty"`
	// startTime is when the pod started running.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// completionTime is when the job reached Succeeded or Failed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// message explains the phase.
	// +optional
	Message string `json:"message,omitempty"`
	// conditions: VolumesReady, PodCreated (only while a pod is refused), Complete.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// commit is the commit of the notebook's repository the run used (what ref resolved to).
	// +optional
	Commit string `json:"commit,omitempty"`
	// goldenCommit is the commit of the golden notebook's repository, when it has its own.
	// +optional
	GoldenCommit string `json:"goldenCommit,omitempty"`
	// retries is how many failed runs were run again so far.
	// +optional
	Retries int32 `json:"retries,omitempty"`
	// cells are the per-cell results of the last run's code cells, compared with the golden
	// notebook when it has one; recorded when the job has a goldenNotebook or an output, once
	// the notebook ran to its end. Up to 256 cells (cellsOmitted counts the rest).
	// +listType=atomic
	// +optional
	Cells []CellResult `json:"cells,omitempty"`
	// cellsOmitted is how many code cells had no room in cells.
	// +optional
	CellsOmitted int32 `json:"cellsOmitted,omitempty"`
	// outputURL is where the last run's executed notebook is uploaded (spec.output): the node
	// uploads it after the pod has ended, retrying until the target holds it.
	// +optional
	OutputURL string `json:"outputURL,omitempty"`
	// outputSHA256 is the SHA-256 of the executed notebook as the pod wrote it, to check the
	// object at outputURL against.
	// +optional
	OutputSHA256 string `json:"outputSHA256,omitempty"`
}

// NotebookValidationJob clones a repository, runs one notebook with papermill and records the result.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName={nvj}
// +kubebuilder:printcolumn:name="Phase",type="string",JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="Pod",type="string",JSONPath=".status.podName"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type NotebookValidationJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the notebook to run, where to get it, the pod that runs it and the golden notebook its outputs are compared with.
	Spec NotebookValidationJobSpec `json:"spec,omitempty"`
	// status is the phase of the run, its pod, and the conditions the controller reports.
	Status NotebookValidationJobStatus `json:"status,omitempty"`
}

// NotebookValidationJobList is a list of NotebookValidationJobs.
//
// +kubebuilder:object:root=true
type NotebookValidationJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the NotebookValidationJobs.
	Items []NotebookValidationJob `json:"items"`
}
