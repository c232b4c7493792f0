package v1alpha1

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Labels, annotations and environment variables shared with upstream LeaderWorkerSet, so tools
// that understand leaderworkerset.x-k8s.io objects keep working on ours.
const (
	// SetNameLabelKey names the LeaderWorkerSet of a pod, StatefulSet or Service.
	SetNameLabelKey = "leaderworkerset.sigs.k8s.io/name"
	// GroupIndexLabelKey is the index of the group (replica) a pod or StatefulSet belongs to.
	GroupIndexLabelKey = "leaderworkerset.sigs.k8s.io/group-index"
	// WorkerIndexLabelKey is the index of a pod in its group; the leader is 0.
	WorkerIndexLabelKey = "leaderworkerset.sigs.k8s.io/worker-index"
	// GroupUniqueHashLabelKey is a hash that is the same for every pod of one group.
	GroupUniqueHashLabelKey = "leaderworkerset.sigs.k8s.io/group-key"
	// RevisionKey is the hash of the template a pod or StatefulSet was built from.
	RevisionKey = "leaderworkerset.sigs.k8s.io/template-revision-hash"
	// SizeAnnotationKey carries spec.leaderWorkerTemplate.size on every pod.
	SizeAnnotationKey = "leaderworkerset.sigs.k8s.io/size"
	// ReplicasAnnotationKey carries spec.replicas on the leader StatefulSet.
	ReplicasAnnotationKey = "leaderworkerset.sigs.k8s.io/replicas"
	// LeaderPodNameAnnotationKey names the leader pod on every worker pod.
	LeaderPodNameAnnotationKey = "leaderworkerset.sigs.k8s.io/leader-name"
	// SubdomainPolicyAnnotationKey marks leader pods of a UniquePerReplica LeaderWorkerSet.
	SubdomainPolicyAnnotationKey = "leaderworkerset.sigs.k8s.io/subdomainPolicy"

	// ReplicaUniqueNodeSelectorAnnotationKey carries schedulingPolicy.replicaUniqueNodeSelector.
	ReplicaUniqueNodeSelectorAnnotationKey = "leaderworkerset.sigs.k8s.io/replicaUniqueNodeSelector"
	// ReplicaUniqueTolerationKeyAnnotationKey carries schedulingPolicy.replicaUniqueToleration.key.
	ReplicaUniqueTolerationKeyAnnotationKey = "leaderworkerset.sigs.k8s.io/replicaUniqueTolerationKey"
	// ReplicaUniqueTolerationEffectAnnotationKey carries schedulingPolicy.replicaUniqueToleration.effect.
	ReplicaUniqueTolerationEffectAnnotationKey = "leaderworkerset.sigs.k8s.io/replicaUniqueTolerationEffect"

	// ExclusiveKeyAnnotationKey, on a LeaderWorkerSet, is a node label (topology) key: each group
	// gets a topology domain of its own (pod affinity and anti-affinity on the group key).
	ExclusiveKeyAnnotationKey = "leaderworkerset.sigs.k8s.io/exclusive-topology"
	// RecreateGroupAfterStartAnnotationKey, on a LeaderWorkerSet with restartPolicy
	// RecreateGroupOnPodRestart, makes it RecreateGroupAfterStart (upstream's experimental form of
	// that policy; any value).
	RecreateGroupAfterStartAnnotationKey = "leaderworkerset.sigs.k8s.io/experimental-recreate-group-after-start"
	// SubGroupExclusiveKeyAnnotationKey is the same per subgroup; it needs subGroupPolicy.
	SubGroupExclusiveKeyAnnotationKey = "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology"
	// SubGroupIndexLabelKey is the index of a pod's subgroup in its group.
	SubGroupIndexLabelKey = "leaderworkerset.sigs.k8s.io/subgroup-index"
	// SubGroupUniqueHashLabelKey is the same for every pod of one subgroup.
	SubGroupUniqueHashLabelKey = "leaderworkerset.sigs.k8s.io/subgroup-key"
	// SubGroupSizeAnnotationKey carries subGroupPolicy.subGroupSize on every pod.
	SubGroupSizeAnnotationKey = "leaderworkerset.sigs.k8s.io/subgroup-size"
	// SubGroupPolicyTypeAnnotationKey carries subGroupPolicy.subGroupPolicyType on every pod.
	SubGroupPolicyTypeAnnotationKey = "leaderworkerset.sigs.k8s.io/subgroup-policy-type"

	// LwsLeaderAddress is the DNS name of the group's leader pod.
	LwsLeaderAddress = "LWS_LEADER_ADDRESS"
	// LwsGroupSize is the number of pods in the group.
	LwsGroupSize = "LWS_GROUP_SIZE"
	// LwsWorkerIndex is the index of the pod in its group.
	LwsWorkerIndex = "LWS_WORKER_INDEX"
)

