package e2enode

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework/realnode"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apimetav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/testpeers"
)

const (
	datasetBucket = "datasets"
	datasetPrefix = "model"
	datasetSecret = "dataset-reader"
)

// dataset is an S3 dataset on the local S3 server and the sha256 of each of its files.
type dataset struct {
	s3     *testpeers.S3
	source string
	files  map[string]string
}

// startDataset starts the S3 server (versitygw, `make s3-tools`) and uploads a small dataset
// with nested keys, plus a Secret holding the credentials in the test namespace.
func startDataset(t *testing.T, c *cluster) *dataset {
	t.Helper()
	s3 := testpeers.StartS3(t, "")
	s3.Bucket(t, datasetBucket)
	d := &dataset{s3: s3, source: "s3://" + datasetBucket + "/" + datasetPrefix, files: uploadDataset(t, s3)}
	secret := &corev1.Secret{
		ObjectMeta: apimetav1.ObjectMeta{Name: datasetSecret},
		StringData: map[string]string{"accessKeyID": s3.AccessKey, "secretAccessKey": s3.SecretKey},
	}
	if _, err := c.cp.Client.CoreV1().Secrets(c.ns).Create(context.Background(), secret, apimetav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return d
}

// uploadDataset uploads a small dataset with nested keys to the bucket datasetBucket and returns
// the sha256 of each file.
func uploadDataset(t *testing.T, s3 *testpeers.S3) map[string]string {
	t.Helper()
	files := map[string]string{}
	for key, size := range map[string]int{
		"config.json":                 512,
		"weights/part-000.bin":        3 << 20,
		"weights/part-001.bin":        1<<20 + 17,
		"tokenizer/vocab/merges.txt":  64 << 10,
		"tokenizer/vocab/special.txt": 0,
	} {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		s3.Put(t, datasetBucket, datasetPrefix+"/"+key, data)
		sum := sha256.Sum256(data)
		files[key] = hex.EncodeToString(sum[:])
	}
	return files
}

// attributes are the dataset's volume parameters, as in a StorageClass or inline volume.
func (d *dataset) attributes() map[string]string {
	return map[string]string{
		"pool":      realnode.PoolName,
		"source":    d.source,
		"endpoint":  d.s3.Endpoint,
		"pathStyle": "true",
	}
}

// storageClass creates a StorageClass for the dataset, with credentials for staging at
// CreateVolume and at NodeStageVolume.
func (d *dataset) storageClass(t *testing.T, c *cluster) string {
	t.Helper()
	params := d.attributes()
	maps.Copy(params, map[string]string{
		"csi.storage.k8s.io/provisioner-secret-name":      datasetSecret,
		"csi.storage.k8s.io/provisioner-secret-namespace": c.ns,
		"csi.storage.k8s.io/node-stage-secret-name":       datasetSecret,
		"csi.storage.k8s.io/node-stage-secret-namespace":  c.ns,
	})
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{
		ObjectMeta:        apimetav1.ObjectMeta{Name: "cistern-dataset"},
		Provisioner:       consts.DriverName,
		Parameters:        params,
		VolumeBindingMode: &wffc,
	}
	if _, err := c.cp.Client.StorageV1().StorageClasses().Create(context.Background(), sc, apimetav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cp.Client.StorageV1().StorageClasses().Delete(context.Background(), sc.Name, apimetav1.DeleteOptions{})
	})
	return sc.Name
}

// checkFiles compares what a pod saw with the dataset, byte for byte (by sha256).
func (d *dataset) checkFiles(t *testing.T, pod string, dr DirResult) {
	t.Helper()
	if dr.HashError != "" {
		t.Errorf("%s: reading the dataset: %s", pod, dr.HashError)
	}
	if !maps.Equal(dr.Files, d.files) {
		t.Errorf("%s sees a dataset that differs from the source:\n got  %v\n want %v", pod, dr.Files, d.files)
	}
}

