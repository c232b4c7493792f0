// Package v1alpha1 holds the workloads.cistern.dev API: LeaderWorkerSet (field-compatible with
// leaderworkerset.x-k8s.io/v1) and NotebookValidationJob.
//
// +kubebuilder:object:generate=true
// +groupName=workloads.cistern.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every object in this package.
	GroupVersion = schema.GroupVersion{Group: "workloads.cistern.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