// LeaderWorkerSetSpec is the desired state of a LeaderWorkerSet: replicas groups, each one leader
// pod and size-1 worker pods. Group i's leader is <name>-i; its workers are <name>-i-1 ... <name>-i-(size-1).
type LeaderWorkerSetSpec struct {
	// replicas is the number of leader-worker groups.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	Replicas *int32 `json:"replicas,omitempty"`

	// leaderWorkerTemplate defines the template for leader and worker pods.
	LeaderWorkerTemplate LeaderWorkerTemplate `json:"leaderWorkerTemplate"`

	// rolloutStrategy is applied when the leaderWorkerTemplate changes.
	// +optional
	RolloutStrategy RolloutStrategy `json:"rolloutStrategy,omitempty"`

	// startupPolicy decides when a group's worker StatefulSet is created.
	// +kubebuilder:default=LeaderCreated
	// +kubebuilder:validation:Enum={LeaderCreated,LeaderReady}
	// +optional
	StartupPolicy StartupPolicyType `json:"startupPolicy,omitempty"`

	// networkConfig defines the network configuration of the groups.
	// +optional
	NetworkConfig *NetworkConfig `json:"networkConfig,omitempty"`
}

// LeaderWorkerTemplate is the template of one group.
type LeaderWorkerTemplate struct {
	// leaderTemplate is the pod template of leader pods; the workerTemplate when unset.
	// +optional
	LeaderTemplate *corev1.PodTemplateSpec `json:"leaderTemplate,omitempty"`

	// workerTemplate is the pod template of worker pods.
	WorkerTemplate corev1.PodTemplateSpec `json:"workerTemplate"`

	// size is the number of pods in a group, leader included.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	Size *int32 `json:"size,omitempty"`

	// restartPolicy decides what happens to a group when one of its pods fails or restarts.
	// +kubebuilder:default=RecreateGroupOnPodRestart
	// +kubebuilder:validation:Enum={Default,RecreateGroupOnPodRestart,RecreateGroupAfterStart,None}
	// +optional
	RestartPolicy RestartPolicyType `json:"restartPolicy,omitempty"`

	// subGroupPolicy splits each group into subgroups of subGroupSize pods (labels subgroup-index
	// and subgroup-key). It cannot be added, removed or resized once the LeaderWorkerSet exists.
	// +optional
	SubGroupPolicy *SubGroupPolicy `json:"subGroupPolicy,omitempty"`

	// volumeClaimTemplates are claims every pod gets its own copy of, named <claim>-<pod>.
	// They go on the leader and on every worker StatefulSet and cannot change once set.
	// +optional
	VolumeClaimTemplates []corev1.PersistentVolumeClaim `json:"volumeClaimTemplates,omitempty"`

	// persistentVolumeClaimRetentionPolicy says what happens to the claims when a StatefulSet is
	// deleted (whole LeaderWorkerSet, or a group restart) or scaled down. Defaults to Retain/Retain.
	// +optional
	PersistentVolumeClaimRetentionPolicy *appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy `json:"persistentVolumeClaimRetentionPolicy,omitempty"`

	// schedulingPolicy pins every pod of a group to the nodes set aside for that group.
	// +optional
	SchedulingPolicy *SchedulingPolicy `json:"schedulingPolicy,omitempty"`
}

