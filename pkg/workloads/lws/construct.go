package lws

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// SpecHashAnnotationKey records the hash of what the controller last wrote to a StatefulSet, so
// an unchanged LeaderWorkerSet costs no write at all (the API server defaults fields, so comparing
// objects field by field would always see a difference).
const SpecHashAnnotationKey = "workloads.cistern.dev/spec-hash"

// TemplateHash is the template-revision-hash: it changes whenever something that shapes the pods
// of a group changes (templates, size, claims, scheduling, network, the exclusive-placement
// annotations), and not on a scale. Empty placement annotations leave the hash as it was before
// they existed, so an upgrade does not roll every LeaderWorkerSet.
func TemplateHash(lws *v1alpha1.LeaderWorkerSet) string {
	return hashOf(struct {
		T  v1alpha1.LeaderWorkerTemplate
		N  *v1alpha1.NetworkConfig
		E  string `json:",omitempty"`
		SE string `json:",omitempty"`
	}{lws.Spec.LeaderWorkerTemplate, lws.Spec.NetworkConfig,
		lws.Annotations[v1alpha1.ExclusiveKeyAnnotationKey], lws.Annotations[v1alpha1.SubGroupExclusiveKeyAnnotationKey]})
}

func hashOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		// Only unmarshalable types fail, and API types never are.
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// GroupKey is the group-key label of every pod of the group led by leaderName.
func GroupKey(namespace, leaderName string) string {
	sum := sha1.Sum([]byte(namespace + "/" + leaderName))
	return hex.EncodeToString(sum[:])
}

// LeaderName is the name of the leader pod (and worker StatefulSet) of group i.
func LeaderName(lwsName string, group int) string {
	return lwsName + "-" + strconv.Itoa(group)
}

// ParentNameAndOrdinal splits a StatefulSet pod name into its StatefulSet name and ordinal; the
// ordinal is -1 when the name has none.
func ParentNameAndOrdinal(podName string) (string, int) {
	i := strings.LastIndexByte(podName, '-')
	if i <= 0 {
		return "", -1
	}
	n, err := strconv.Atoi(podName[i+1:])
	if err != nil || n < 0 || podName[i+1:] != strconv.Itoa(n) {
		return "", -1
	}
	return podName[:i], n
}

// podPolicyAnnotations carries to the pods what the pod webhook needs to finish them: the
// schedulingPolicy (node selector and toleration), the subgroup policy (subgroup labels) and the
// exclusive-placement topology keys (pod affinity and anti-affinity), as upstream does.
func podPolicyAnnotations(lws *v1alpha1.LeaderWorkerSet, into map[string]string) {
	if sp := lws.Spec.LeaderWorkerTemplate.SchedulingPolicy; sp != nil {
		if sp.ReplicaUniqueNodeSelector != "" {
			into[v1alpha1.ReplicaUniqueNodeSelectorAnnotationKey] = sp.ReplicaUniqueNodeSelector
		}
		if t := sp.ReplicaUniqueToleration; t != nil {
			into[v1alpha1.ReplicaUniqueTolerationKeyAnnotationKey] = t.Key
			into[v1alpha1.ReplicaUniqueTolerationEffectAnnotationKey] = string(t.Effect)
		}
	}
	if key := lws.Annotations[v1alpha1.ExclusiveKeyAnnotationKey]; key != "" {
		into[v1alpha1.ExclusiveKeyAnnotationKey] = key
	}
	if sg := lws.Spec.LeaderWorkerTemplate.SubGroupPolicy; sg != nil && sg.SubGroupSize != nil {
		into[v1alpha1.SubGroupSizeAnnotationKey] = strconv.Itoa(int(*sg.SubGroupSize))
		into[v1alpha1.SubGroupPolicyTypeAnnotationKey] = string(ptr.Deref(sg.Type, v1alpha1.SubGroupPolicyTypeLeaderWorker))
		if key := lws.Annotations[v1alpha1.SubGroupExclusiveKeyAnnotationKey]; key != "" {
			into[v1alpha1.SubGroupExclusiveKeyAnnotationKey] = key
		}
	}
}

