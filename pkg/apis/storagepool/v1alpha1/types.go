package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConditionHealthy is the condition type saying whether volumes can be placed in the pool.
const ConditionHealthy = "Healthy"

// Reasons of the Healthy condition.
const (
	ReasonPoolHealthy       = "PoolHealthy"
	ReasonPoolUnhealthy     = "PoolUnhealthy"
	ReasonDriverUnreachable = "DriverUnreachable"
)

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=sp
// +kubebuilder:metadata:annotations="api-approved.kubernetes.io=unapproved, experimental-only"
// +kubebuilder:printcolumn:name="Driver",type=string,JSONPath=`.spec.driver`
// +kubebuilder:printcolumn:name="Nodes",type=string,JSONPath=`.status.accessibleNodes`
// +kubebuilder:printcolumn:name="Total",type=string,JSONPath=`.status.printed.total`
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.printed.available`
// +kubebuilder:printcolumn:name="Cached",type=string,JSONPath=`.status.printed.cached`
// +kubebuilder:printcolumn:name="Datasets",type=integer,JSONPath=`.status.cache.ready`,priority=1
// +kubebuilder:printcolumn:name="Healthy",type=string,JSONPath=`.status.conditions[?(@.type=="Healthy")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// StoragePool is a pool of storage a CSI driver can place volumes in: a directory on one node's
// fast disk, or a filesystem shared by several nodes.
type StoragePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec StoragePoolSpec `json:"spec"`
	// +optional
	Status StoragePoolStatus `json:"status,omitempty"`
}

// StoragePoolSpec says which driver owns the pool and how a StorageClass targets it.
type StoragePoolSpec struct {
	// Driver is the name of the CSI driver that reports this pool.
	// +required
	// +kubebuilder:validation:MinLength=1
	Driver string `json:"driver"`

	// Parameters are the StorageClass parameters that place a volume in this pool.
	// +optional
	Parameters map[string]string `json:"parameters,omitempty"`
}

// StoragePoolStatus is what the driver last reported about the pool.
type StoragePoolStatus struct {
	// AccessibleNodes are the nodes from which the pool can be used. Each reporting node owns
	// its own entry, so the nodes of a shared pool merge instead of replacing each other.
	// +optional
	// +listType=set
	AccessibleNodes []string `json:"accessibleNodes,omitempty"`

	// Capacity of the pool.
	// +optional
	Capacity *PoolCapacity `json:"capacity,omitempty"`

	// Errors are the most recent errors seen on the pool, oldest first; each reporting sidecar
	// keeps its newest few (--max-errors), so a shared pool holds at most that many per node.
	// +optional
	// +listType=map
	// +listMapKey=time
	// +listMapKey=message
	Errors []StoragePoolError `json:"errors,omitempty"`

	// Conditions of the pool; the Healthy condition is true when volumes can be placed in it.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the metadata.generation this status was written for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Cache is what the node's dataset cache in this pool holds. Unset for a shared pool.
	// +optional
	Cache *DatasetCache `json:"cache,omitempty"`

	// Printed is capacity and cache in human units, for kubectl's columns: the quantities
	// above are exact, and read as 65795028Ki.
	// +optional
	Printed *PrintedSizes `json:"printed,omitempty"`
}

// PrintedSizes are a pool's sizes in human units ("62.7 GiB"), as pkg/units writes them.
type PrintedSizes struct {
	// Total is capacity.total.
	// +optional
	Total string `json:"total,omitempty"`
	// Available is capacity.available.
	// +optional
	Available string `json:"available,omitempty"`
	// Cached is cache.bytes.
	// +optional
	Cached string `json:"cached,omitempty"`
}

// DatasetState is the state of a dataset in a node's cache.
// +kubebuilder:validation:Enum=Staging;Ready;Failed;Incomplete
type DatasetState string

// States of a cached dataset.
const (
	// DatasetStaging is being listed or fetched.
	DatasetStaging DatasetState = "Staging"
	// DatasetReady is complete: volumes on this node get it without a download.
	DatasetReady DatasetState = "Ready"
	// DatasetFailed is a dataset whose last staging attempt failed; reason says the kind.
	DatasetFailed DatasetState = "Failed"
	// DatasetIncomplete is staged in part; it resumes when a volume asks for it again.
	DatasetIncomplete DatasetState = "Incomplete"
)

