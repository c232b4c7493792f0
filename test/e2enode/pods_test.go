package e2enode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/test/framework"
)

// Result and Heartbeat mirror hack/images/checker's output.
type Result struct {
	UID    int         `json:"uid"`
	GID    int         `json:"gid"`
	Groups []int       `json:"groups"`
	Dirs   []DirResult `json:"dirs"`
}

type DirResult struct {
	Dir        string            `json:"dir"`
	TotalBytes uint64            `json:"totalBytes"`
	FreeBytes  uint64            `json:"freeBytes"`
	WriteRead  *Outcome          `json:"writeRead"`
	Fill       *FillOutcome      `json:"fill"`
	Files      map[string]string `json:"files"`
	HashError  string            `json:"hashError"`
	Contents   map[string]string `json:"contents"`
	ReadError  string            `json:"readError"`
}

type Outcome struct {
	OK    bool   `json:"ok"`
	Error string `json:"error"`
}

type FillOutcome struct {
	Bytes  int64  `json:"bytes"`
	Error  string `json:"error"`
	ENOSPC bool   `json:"enospc"`
}

type Heartbeat struct {
	Seq   int64     `json:"seq"`
	Time  time.Time `json:"time"`
	OK    bool      `json:"ok"`
	Error string    `json:"error"`
}

const (
	resultsMount = "/results"
	podTimeout   = 3 * time.Minute
)

// checkerPod is a pod running the checker image on the host network, its results going to the
// hostPath resultsDir. args are the checker's flags after -out.
func checkerPod(image, resultsDir, name string, volumes []corev1.Volume, mounts []corev1.VolumeMount, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			RestartPolicy:                 corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name:            "checker",
				Image:           image,
				ImagePullPolicy: corev1.PullNever,
				Args:            append([]string{"-out", resultsMount + "/" + name}, args...),
				VolumeMounts:    append(mounts, corev1.VolumeMount{Name: "results", MountPath: resultsMount}),
			}},
			Volumes: append(volumes, corev1.Volume{
				Name: "results",
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
					Path: resultsDir, Type: ptr.To(corev1.HostPathDirectoryOrCreate),
				}},
			}),
		},
	}
}

func createPod(t *testing.T, cp *framework.ControlPlane, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	created, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
	return created
}

// waitPodRunning waits for the pod to run; on timeout the error carries the pod's conditions and
// events, which say what kubelet, the scheduler or the provisioner were waiting for.
func waitPodRunning(t *testing.T, cp *framework.ControlPlane, ns, name string) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	var pod *corev1.Pod
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		switch p.Status.Phase {
		case corev1.PodRunning:
			return true, nil
		case corev1.PodFailed, corev1.PodSucceeded:
			return false, fmt.Errorf("pod ended: %s", p.Status.Phase)
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s not running: %v\n%s", ns, name, err, describe(cp, ns, "Pod", name, pod))
	}
	return pod
}

// describe summarizes an object's status and events for a failure message.
func describe(cp *framework.ControlPlane, ns, kind, name string, pod *corev1.Pod) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	if pod != nil {
		fmt.Fprintf(&b, "phase %s, node %q\n", pod.Status.Phase, pod.Spec.NodeName)
		for _, c := range pod.Status.Conditions {
			fmt.Fprintf(&b, "  condition %s=%s %s %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.State.Waiting != nil {
				fmt.Fprintf(&b, "  container %s waiting: %s %s\n", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
			}
			if cs.State.Terminated != nil {
				fmt.Fprintf(&b, "  container %s terminated: %s %s (exit %d)\n", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.Message, cs.State.Terminated.ExitCode)
			}
		}
	}
	events, err := cp.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": kind, "involvedObject.name": name}.String(),
	})
	if err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(&b, "  event %s %s: %s\n", e.Type, e.Reason, e.Message)
		}
	}
	return b.String()
}

// deletePodAndWait deletes the pod and waits until it is gone: kubelet has then unpublished
// (and, for its last user, unstaged) its volumes.
func deletePodAndWait(t *testing.T, cp *framework.ControlPlane, ns, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting pod %s: %v", name, err)
	}
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s not gone: %v\n%s", ns, name, err, describe(cp, ns, "Pod", name, nil))
	}
}

// readJSON waits for a results file the checker writes and decodes it.
func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		data, err := os.ReadFile(path)
		if err == nil {
			if err := json.Unmarshal(data, v); err != nil {
				t.Fatalf("decoding %s: %v", path, err)
			}
			return
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			t.Fatalf("reading %s: %v", path, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func readResult(t *testing.T, resultsDir, name string) Result {
	t.Helper()
	var r Result
	readJSON(t, filepath.Join(resultsDir, name+".json"), &r)
	return r
}

func pvc(name, storageClass, size string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &storageClass,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			},
		},
	}
}

func pvcVolume(name, claim string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}}
}
