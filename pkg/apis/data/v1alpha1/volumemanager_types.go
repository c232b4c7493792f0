package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SourceType is where a dataset comes from.
// +kubebuilder:validation:Enum={S3,NFS,Local}
type SourceType string

const (
	SourceS3    SourceType = "S3"
	SourceNFS   SourceType = "NFS"
	SourceLocal SourceType = "Local"
)

// State is the lifecycle state of a VolumeManager (status.state), as the KVC API names them:
// Pending -> Running -> Completed, and Failed. docs/workloads.md has the transitions.
// +kubebuilder:validation:Enum={Pending,Ready,Running,Failed,Completed}
type State string

const (
	// StatePending: the data is not yet on replicas nodes of every volume (placing, staging, a
	// node being restaged after its cache evicted the data).
	StatePending State = "Pending"
	// StateRunning: every volume's data is Ready on replicas nodes and its claim is there for
	// pods to use (condition InUse says whether any do). KVC's "ready" state.
	StateRunning State = "Running"
	// StateFailed: a volume is invalid or staging failed on one of its nodes; not final: the
	// controller keeps trying and the state follows once the cause is fixed.
	StateFailed State = "Failed"
	// StateCompleted: spec.state Completed was asked and everything made for the VolumeManager
	// (stager pods, claims, volumes) is gone, so no node holds its data in use, and every output
	// (outputTarget) is at its target. Final.
	StateCompleted State = "Completed"
	// StateReady was status.state's name for Running before the KVC lifecycle; the controller no
	// longer writes it (condition Ready says the same) and rewrites it on its next reconcile.
	StateReady State = "Ready"
)

// RequestedState is what spec.state asks for.
// +kubebuilder:validation:Enum={Running,Completed}
type RequestedState string

const (
	// RequestRunning (or no spec.state): stage the data and keep it on its nodes.
	RequestRunning RequestedState = "Running"
	// RequestCompleted: release the volumes once no pod uses them; then status.state is
	// Completed. Final: a Completed VolumeManager is not started again.
	RequestCompleted RequestedState = "Completed"
)

// NodeState is the state of one volume's data on one node.
// +kubebuilder:validation:Enum={Pending,Staging,Ready,Failed}
type NodeState string

const (
	// NodePending: the node is chosen; staging has not started (its stager pod is not running).
	NodePending NodeState = "Pending"
	// NodeStaging: the node's cache is fetching the dataset (bytesDone of bytesTotal).
	NodeStaging NodeState = "Staging"
	// NodeReady: the dataset is in the node's cache and the VolumeManager's credentials were
	// proved on that node (its stager pod mounted the claim).
	NodeReady NodeState = "Ready"
	// NodeFailed: staging failed on the node; message says why.
	NodeFailed NodeState = "Failed"
)

// Condition types of a VolumeManager.
const (
	// ConditionReady is true while status.state is Running and spec.state does not ask
	// Completed: pods may start using the volumes. Its reason is the state (Pending, Running,
	// Failed, Completing, Completed), so each change of state is an Event.
	ConditionReady = "Ready"
	// ConditionPlaced is true when every volume has replicas eligible nodes chosen.
	ConditionPlaced = "Placed"
	// ConditionDataReady is true when every volume's data is Ready on replicas nodes.
	ConditionDataReady = "DataReady"
	// ConditionInUse is true while pods other than the stager pods use a volume's claim.
	ConditionInUse = "InUse"
	// ConditionCompleted is set once spec.state Completed is asked: false while the volumes are
	// being released, true once they are.
	ConditionCompleted = "Completed"
	// ConditionOutputsUploaded is set on a VolumeManager with an outputTarget: true once no node
	// holds outputs of its volumes that are not at their targets (reason Uploaded), false while
	// copies are in use (InUse), being uploaded (Uploading, with counts and bytes) or failing
	// (UploadFailing: a target that refuses is retried and the data kept).
	ConditionOutputsUploaded = "OutputsUploaded"
)

// Reasons of the conditions (and of the Events that go with them).
const (
	ReasonPlaced         = "Placed"
	ReasonTooFewNodes    = "TooFewNodes"
	ReasonInvalid        = "InvalidVolume"
	ReasonStaging        = "Staging"
	ReasonDataReady      = "DataReady"
	ReasonStagingFailed  = "StagingFailed"
	ReasonReplacingNodes = "ReplacingNodes"
	ReasonNodesReplaced  = "NodesReplaced"
	ReasonPodsUsing      = "PodsUsing"
	ReasonNotInUse       = "NotInUse"
	// ReasonCompleting: spec.state is Completed and the volumes are being released.
	ReasonCompleting = "Completing"
	// ReasonReleased: spec.state is Completed and nothing made for the VolumeManager is left.
	ReasonReleased = "Released"
	// Reasons of OutputsUploaded (and of Completed while outputs hold the volumes).
	ReasonOutputsInUse    = "InUse"
	ReasonUploading       = "Uploading"
	ReasonUploadFailing   = "UploadFailing"
	ReasonOutputsUnknown  = "OutputsUnknown"
	ReasonOutputsUploaded = "Uploaded"
)

