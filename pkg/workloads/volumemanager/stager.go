package volumemanager

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
)

// A stager pod makes kubelet stage a volume's dataset on one node before any user pod needs it:
// it mounts the VolumeManager's claim read-only and exits. Kubelet's ordinary CSI path does the
// rest (NodeStageVolume with the Secret the PersistentVolume references, read by kubelet under
// its node authorization), so the node plugin never needs to read Secrets itself.
const (
	// LabelStager marks stager pods (value "true").
	LabelStager = "data.cistern.dev/stager"
	// AnnotationStagerNode is the driver's node ID a stager pod stages on (an annotation: node
	// IDs may be longer than a label value).
	AnnotationStagerNode = "data.cistern.dev/stager-node"
	// stagerUID is the stager's user: not root, nothing to write.
	stagerUID = 65532
)

// stagerName names the stager pod of one volume on one node; it stays the same across claims,
// so there is at most one per node and volume.
func stagerName(vm *datav1alpha1.VolumeManager, id, node string) string {
	sum := sha256.Sum256([]byte(vm.Namespace + "/" + vm.Name + "/" + id + "/" + node))
	return fmt.Sprintf("%s-%s-stage-%s", vm.Name, id, hex.EncodeToString(sum[:])[:8])
}

// StagerPod is the pod that stages vc's claim on node (a Node object; nodeID its driver node
// ID). It is owned by the VolumeManager, pinned to the node by its hostname label, tolerates
// what the volume tolerates, holds no ServiceAccount token, runs non-root on a read-only root
// filesystem with every capability dropped, and its container only prints image's version:
// by the time a container starts, kubelet has mounted its volumes.
func StagerPod(vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig, claim string, node *corev1.Node, nodeID, image string) *corev1.Pod {
	hostname := node.Labels[corev1.LabelHostname]
	if hostname == "" {
		hostname = node.Name
	}
	l := labels(vm, vc)
	l[LabelStager] = "true"
	small := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: stagerName(vm, vc.ID, nodeID), Namespace: vm.Namespace, Labels: l,
			Annotations: map[string]string{AnnotationStagerNode: nodeID},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{
						Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{hostname}}},
				}}},
			}},
			Tolerations: vc.Tolerations,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(int64(stagerUID)), RunAsGroup: ptr.To(int64(stagerUID)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:      "stage",
				Image:     image,
				Args:      []string{"--version"},
				Resources: corev1.ResourceRequirements{Requests: small, Limits: small},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts:             []corev1.VolumeMount{{Name: "data", MountPath: "/data", ReadOnly: true}},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true}}}},
		},
	}
}
