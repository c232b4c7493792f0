package resizer

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The claim conditions a resize sets; any other condition is kept as it is.
var resizeConditions = map[corev1.PersistentVolumeClaimConditionType]bool{
	corev1.PersistentVolumeClaimResizing:                true,
	corev1.PersistentVolumeClaimFileSystemResizePending: true,
	corev1.PersistentVolumeClaimControllerResizeError:   true,
	corev1.PersistentVolumeClaimNodeResizeError:         true,
}

func hasCondition(pvc *corev1.PersistentVolumeClaim, t corev1.PersistentVolumeClaimConditionType) bool {
	for _, c := range pvc.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// setResizeCondition replaces the resize conditions with want (none when empty), keeping the
// transition time of a condition that stays.
func setResizeCondition(s *corev1.PersistentVolumeClaimStatus, want ...corev1.PersistentVolumeClaimCondition) {
	old := map[corev1.PersistentVolumeClaimConditionType]corev1.PersistentVolumeClaimCondition{}
	var kept []corev1.PersistentVolumeClaimCondition
	for _, c := range s.Conditions {
		if resizeConditions[c.Type] {
			old[c.Type] = c
		} else {
			kept = append(kept, c)
		}
	}
	for _, c := range want {
		if o, ok := old[c.Type]; ok && o.Status == c.Status && o.Message == c.Message {
			c.LastTransitionTime = o.LastTransitionTime
		} else {
			c.LastTransitionTime = metav1.Now()
		}
		kept = append(kept, c)
	}
	s.Conditions = kept
}

func setStorage(m *corev1.ResourceList, q resource.Quantity) {
	if *m == nil {
		*m = corev1.ResourceList{}
	}
	(*m)[corev1.ResourceStorage] = q
}

func setStorageStatus(s *corev1.PersistentVolumeClaimStatus, st corev1.ClaimResourceStatus) {
	if s.AllocatedResourceStatuses == nil {
		s.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{}
	}
	s.AllocatedResourceStatuses[corev1.ResourceStorage] = st
}

// statusEqual compares two statuses ignoring the condition times setResizeCondition stamps.
func statusEqual(a, b corev1.PersistentVolumeClaimStatus) bool {
	strip := func(s corev1.PersistentVolumeClaimStatus) corev1.PersistentVolumeClaimStatus {
		s = *s.DeepCopy()
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
			s.Conditions[i].LastProbeTime = metav1.Time{}
		}
		return s
	}
	return equality.Semantic.DeepEqual(strip(a), strip(b))
}