func subdomainPolicy(lws *v1alpha1.LeaderWorkerSet) v1alpha1.SubdomainPolicy {
	if nc := lws.Spec.NetworkConfig; nc != nil && nc.SubdomainPolicy != nil {
		return *nc.SubdomainPolicy
	}
	return v1alpha1.SubdomainShared
}

// merged returns base overlaid with over; over wins.
func merged(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	maps.Copy(out, base)
	maps.Copy(out, over)
	return out
}

func claimTemplates(lws *v1alpha1.LeaderWorkerSet) []corev1.PersistentVolumeClaim {
	var out []corev1.PersistentVolumeClaim
	for _, t := range lws.Spec.LeaderWorkerTemplate.VolumeClaimTemplates {
		c := *t.DeepCopy()
		// Only name, labels and annotations of a template's metadata mean anything to a StatefulSet.
		c.ObjectMeta = metav1.ObjectMeta{Name: t.Name, Labels: t.Labels, Annotations: t.Annotations}
		c.Status = corev1.PersistentVolumeClaimStatus{}
		out = append(out, c)
	}
	return out
}

// rollingMaxUnavailable is the leader StatefulSet's own maxUnavailable. The partition is what keeps
// the update within the LeaderWorkerSet's budget (rollingUpdate); this only lets the StatefulSet
// replace every group above the partition at once, which is at most maxUnavailable+maxSurge.
func rollingMaxUnavailable(lws *v1alpha1.LeaderWorkerSet) (int32, error) {
	b, err := budgetOf(lws)
	if err != nil {
		return 0, err
	}
	return max(b.maxUnavailable+b.maxSurge, 1), nil
}

// LeaderStatefulSet builds the StatefulSet <lws> whose pods are the leaders of every group, with
// the pod template of revision, and the replicas and partition the rolling update asks for.
func LeaderStatefulSet(lws *v1alpha1.LeaderWorkerSet, revision string, replicas, partition int32) (*appsv1.StatefulSet, error) {
	tpl := &lws.Spec.LeaderWorkerTemplate
	var pod corev1.PodTemplateSpec
	if tpl.LeaderTemplate != nil {
		pod = *tpl.LeaderTemplate.DeepCopy()
	} else {
		pod = *tpl.WorkerTemplate.DeepCopy()
	}
	pod.Labels = merged(pod.Labels, map[string]string{
		v1alpha1.SetNameLabelKey:     lws.Name,
		v1alpha1.WorkerIndexLabelKey: "0",
		v1alpha1.RevisionKey:         revision,
	})
	ann := map[string]string{v1alpha1.SizeAnnotationKey: strconv.Itoa(int(ptr.Deref(tpl.Size, 1)))}
	if subdomainPolicy(lws) == v1alpha1.SubdomainUniquePerReplica {
		ann[v1alpha1.SubdomainPolicyAnnotationKey] = string(v1alpha1.SubdomainUniquePerReplica)
	}
	podPolicyAnnotations(lws, ann)
	pod.Annotations = merged(pod.Annotations, ann)

	maxUnavailable, err := rollingMaxUnavailable(lws)
	if err != nil {
		return nil, err
	}
	sts := &appsv1.StatefulSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      lws.Name,
			Namespace: lws.Namespace,
			Labels: merged(lws.Labels, map[string]string{
				v1alpha1.SetNameLabelKey: lws.Name,
				v1alpha1.RevisionKey:     revision,
			}),
			Annotations: merged(lws.Annotations, map[string]string{
				v1alpha1.ReplicasAnnotationKey: strconv.Itoa(int(ptr.Deref(lws.Spec.Replicas, 1))),
			}),
		},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(replicas),
			ServiceName:         lws.Name,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{
				v1alpha1.SetNameLabelKey:     lws.Name,
				v1alpha1.WorkerIndexLabelKey: "0",
			}},
			Template: pod,
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{
				Type: appsv1.RollingUpdateStatefulSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateStatefulSetStrategy{
					Partition:      ptr.To(partition),
					MaxUnavailable: ptr.To(intstr.FromInt32(maxUnavailable)),
				},
			},
			VolumeClaimTemplates:                 claimTemplates(lws),
			PersistentVolumeClaimRetentionPolicy: tpl.PersistentVolumeClaimRetentionPolicy.DeepCopy(),
		},
	}
	delete(sts.Annotations, corev1.LastAppliedConfigAnnotation)
	stampSpecHash(sts)
	return sts, nil
}