func testDatasets(t *testing.T, c *cluster, d *dataset) {
	sc := d.storageClass(t, c)
	ctx := context.Background()

	// Two claims of the same dataset, one after the other: the second is served from the node's
	// cache, which the driver's cache-hit counter shows.
	for i, name := range []string{"dataset-1", "dataset-2"} {
		hitsBefore := c.node.Metric(t, "cistern_dataset_cache_hits_total")
		if _, err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Create(ctx, pvc(name, sc, "64Mi"), apimetav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := checkerPod(c.checkerImage, c.resultsDir, name,
			[]corev1.Volume{pvcVolume("data", name)},
			[]corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			"-dir", "/data", "-hash", "-write-read")
		createPod(t, c.cp, c.ns, pod)
		waitPodRunning(t, c.cp, c.ns, name)
		dr := readResult(t, c.resultsDir, name).Dirs[0]
		d.checkFiles(t, name, dr)
		if dr.WriteRead == nil || !dr.WriteRead.OK {
			t.Errorf("%s: the dataset volume is not writable: %+v", name, dr.WriteRead)
		}
		hits := c.node.Metric(t, "cistern_dataset_cache_hits_total")
		if i == 1 && hits <= hitsBefore {
			t.Errorf("the second volume of the dataset did not come from the node cache (cache hits %v -> %v)", hitsBefore, hits)
		}
	}

	// Both claims are layered on the cache (docs/datasets.md, "Writable volumes"): an overlay
	// on each staging path, nothing copied.
	if n := mountsOfType(t, "overlay", filepath.Join(c.kubelet.RootDir, "plugins", "kubernetes.io", "csi")); n != 2 {
		t.Errorf("%d staging paths are overlays, want 2 (both writable dataset claims layered on the cache)", n)
	}

	// An inline ephemeral volume of the same dataset, read-only: the cached tree itself.
	attrs := d.attributes()
	attrs["size"] = "64Mi"
	pod := checkerPod(c.checkerImage, c.resultsDir, "dataset-inline",
		[]corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver:               consts.DriverName,
			ReadOnly:             ptr.To(true),
			VolumeAttributes:     attrs,
			NodePublishSecretRef: &corev1.LocalObjectReference{Name: datasetSecret},
		}}}},
		[]corev1.VolumeMount{{Name: "model", MountPath: "/model", ReadOnly: true}},
		"-dir", "/model", "-hash", "-write-read")
	createPod(t, c.cp, c.ns, pod)
	waitPodRunning(t, c.cp, c.ns, "dataset-inline")
	dr := readResult(t, c.resultsDir, "dataset-inline").Dirs[0]
	d.checkFiles(t, "dataset-inline", dr)
	if dr.WriteRead == nil || dr.WriteRead.OK {
		t.Errorf("a read-only inline dataset volume accepted a write: %+v", dr.WriteRead)
	}

	// Another tenant's pod names the same private dataset inline, without a secret: kubelet reports
	// the driver's PermissionDenied on the pod, and the pod never runs with the data.
	intruder := checkerPod(c.checkerImage, c.resultsDir, "dataset-no-secret",
		[]corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: consts.DriverName, ReadOnly: ptr.To(true), VolumeAttributes: attrs,
		}}}},
		[]corev1.VolumeMount{{Name: "model", MountPath: "/model", ReadOnly: true}},
		"-dir", "/model", "-hash")
	createPod(t, c.cp, c.ns, intruder)
	waitFailedMount(t, c, "dataset-no-secret", "PermissionDenied")

	for _, name := range []string{"dataset-1", "dataset-2", "dataset-inline", "dataset-no-secret"} {
		deletePodAndWait(t, c.cp, c.ns, name)
	}
	for _, name := range []string{"dataset-1", "dataset-2"} {
		if err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Delete(ctx, name, apimetav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// mountsOfType counts the mounts of filesystem type fstype below dir.
func mountsOfType(t *testing.T, fstype, dir string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range mountsUnder(data, dir) {
		if m.fstype == fstype {
			n++
		}
	}
	return n
}

// mountEntry is one line of a mountinfo table: a mount point and its filesystem type.
type mountEntry struct{ point, fstype string }

// mountsUnder reads a mountinfo table: each mount below dir, in the table's order (a mount
// stacked on another at the same point comes after it).
func mountsUnder(mountinfo []byte, dir string) []mountEntry {
	var mounts []mountEntry
	for _, line := range strings.Split(string(mountinfo), "\n") {
		// ID parent major:minor root mountpoint options [optional...] - fstype source super
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep > 4 && sep+1 < len(f) && strings.HasPrefix(f[4], dir+"/") {
			mounts = append(mounts, mountEntry{point: f[4], fstype: f[sep+1]})
		}
	}
	return mounts
}

// waitFailedMount waits for kubelet's FailedMount event on the pod carrying want (the driver's
// gRPC code), and checks the pod is still Pending: it never ran with the data.
func waitFailedMount(t *testing.T, c *cluster, pod, want string) {
	t.Helper()
	ctx := context.Background()
	err := wait.PollUntilContextTimeout(ctx, time.Second, podTimeout, true, func(ctx context.Context) (bool, error) {
		events, err := c.cp.Client.CoreV1().Events(c.ns).List(ctx, apimetav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod, "reason": "FailedMount"}.String()})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if strings.Contains(e.Message, want) {
				t.Logf("event on pod %s: %s", pod, e.Message)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no FailedMount event with %s on pod %s: %v\n%s", want, pod, err, describe(c.cp, c.ns, "Pod", pod, nil))
	}
	if p, err := c.cp.Client.CoreV1().Pods(c.ns).Get(ctx, pod, apimetav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
		t.Fatalf("pod %s: %v %v, want Pending", pod, p.Status.Phase, err)
	}
}
