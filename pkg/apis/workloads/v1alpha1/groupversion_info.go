// Package v1alpha1 holds the workloads.cistern.dev API: LeaderWorkerSet (field-compatible with
// leaderworkerset.x-k8s.io/v1) and NotebookValidationJob.
//
// +kubebuilder:object:generate=true
// +groupName=workloads.cistern.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every object in this package.
	GroupVersion = schema.GroupVersion{Group: "workloads.cistern.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes lists every object of this package. The API packages depend only on apimachinery,
// so clients can import them without controller-runtime.
func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &LeaderWorkerSet{}, &LeaderWorkerSetList{},
		&NotebookValidationJob{}, &NotebookValidationJobList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
