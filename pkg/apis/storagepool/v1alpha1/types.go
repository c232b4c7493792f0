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
// +kubebuilder:printcolumn:name="Total",type=string,JSONPath=`.status.capacity.total`
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.capacity.available`
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