// DatasetCache is the inventory of a pool's dataset cache on its node.
type DatasetCache struct {
	// Bytes staged in the cache, over every dataset.
	// +optional
	Bytes *resource.Quantity `json:"bytes,omitempty"`

	// Total is the number of datasets in the cache; Ready, Staging and Failed count those in
	// each state. The counts cover every dataset, listed in datasets or not.
	Total   int32 `json:"total"`
	Ready   int32 `json:"ready"`
	Staging int32 `json:"staging"`
	Failed  int32 `json:"failed"`

	// Datasets are the most recently used datasets, most recent first, at most the sidecar's
	// --max-cached-datasets (default 32).
	// +optional
	// +listType=map
	// +listMapKey=id
	// +kubebuilder:validation:MaxItems=1024
	Datasets []CachedDataset `json:"datasets,omitempty"`

	// Outputs are the volumes in the pool whose outputs (write-back, docs/datasets.md) are not at
	// their targets yet: in use, or being uploaded. At most the sidecar's --max-cached-datasets;
	// outputsTotal counts them all, listed or not. A VolumeManager is Completed only once no node
	// lists its volumes here.
	// +optional
	// +listType=map
	// +listMapKey=volume
	// +kubebuilder:validation:MaxItems=1024
	Outputs []VolumeOutputs `json:"outputs,omitempty"`
	// +optional
	OutputsTotal int32 `json:"outputsTotal,omitempty"`
}

// VolumeOutputs is what one volume's outputs hold on the node.
type VolumeOutputs struct {
	// Volume is the volume ID; for the per-pod writable copies of a static PV (a VolumeManager's),
	// the PV's volume handle.
	// +required
	Volume string `json:"volume"`
	// InUse counts publications (or a claim's staging) still in use: their upload starts when
	// they are let go.
	// +optional
	InUse int32 `json:"inUse,omitempty"`
	// Uploading counts copies handed off whose outputs are not all at the target yet; Failing
	// those of them whose last attempt failed (retried with backoff; the Events of the pod or
	// claim say why).
	// +optional
	Uploading int32 `json:"uploading,omitempty"`
	// +optional
	Failing int32 `json:"failing,omitempty"`
	// BytesPending is what the uploading copies still hold for their targets.
	// +optional
	BytesPending int64 `json:"bytesPending,omitempty"`
}

// CachedDataset is one dataset in a node's cache.
type CachedDataset struct {
	// ID names the dataset: a hash of its source location, endpoint and filters. Volumes with the
	// same ID share the cached data.
	// +required
	ID string `json:"id"`

	// Source is the dataset's URL (never credentials). Empty for a dataset a tenant named
	// (tenant is true): its location is the tenant's (docs/security.md).
	// +optional
	Source string `json:"source,omitempty"`

	// Scheme of the source: s3, nfs or file.
	// +optional
	Scheme string `json:"scheme,omitempty"`

	// Tenant is true when a pod author named the dataset (an inline volume, a VolumeManager).
	// +optional
	Tenant bool `json:"tenant,omitempty"`

	// State of the dataset on this node.
	// +required
	State DatasetState `json:"state"`

	// Reason is the kind of failure of a Failed dataset (Denied, NotFound, TooLarge, NoSpace,
	// Unavailable, ...). The failure's message goes only to the caller whose attempt failed.
	// +optional
	Reason string `json:"reason,omitempty"`

	// BytesDone is what is staged; BytesTotal the dataset's size once listed (0 before).
	// +optional
	BytesDone int64 `json:"bytesDone,omitempty"`
	// +optional
	BytesTotal int64 `json:"bytesTotal,omitempty"`

	// LastUsed is when a volume last used the dataset on this node, or its staging started.
	// +optional
	LastUsed *metav1.Time `json:"lastUsed,omitempty"`

	// References counts the volumes using the cached data: read-only volumes mounting it and
	// copies into writable volumes under way. A dataset with references is never evicted.
	// +optional
	References int32 `json:"references,omitempty"`
}

// PoolCapacity is the capacity of a pool.
type PoolCapacity struct {
	// Total size of the pool.
	// +optional
	Total *resource.Quantity `json:"total,omitempty"`

	// Available space for new volumes.
	// +optional
	Available *resource.Quantity `json:"available,omitempty"`

	// MaximumVolumeSize is the largest single volume the pool can still hold.
	// +optional
	MaximumVolumeSize *resource.Quantity `json:"maximumVolumeSize,omitempty"`
}

// StoragePoolError is one error seen on the pool.
type StoragePoolError struct {
	// Time the error was seen.
	// +required
	Time metav1.Time `json:"time"`

	// Message describes the error. For a shared pool it starts with the reporting node's name.
	// +required
	Message string `json:"message"`
}

// +kubebuilder:object:root=true

// StoragePoolList is a list of StoragePool objects.
type StoragePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StoragePool `json:"items"`
}