// SubGroupPolicy describes the subgroups of each group.
type SubGroupPolicy struct {
	// subGroupPolicyType says whether the leader belongs to the first subgroup (LeaderWorker) or
	// to none (LeaderExcluded, which needs size-1 divisible by subGroupSize).
	// +kubebuilder:validation:Enum={LeaderWorker,LeaderExcluded}
	// +kubebuilder:default=LeaderWorker
	// +optional
	Type *SubGroupPolicyType `json:"subGroupPolicyType,omitempty"`

	// subGroupSize is the number of pods per subgroup; size or size-1 must be divisible by it (in
	// the second case the leader is the extra pod of the first subgroup).
	// +kubebuilder:validation:Minimum=1
	SubGroupSize *int32 `json:"subGroupSize,omitempty"`
}

// SubGroupPolicyType is the subgroup layout.
type SubGroupPolicyType string

const (
	// SubGroupPolicyTypeLeaderWorker puts the leader in subgroup 0.
	SubGroupPolicyTypeLeaderWorker SubGroupPolicyType = "LeaderWorker"
	// SubGroupPolicyTypeLeaderExcluded leaves the leader out of every subgroup.
	SubGroupPolicyTypeLeaderExcluded SubGroupPolicyType = "LeaderExcluded"
)

// SchedulingPolicy (LWS KEP-223) sends the pods of each group to nodes labelled and tainted with the
// name of the group's leader pod.
type SchedulingPolicy struct {
	// replicaUniqueNodeSelector is a node label key; each pod of group g gets the node selector
	// <key>=<leader pod name of g>.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	ReplicaUniqueNodeSelector string `json:"replicaUniqueNodeSelector,omitempty"`

	// replicaUniqueToleration adds to each pod of group g the toleration
	// {key, Equal, <leader pod name of g>, effect}.
	// +optional
	ReplicaUniqueToleration *ReplicaUniqueToleration `json:"replicaUniqueToleration,omitempty"`
}

// ReplicaUniqueToleration is a toleration whose value is the group's leader pod name.
type ReplicaUniqueToleration struct {
	// key is the taint key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	Key string `json:"key"`
	// effect is the taint effect.
	// +kubebuilder:validation:Enum={NoSchedule,PreferNoSchedule,NoExecute}
	Effect corev1.TaintEffect `json:"effect"`
}

// RolloutStrategy is how groups are replaced when the template changes.
type RolloutStrategy struct {
	// type is the rollout strategy; only RollingUpdate.
	// +kubebuilder:validation:Enum={RollingUpdate}
	// +kubebuilder:default=RollingUpdate
	Type RolloutStrategyType `json:"type,omitempty"`

	// rollingUpdateConfiguration holds the RollingUpdate parameters.
	// +optional
	RollingUpdateConfiguration *RollingUpdateConfiguration `json:"rollingUpdateConfiguration,omitempty"`
}

// RollingUpdateConfiguration bounds how many groups may be down or extra during an update.
type RollingUpdateConfiguration struct {
	// partition: groups with an index below it keep their revision during an update (a staged or
	// canary rollout); lowering it continues the update. Surge groups stay until it is back at 0
	// and the update is done. Default 0.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	Partition *int32 `json:"partition,omitempty"`

	// maxUnavailable is how many groups may be unavailable during the update (number or percent,
	// rounded down). Not 0 when maxSurge is 0.
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:default=1
	MaxUnavailable intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// maxSurge is how many groups may exist above replicas during the update (number or percent,
	// rounded up; at most replicas). The surge groups are added to the leader StatefulSet at the
	// new revision and removed as the last groups become ready.
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:default=0
	MaxSurge intstr.IntOrString `json:"maxSurge,omitempty"`
}

// NetworkConfig is the network configuration of the groups.
type NetworkConfig struct {
	// subdomainPolicy decides whether all groups share one headless Service or get one each.
	// +kubebuilder:validation:Enum={Shared,UniquePerReplica}
	// +optional
	SubdomainPolicy *SubdomainPolicy `json:"subdomainPolicy,omitempty"`
}

