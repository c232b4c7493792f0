// Package v1alpha1 holds the data.cistern.dev API: VolumeManager, which makes a dataset present
// on a number of nodes through the Cistern CSI driver (the KVC API).
//
// +kubebuilder:object:generate=true
// +groupName=data.cistern.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every object in this package.
	GroupVersion = schema.GroupVersion{Group: "data.cistern.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