// WorkerStatefulSet builds the StatefulSet of group workers, named after the leader pod, with
// size-1 replicas numbered from 1 and owned by the leader pod so a group restart (deleting the
// leader) takes the workers with it. leaderTopology, under exclusive placement, is the leader's
// node's value of the topology key: the workers are pinned there by node selector, as upstream
// does, on top of any node selector of the template and of the schedulingPolicy.
func WorkerStatefulSet(lws *v1alpha1.LeaderWorkerSet, leader *corev1.Pod, leaderTopology map[string]string) *appsv1.StatefulSet {
	tpl := &lws.Spec.LeaderWorkerTemplate
	groupLabels := map[string]string{
		v1alpha1.SetNameLabelKey:         lws.Name,
		v1alpha1.GroupIndexLabelKey:      leader.Labels[v1alpha1.GroupIndexLabelKey],
		v1alpha1.GroupUniqueHashLabelKey: leader.Labels[v1alpha1.GroupUniqueHashLabelKey],
	}
	labels := merged(groupLabels, map[string]string{v1alpha1.RevisionKey: leader.Labels[v1alpha1.RevisionKey]})

	pod := *tpl.WorkerTemplate.DeepCopy()
	pod.Labels = merged(pod.Labels, labels)
	ann := map[string]string{
		v1alpha1.SizeAnnotationKey:          strconv.Itoa(int(ptr.Deref(tpl.Size, 1))),
		v1alpha1.LeaderPodNameAnnotationKey: leader.Name,
	}
	podPolicyAnnotations(lws, ann)
	pod.Annotations = merged(pod.Annotations, ann)
	if len(leaderTopology) > 0 {
		pod.Spec.NodeSelector = merged(pod.Spec.NodeSelector, leaderTopology)
	}

	serviceName := lws.Name
	if subdomainPolicy(lws) == v1alpha1.SubdomainUniquePerReplica {
		serviceName = leader.Name
	}
	sts := &appsv1.StatefulSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        leader.Name,
			Namespace:   leader.Namespace,
			Labels:      merged(lws.Labels, labels),
			Annotations: maps.Clone(lws.Annotations),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         "v1",
				Kind:               "Pod",
				Name:               leader.Name,
				UID:                leader.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: appsv1.StatefulSetSpec{
			Replicas:                             ptr.To(ptr.Deref(tpl.Size, 1) - 1),
			ServiceName:                          serviceName,
			PodManagementPolicy:                  appsv1.ParallelPodManagement,
			Ordinals:                             &appsv1.StatefulSetOrdinals{Start: 1},
			Selector:                             &metav1.LabelSelector{MatchLabels: groupLabels},
			Template:                             pod,
			VolumeClaimTemplates:                 claimTemplates(lws),
			PersistentVolumeClaimRetentionPolicy: tpl.PersistentVolumeClaimRetentionPolicy.DeepCopy(),
		},
	}
	if sts.Annotations != nil {
		delete(sts.Annotations, corev1.LastAppliedConfigAnnotation)
	}
	stampSpecHash(sts)
	return sts
}

func stampSpecHash(sts *appsv1.StatefulSet) {
	h := hashOf(struct {
		L, A map[string]string
		S    appsv1.StatefulSetSpec
	}{sts.Labels, sts.Annotations, sts.Spec})
	if sts.Annotations == nil {
		sts.Annotations = map[string]string{}
	}
	sts.Annotations[SpecHashAnnotationKey] = h
}

// HeadlessService builds the headless Service that gives pods their DNS names: <lws> shared by
// all groups, or one per group named after its leader (UniquePerReplica).
func HeadlessService(lws *v1alpha1.LeaderWorkerSet, name string, selector map[string]string) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: lws.Namespace,
			Labels:    map[string]string{v1alpha1.SetNameLabelKey: lws.Name},
		},
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 selector,
			PublishNotReadyAddresses: true,
		},
	}
}
