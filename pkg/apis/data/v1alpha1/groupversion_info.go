// Package v1alpha1 holds the data.cistern.dev API: VolumeManager, which makes a dataset present
// on a number of nodes through the Cistern CSI driver (the KVC API).
//
// +kubebuilder:object:generate=true
// +groupName=data.cistern.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every object in this package.
	GroupVersion = schema.GroupVersion{Group: "data.cistern.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes lists every object of this package. The API packages depend only on apimachinery,
// so clients can import them without controller-runtime.
func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &VolumeManager{}, &VolumeManagerList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
