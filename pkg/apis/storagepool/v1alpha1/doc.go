// Package v1alpha1 holds the StoragePool API (group storagepool.storage.k8s.io), shaped after the
// sig-storage KEP "StoragePool API for Advanced Storage Placement". The storagepool-sidecar
// publishes one object per pool a CSI driver reports; nothing else writes them.
//
// +kubebuilder:object:generate=true
// +kubebuilder:ac:generate=true
// +groupName=storagepool.storage.k8s.io
package v1alpha1
