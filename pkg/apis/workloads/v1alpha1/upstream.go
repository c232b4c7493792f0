package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// UpstreamGroupVersion is upstream LeaderWorkerSet's API. The controller can serve LeaderWorkerSet
// under it instead of GroupVersion, as the drop-in LWS controller of a cluster (the kustomize
// component deploy/csi/lws-upstream; docs/workloads.md). The schema is the same: ours accepts
// every upstream v1 field and adds the KEP fields upstream lacks.
var UpstreamGroupVersion = schema.GroupVersion{Group: "leaderworkerset.x-k8s.io", Version: "v1"}

// AddToSchemeWithLeaderWorkerSetAt adds the types of this package to a scheme, LeaderWorkerSet
// under lws (GroupVersion or UpstreamGroupVersion) and the others under GroupVersion. A Go type
// maps to one kind only, so a scheme serves LeaderWorkerSet under one group.
func AddToSchemeWithLeaderWorkerSetAt(s *runtime.Scheme, lws schema.GroupVersion) error {
	if lws == GroupVersion {
		return AddToScheme(s)
	}
	s.AddKnownTypes(GroupVersion, &NotebookValidationJob{}, &NotebookValidationJobList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	s.AddKnownTypes(lws, &LeaderWorkerSet{}, &LeaderWorkerSetList{})
	metav1.AddToGroupVersion(s, lws)
	return nil
}