// SubdomainPolicy is the headless Service layout.
type SubdomainPolicy string

const (
	// SubdomainShared is one headless Service named after the LeaderWorkerSet.
	SubdomainShared SubdomainPolicy = "Shared"
	// SubdomainUniquePerReplica is one headless Service per group, named after its leader pod.
	SubdomainUniquePerReplica SubdomainPolicy = "UniquePerReplica"
)

// RolloutStrategyType is the kind of rollout.
type RolloutStrategyType string

// RollingUpdateStrategyType replaces groups a few at a time.
const RollingUpdateStrategyType RolloutStrategyType = "RollingUpdate"

// RestartPolicyType is what a pod failure does to its group.
type RestartPolicyType string

const (
	// RecreateGroupOnPodRestart recreates the whole group when any of its pods is deleted or any
	// container restarts.
	RecreateGroupOnPodRestart RestartPolicyType = "RecreateGroupOnPodRestart"
	// RecreateGroupAfterStart is RecreateGroupOnPodRestart once the group has started: all its pods
	// exist and none is Pending (as upstream's experimental-recreate-group-after-start annotation).
	RecreateGroupAfterStart RestartPolicyType = "RecreateGroupAfterStart"
	// DeprecatedDefaultRestartPolicy is the old name of NoneRestartPolicy.
	DeprecatedDefaultRestartPolicy RestartPolicyType = "Default"
	// NoneRestartPolicy restarts only the failed pod, as a StatefulSet does.
	NoneRestartPolicy RestartPolicyType = "None"
)

// StartupPolicyType decides when workers start.
type StartupPolicyType string

const (
	// LeaderReadyStartupPolicy creates the workers once the leader pod is Ready.
	LeaderReadyStartupPolicy StartupPolicyType = "LeaderReady"
	// LeaderCreatedStartupPolicy creates the workers as soon as the leader pod exists.
	LeaderCreatedStartupPolicy StartupPolicyType = "LeaderCreated"
)

// Condition types of a LeaderWorkerSet.
const (
	// LeaderWorkerSetAvailable: every group is ready.
	LeaderWorkerSetAvailable = "Available"
	// LeaderWorkerSetProgressing: groups are being created or are not ready yet.
	LeaderWorkerSetProgressing = "Progressing"
	// LeaderWorkerSetUpdateInProgress: groups are being replaced after a template change.
	LeaderWorkerSetUpdateInProgress = "UpdateInProgress"
)

// LeaderWorkerSetStatus is the observed state of a LeaderWorkerSet.
type LeaderWorkerSetStatus struct {
	// conditions: Available, Progressing, UpdateInProgress.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// readyReplicas is the number of groups whose every pod is ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// updatedReplicas is the number of groups built from the current template.
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`

	// replicas is the number of groups that exist.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// hpaPodSelector selects the leader pods, for the scale subresource.
	// +optional
	HPAPodSelector string `json:"hpaPodSelector,omitempty"`

	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// LeaderWorkerSet runs replicas groups of one leader and size-1 workers.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.hpaPodSelector
// +kubebuilder:resource:shortName={lws}
// +kubebuilder:printcolumn:name="Ready",type="integer",JSONPath=".status.readyReplicas"
// +kubebuilder:printcolumn:name="Desired",type="integer",JSONPath=".spec.replicas"
// +kubebuilder:printcolumn:name="Up-to-date",type="integer",JSONPath=".status.updatedReplicas"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type LeaderWorkerSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the groups wanted: how many, their size, pod templates, claims, restart and rollout policies.
	Spec LeaderWorkerSetSpec `json:"spec,omitempty"`
	// status is the groups as the controller last observed them, and the conditions Available, Progressing and UpdateInProgress.
	Status LeaderWorkerSetStatus `json:"status,omitempty"`
}

// LeaderWorkerSetList is a list of LeaderWorkerSets.
//
// +kubebuilder:object:root=true
type LeaderWorkerSetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the LeaderWorkerSets.
	Items []LeaderWorkerSet `json:"items"`
}
