package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/test/framework"
)

// eventually is framework.Eventually.
var eventually = framework.Eventually

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// csiConn connects to a node's driver socket, as kubelet and the sidecars do.
func csiConn(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func getCapacity(ctx context.Context, conn *grpc.ClientConn, params map[string]string, topoKey, node string) (*csi.GetCapacityResponse, error) {
	return csi.NewControllerClient(conn).GetCapacity(ctx, &csi.GetCapacityRequest{
		Parameters:         params,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{topoKey: node}},
	})
}

func newClaim(name, class, size string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(class),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			},
		},
	}
}

// newPod is a pod using claim; nodeSelector may be nil (the scheduler chooses).
func newPod(name, claim string, nodeSelector map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeSelector: nodeSelector,
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.invalid/e2e:never-pulled",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}
}

// boundPV waits for the claim to be Bound and returns its PersistentVolume.
func boundPV(t testing.TB, c kubernetes.Interface, ns, claim string) *corev1.PersistentVolume {
	t.Helper()
	var pv *corev1.PersistentVolume
	eventually(t, 2*time.Minute, "claim "+claim+" bound", func(ctx context.Context) error {
		pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return errorf("phase %s", pvc.Status.Phase)
		}
		pv, err = c.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		return err
	})
	return pv
}

// scheduledNode waits for the pod to be bound to a node and returns it.
func scheduledNode(t testing.TB, c kubernetes.Interface, ns, pod string) string {
	t.Helper()
	var node string
	eventually(t, 2*time.Minute, "pod "+pod+" scheduled", func(ctx context.Context) error {
		p, err := c.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName == "" {
			return errorf("not scheduled yet")
		}
		node = p.Spec.NodeName
		return nil
	})
	return node
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