// Keys of VolumeConfig.options.
const (
	// OptionEndpoint is the S3 endpoint URL.
	OptionEndpoint = "endpoint"
	// OptionRegion is the S3 region.
	OptionRegion = "region"
	// OptionPathStyle is "true" for path-style S3 addressing.
	OptionPathStyle = "pathStyle"
	// OptionNFSVersion is an NFS source's protocol: "3" (default) or "4" (the dataset
	// parameter nfsVersion).
	OptionNFSVersion = "nfsVersion"
	// OptionInclude and OptionExclude are glob filters on keys/paths.
	OptionInclude = "include"
	OptionExclude = "exclude"
	// OptionSecretName names a Secret of the VolumeManager's namespace holding accessKeyID,
	// secretAccessKey and optional sessionToken.
	OptionSecretName = "secretName"
)

// VolumeConfig is one dataset and where it must be.
// +kubebuilder:validation:XValidation:rule="!has(self.outputTarget) || (has(self.accessMode) && self.accessMode != 'ReadOnlyMany')",message="outputTarget needs a writer accessMode: what is uploaded is each pod's writable copy"
// +kubebuilder:validation:XValidation:rule="has(self.outputTarget) || (!has(self.outputInterval) && !has(self.outputDeletions))",message="outputInterval and outputDeletions need outputTarget"
// +kubebuilder:validation:XValidation:rule="self.sourceType == 'S3' ? self.sourceURL.startsWith('s3://') : self.sourceType == 'NFS' ? self.sourceURL.startsWith('nfs://') : self.sourceURL.startsWith('file:///')",message="sourceURL must start with s3:// for S3, nfs:// for NFS and file:/// for Local"
// +kubebuilder:validation:XValidation:rule="self.sourceType == 'S3' || !has(self.options) || !self.options.exists(k, k in ['endpoint', 'region', 'pathStyle', 'secretName'])",message="options endpoint, region, pathStyle and secretName apply to S3 sources only"
type VolumeConfig struct {
	// id names this volume inside the VolumeManager.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=40
	ID string `json:"id"`
	// replicas is the number of distinct nodes that hold the data.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Replicas int32 `json:"replicas"`
	// sourceType is S3, NFS or Local.
	SourceType SourceType `json:"sourceType"`
	// sourceURL is s3://bucket/prefix, nfs://server/export/path or file:///dir (Local, only under
	// the directories the admin allowed).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	SourceURL string `json:"sourceURL"`
	// accessMode of the claim users mount; ReadOnlyMany when empty. ReadWriteOnce and
	// ReadWriteMany give each pod its own writable copy, filled from the node's cache.
	// +optional
	// +kubebuilder:validation:Enum={ReadOnlyMany,ReadWriteOnce,ReadWriteMany,ReadWriteOncePod}
	AccessMode corev1.PersistentVolumeAccessMode `json:"accessMode,omitempty"`
	// capacity is the most the dataset may take on each node (a larger dataset fails staging
	// with both sizes) and the size of each pod's writable copy; 1Gi when empty, at most 1Pi.
	// Only nodes whose pools have this much free space are chosen. (Checked by the controller: a
	// CEL rule parsing a quantity of unbounded length is over the API server's cost budget.)
	// +optional
	Capacity *resource.Quantity `json:"capacity,omitempty"`
	// labels go on the objects made for this volume; the data.cistern.dev/ prefix is the
	// controller's.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('data.cistern.dev/') && self[k].size() <= 63)",message="label values are at most 63 characters and keys must not use the data.cistern.dev/ prefix"
	Labels map[string]string `json:"labels,omitempty"`
	// options: endpoint, region, pathStyle, nfsVersion (NFS: "3" or "4"), include, exclude, secretName.
	// +optional
	// +kubebuilder:validation:MaxProperties=7
	// +kubebuilder:validation:XValidation:rule="self.all(k, k in ['endpoint', 'region', 'pathStyle', 'nfsVersion', 'include', 'exclude', 'secretName'] && self[k].size() <= 4096)",message="options are endpoint, region, pathStyle, nfsVersion, include, exclude and secretName, each at most 4096 characters"
	Options map[string]string `json:"options,omitempty"`
	// nodeAffinity restricts the nodes that may hold the data.
	// +optional
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity,omitempty"`
	// tolerations let the data go to tainted nodes.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// outputTarget keeps what pods write (write-back, docs/datasets.md): each pod's writable copy
	// (a writer accessMode) is uploaded after the pod lets it go, under s3://bucket/prefix (an S3
	// dataset's endpoint, written with secretName's keys, which must be allowed to write it:
	// checked before the pod starts) or nfs://server/export/path (a server the administrator
	// allows). It may name ${pod.namespace} and ${pod.name}. With an output target, status.state
	// turns Completed only once every node has uploaded every copy.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	OutputTarget string `json:"outputTarget,omitempty"`
	// outputInterval also uploads, at this interval, what changed while a pod uses its copy
	// (checkpoints): a duration such as 10m, at least the node's --writeback-min-interval.
	// +optional
	OutputInterval *metav1.Duration `json:"outputInterval,omitempty"`
	// outputDeletions also deletes at the target the dataset files a pod deleted; off by default.
	// +optional
	OutputDeletions bool `json:"outputDeletions,omitempty"`
}

