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
}

// GoldenNotebook is a notebook with the expected outputs.
type GoldenNotebook struct {
	// git is the repository holding it; the notebook's own repository (same credentials) when
	// unset.
	// +optional
	Git *GitSource `json:"git,omitempty"`
	// path is the golden notebook's path inside that repository.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
	// numericTolerance is how far numbers in the outputs may be apart and still match: |a-b| <=
	// tolerance * max(1, |a|, |b|). A decimal number such as "1e-6"; 0 (exact) when unset.
	// +optional
	NumericTolerance string `json:"numericTolerance,omitempty"`
}

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
	// ref is a branch or tag; the repository's default branch when empty.
	// +optional
	Ref string `json:"ref,omitempty"`
	// credentialsSecret names a Secret of the job's namespace holding the clone credentials:
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

	// resources of the notebook container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

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
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
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
	// +kubebuilder:validation:MinLength=1
	ClaimName string `json:"claimName"`
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`
}

// ConfigMapVolumeSource names a ConfigMap.
type ConfigMapVolumeSource struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// +optional
	Items []corev1.KeyToPath `json:"items,omitempty"`
	// +optional
	DefaultMode *int32 `json:"defaultMode,omitempty"`
	// +optional
	Optional *bool `json:"optional,omitempty"`
}

// SecretVolumeSource names a Secret.
type SecretVolumeSource struct {
	// +kubebuilder:validation:MinLength=1
	SecretName string `json:"secretName"`
	// +optional
	Items []corev1.KeyToPath `json:"items,omitempty"`
	// +optional
	DefaultMode *int32 `json:"defaultMode,omitempty"`
	// +optional
	Optional *bool `json:"optional,omitempty"`
}

// EmptyDirVolumeSource is scratch space.
type EmptyDirVolumeSource struct {
	// +optional
	Medium corev1.StorageMedium `json:"medium,omitempty"`
	// +optional
	SizeLimit *resource.Quantity `json:"sizeLimit,omitempty"`
}

// CSIVolumeSource is an inline CSI volume; only the Cistern driver is accepted.
type CSIVolumeSource struct {
	// +kubebuilder:validation:MinLength=1
	Driver string `json:"driver"`
	// +optional
	ReadOnly *bool `json:"readOnly,omitempty"`
	// +optional
	VolumeAttributes map[string]string `json:"volumeAttributes,omitempty"`
	// +optional
	NodePublishSecretRef *corev1.LocalObjectReference `json:"nodePublishSecretRef,omitempty"`
}

// VolumeMount mounts a volume of podConfig.volumes into the notebook container.
type VolumeMount struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// mountPath is absolute.
	// +kubebuilder:validation:MinLength=1
	MountPath string `json:"mountPath"`
	// +optional
	SubPath string `json:"subPath,omitempty"`
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

	Spec   NotebookValidationJobSpec   `json:"spec,omitempty"`
	Status NotebookValidationJobStatus `json:"status,omitempty"`
}

// NotebookValidationJobList is a list of NotebookValidationJobs.
//
// +kubebuilder:object:root=true
type NotebookValidationJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NotebookValidationJob `json:"items"`
}
