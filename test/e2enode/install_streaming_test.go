package e2enode

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
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

	"github.com/cistern-csi/cistern/pkg/consts"
)

// streamPV is the administrator's static PV of a streaming dataset the install's reader uses.
const streamPV = "cistern-stream-reader"

// streamReader is a pod reading a streaming dataset volume in a loop (checker -read-loop)
// through the install's upgrade and its driver's kill: the FUSE keeper of deploy/csi holds the
// volume's connection across both.
type streamReader struct {
	name  string
	path  string            // its reads.json
	files map[string]string // key -> sha256 in S3
}

// startStreamReader uploads a dataset beside the examples' (in the same S3 server, a pod), makes
// a static PV of it with dataMode streaming, and starts a pod reading it in a loop. The S3
// Service is relayed again until scope ends (the examples' relay ended with them): the plugin
// taking the volume over after the upgrade and the kill lists the source again.
func (in *install) startStreamReader(t, scope *testing.T) *streamReader {
	t.Helper()
	if in.exampleData == nil {
		t.Skip("no S3 server: the examples did not run")
	}
	svc, err := in.cp.Client.CoreV1().Services(in.ns).Get(context.Background(), "s3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	serveService(scope, in.cp, svc)
	// The keeper's own DaemonSet runs its pod, Ready, before the volume is made: the plugin
	// hands the keeper the connection when it mounts.
	err = pollInstall(time.Second, func(ctx context.Context) (bool, error) {
		pods, err := in.cp.Client.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cistern-fuse-keeper"})
		if err != nil || len(pods.Items) != 1 {
			return false, nil
		}
		for _, c := range pods.Items[0].Status.ContainerStatuses {
			if !c.Ready {
				return false, nil
			}
		}
		return pods.Items[0].Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("the FUSE keeper's pod is not running: %v\n%s", err, kubectlOutput(in.cp, "-n", installNamespace, "describe", "pods", "-l", "app.kubernetes.io/name=cistern-fuse-keeper"))
	}
	sr := &streamReader{name: "stream-reader", path: filepath.Join(in.resultsDir, "stream-reader.reads.json"), files: map[string]string{}}
	for key, size := range map[string]int{"weights/shard-0.bin": 12 << 20, "weights/shard-1.bin": 6<<20 + 7, "config.json": 900} {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		in.exampleData.s3.Put(t, exampleS3Bucket, "stream/"+key, data)
		sum := sha256.Sum256(data)
		sr.files[key] = hex.EncodeToString(sum[:])
	}
	ctx := context.Background()
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: streamPV},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      &corev1.ObjectReference{Namespace: in.ns, Name: "stream"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: consts.DriverName, VolumeHandle: "stream-reader", ReadOnly: true,
				VolumeAttributes: map[string]string{"source": "s3://" + exampleS3Bucket + "/stream/", "endpoint": in.s3Endpoint,
					"region": "us-east-1", "pathStyle": "true", "dataMode": "streaming"},
				NodeStageSecretRef: &corev1.SecretReference{Name: exampleS3Secret, Namespace: in.ns},
			}},
		},
	}
	if _, err := in.cp.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	empty := ""
	claim := pvc("stream", empty, "1Gi")
	claim.Spec.StorageClassName = &empty
	claim.Spec.VolumeName = streamPV
	claim.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}
	if _, err := in.cp.Client.CoreV1().PersistentVolumeClaims(in.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := in.checker(sr.name, "stream", "-read-loop")
	pod.Spec.Volumes[0].PersistentVolumeClaim.ReadOnly = true
	pod.Spec.Containers[0].VolumeMounts[0].ReadOnly = true
	createPod(t, in.cp, in.ns, pod)
	waitPodRunning(t, in.cp, in.ns, sr.name)
	if !streamingMounted(t) {
		t.Fatal("the reader's volume is not a streaming (FUSE) mount: it was staged instead")
	}
	sr.wait(t, "a first round", func(r reads) bool { return r.Rounds >= 1 })
	return sr
}

// counts reads the reader's counts.
func (sr *streamReader) counts(t *testing.T) reads {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var r reads
		b, err := os.ReadFile(sr.path)
		if err == nil && json.Unmarshal(b, &r) == nil {
			return r
		}
		if (err != nil && !errors.Is(err, os.ErrNotExist)) || time.Now().After(deadline) {
			t.Fatalf("reading %s: %v", sr.path, err)
		}
	}
}

func (sr *streamReader) wait(t *testing.T, what string, ok func(reads) bool) reads {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		r := sr.counts(t)
		if r.Failed > 0 || r.Differ > 0 {
			t.Fatalf("streaming reader: %d reads failed, %d differed (waiting for %s): %v", r.Failed, r.Differ, what, r.Errors)
		}
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("streaming reader: waiting for %s: %+v", what, r)
		}
	}
}

// after checks the reader read on through what happened since before: two more rounds, none
// failed, every file as in S3.
func (sr *streamReader) after(t *testing.T, what string, before reads) {
	t.Helper()
	r := sr.wait(t, "two rounds after "+what, func(r reads) bool { return r.Rounds >= before.Rounds+2 })
	t.Logf("streaming reader through %s: %d whole files read before, %d after, 0 failed", what, before.Reads, r.Reads)
	for key, sum := range sr.files {
		if got := r.First["/data/"+key]; got != sum {
			t.Errorf("streaming reader: %s read with sha256 %q, S3's %q", key, got, sum)
		}
	}
	if !streamingMounted(t) {
		t.Errorf("the streaming mount is gone after %s", what)
	}
}

// streamingMounted says whether a streaming FUSE mount is under kubelet's directory.
func streamingMounted(t *testing.T) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(data), " - fuse.cistern-stream ")
}

// deleteStreamPV deletes the reader's static PV once its claim is gone (Retain: nobody else does).
func (in *install) deleteStreamPV(ctx context.Context) {
	err := in.cp.Client.CoreV1().PersistentVolumes().Delete(ctx, streamPV, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		fmt.Fprintf(os.Stderr, "deleting PV %s: %v\n", streamPV, err)
	}
}