// VolumeManagerSpec lists datasets.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.state) || oldSelf.state != 'Completed' || (has(self.state) && self.state == 'Completed')",message="spec.state Completed is final: create a new VolumeManager to stage the data again"
type VolumeManagerSpec struct {
	// volumes are the datasets to make present.
	// +listType=map
	// +listMapKey=id
	// +kubebuilder:validation:MaxItems=64
	VolumeConfigs []VolumeConfig `json:"volumes"`
	// state is the requested state: Running (the default) stages the data and keeps it on its
	// nodes; Completed releases the volumes once no pod uses them (status.state then turns
	// Completed). Completed is final.
	// +optional
	State RequestedState `json:"state,omitempty"`
}

// Volume is where one dataset is and how to use it.
type Volume struct {
	// id of the VolumeConfig.
	ID string `json:"id"`
	// volumeSource to put in a pod's volumes.
	// +optional
	VolumeSource corev1.VolumeSource `json:"volumeSource,omitempty"`
	// message says what is missing, if anything.
	// +optional
	Message string `json:"message,omitempty"`
	// nodeAffinity sends pods to the nodes holding the data.
	// +optional
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity,omitempty"`
	// nodes are the nodes chosen to hold the data, with its state on each.
	// +optional
	// +listType=map
	// +listMapKey=name
	Nodes []NodeStatus `json:"nodes,omitempty"`
}

// NodeStatus is one volume's data on one node, read from the node's StoragePool inventory.
type NodeStatus struct {
	// name of the node (the driver's node ID, the value of topology.cistern.csi.dev/node).
	Name string `json:"name"`
	// state of the data on the node.
	State NodeState `json:"state"`
	// bytesDone is how much of the dataset is staged on the node.
	// +optional
	BytesDone int64 `json:"bytesDone,omitempty"`
	// bytesTotal is the dataset's size once listed (0 before).
	// +optional
	BytesTotal int64 `json:"bytesTotal,omitempty"`
	// message says what is under way or what failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// VolumeManagerStatus is the observed state.
type VolumeManagerStatus struct {
	// volumes are, per volume of the spec, its nodes and the claim pods use.
	// +optional
	// +listType=map
	// +listMapKey=id
	Volumes []Volume `json:"volumes,omitempty"`
	// state is Running when every volume's data is Ready on its nodes, Failed when a volume is
	// invalid or a node failed, Completed once spec.state Completed was asked and the volumes are
	// released, Pending otherwise. (Ready is Running's former name, no longer written.)
	// +optional
	State State `json:"state,omitempty"`
	// message explains the state.
	// +optional
	Message string `json:"message,omitempty"`
	// progress is the data staged so far over every volume's chosen nodes, in human units:
	// "3.1 GiB of 12.5 GiB, 24%" (the bytes of the datasets listed so far; empty before any is).
	// +optional
	Progress string `json:"progress,omitempty"`
	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// conditions: Ready (status.state is Running), Placed (nodes chosen for every volume),
	// DataReady (the data is on them), InUse (pods use the claims) and, once spec.state
	// Completed is asked, Completed (the volumes are released).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// VolumeManager makes datasets present on nodes through the Cistern CSI driver.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName={vm}
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="the name labels the objects made for it: at most 63 characters"
// +kubebuilder:printcolumn:name="State",type="string",JSONPath=".status.state"
// +kubebuilder:printcolumn:name="Progress",type="string",JSONPath=".status.progress"
// +kubebuilder:printcolumn:name="Message",type="string",JSONPath=".status.message",priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type VolumeManager struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the datasets to make present and on how many nodes each.
	Spec VolumeManagerSpec `json:"spec,omitempty"`
	// status is where each dataset is, per node, and the claim pods use to read it.
	Status VolumeManagerStatus `json:"status,omitempty"`
}

// VolumeManagerList is a list of VolumeManagers.
//
// +kubebuilder:object:root=true
type VolumeManagerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the VolumeManagers.
	Items []VolumeManager `json:"items"`
}
