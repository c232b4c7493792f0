package e2enode

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework/realnode"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/pkg/workloads/volumemanager"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil"
)

// startStoragePoolSidecar builds and runs the storagepool-sidecar of the node, publishing the
// node's pools and cache inventory as StoragePool objects until the test ends.
func startStoragePoolSidecar(t *testing.T, c *cluster) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "storagepool-sidecar")
	if out, err := testutil.GoBuild(bin, "github.com/cistern-csi/cistern/cmd/storagepool-sidecar").CombinedOutput(); err != nil {
		t.Fatalf("building the storagepool-sidecar: %v\n%s", err, out)
	}
	framework.StartProcess(t, "storagepool-sidecar", bin,
		"--kubeconfig="+c.cp.Kubeconfig,
		"--csi-address="+c.node.Socket,
		"--node-name="+nodeName,
		"--resync-period=1m",
		"--v=3",
	)
}

// testVolumeManager: a VolumeManager with replicas 1 over a fresh S3 dataset reaches Running only
// after its stager pod ran on the node and the node's cache holds the data, byte-identical to
// the source; then the stager is gone, a ReadOnlyMany volume gives pods the cached tree
// read-only and a ReadWriteOnce volume gives each pod a writable copy, the cache untouched.
// The writable volume names an outputTarget: once spec.state Completed releases the volumes and
// the state is Completed, what its pod wrote is at the target, byte-identical, and nothing else
// (the node's StoragePool told the controller when the upload was done). kubelet unstages
// everything.
func testVolumeManager(t *testing.T, c *cluster, d *dataset) {
	c.node.WaitRegistered(t, c.cp)
	startStoragePoolSidecar(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl, err := client.New(c.cp.Config, client.Options{Scheme: workloads.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	// A dataset no earlier scenario staged, so this node's cache starts cold.
	prefix := "vm-model"
	files := map[string]string{}
	for key, size := range map[string]int{"config.json": 300, "weights/part-000.bin": 2<<20 + 5, "tok/vocab.txt": 40 << 10} {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		d.s3.Put(t, datasetBucket, prefix+"/"+key, data)
		sum := sha256.Sum256(data)
		files[key] = hex.EncodeToString(sum[:])
	}
	capacity := resource.MustParse("64Mi")
	volume := func(id string, mode corev1.PersistentVolumeAccessMode) datav1alpha1.VolumeConfig {
		return datav1alpha1.VolumeConfig{ID: id, Replicas: 1, SourceType: datav1alpha1.SourceS3,
			SourceURL: "s3://" + datasetBucket + "/" + prefix, AccessMode: mode, Capacity: &capacity,
			Options: map[string]string{"endpoint": d.s3.Endpoint, "pathStyle": "true", "secretName": datasetSecret}}
	}
	// The writable volume keeps what each pod wrote (write-back), under the pod's name.
	const outputs = "vm-outputs"
	d.s3.Bucket(t, outputs)
	rw := volume("rw", corev1.ReadWriteOnce)
	rw.OutputTarget = "s3://" + outputs + "/${pod.name}"
	vm := &datav1alpha1.VolumeManager{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "models"},
		Spec: datav1alpha1.VolumeManagerSpec{VolumeConfigs: []datav1alpha1.VolumeConfig{
			volume("ro", corev1.ReadOnlyMany), rw}},
	}
	attrs, err := volumemanager.DatasetAttributes(&vm.Spec.VolumeConfigs[0], volumemanager.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := params.Parse(attrs, params.StaticPV)
	if err != nil {
		t.Fatal(err)
	}
	ds := pl.Dataset.ID()

	// Every phase each stager pod reached, from a watch: stagers are deleted once done.
	var mu sync.Mutex
	phases := map[string]map[corev1.PodPhase]bool{}
	w, err := c.cp.Client.CoreV1().Pods(c.ns).Watch(ctx, metav1.ListOptions{LabelSelector: volumemanager.LabelStager + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				mu.Lock()
				if phases[p.Name] == nil {
					phases[p.Name] = map[corev1.PodPhase]bool{}
				}
				phases[p.Name][p.Status.Phase] = true
				mu.Unlock()
			}
		}
	}()

	// Earlier scenarios' volumes (the pvc pod runs on) stay; the VolumeManager's must all go.
	mountsBefore, loopsBefore := sortedMounts(t, c), volumeLoopDevices(t, c)
	start := time.Now()
	if err := cl.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	var got datav1alpha1.VolumeManager
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
			return false, err
		}
		return got.Status.State == datav1alpha1.StateRunning, nil
	})
	if err != nil {
		t.Fatalf("VolumeManager not Running: %v; status %+v", err, got.Status)
	}
	t.Logf("VolumeManager Running %s after creation", time.Since(start).Round(time.Millisecond))

	// Ready only once a stager ran, and the data is in the node's cache, as the source.
	mu.Lock()
	ran := 0
	for name, seen := range phases {
		if seen[corev1.PodSucceeded] {
			ran++
		} else {
			t.Errorf("stager pod %s never succeeded: %v", name, seen)
		}
	}
	mu.Unlock()
	if ran != 2 {
		t.Errorf("%d stager pods ran, want one per volume", ran)
	}
	cached := hashTree(t, filepath.Join(c.dir, "pool", datasource.CacheDirName, ds, "tree"))
	if !maps.Equal(cached, files) {
		t.Errorf("the node's cache differs from the source:\n got  %v\n want %v", cached, files)
	}
	var sp spapi.StoragePool
	if err := cl.Get(ctx, client.ObjectKey{Name: realnode.PoolName + "." + nodeName}, &sp); err != nil {
		t.Fatal(err)
	}
	if sp.Labels[consts.LabelDatasetPrefix+ds] != "true" {
		t.Errorf("StoragePool %s not labelled with the dataset: %v", sp.Name, sp.Labels)
	}
	for _, v := range got.Status.Volumes {
		if len(v.Nodes) != 1 || v.Nodes[0].Name != nodeName || v.Nodes[0].State != datav1alpha1.NodeReady ||
			v.Nodes[0].BytesTotal == 0 || v.Nodes[0].BytesDone != v.Nodes[0].BytesTotal {
			t.Errorf("volume %s nodes %+v", v.ID, v.Nodes)
		}
	}
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		err := cl.List(ctx, &pods, client.InNamespace(c.ns), client.MatchingLabels{volumemanager.LabelStager: "true"})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("stager pods left after Ready: %v", err)
	}

	// Pods of the claims the status gives: the shared tree read-only, and a writable copy.
	for _, v := range got.Status.Volumes {
		name := "vm-" + v.ID
		pod := checkerPod(c.checkerImage, c.resultsDir, name,
			[]corev1.Volume{{Name: "data", VolumeSource: v.VolumeSource}},
			[]corev1.VolumeMount{{Name: "data", MountPath: "/data", ReadOnly: v.VolumeSource.PersistentVolumeClaim.ReadOnly}},
			"-dir", "/data", "-hash", "-write-read")
		createPod(t, c.cp, c.ns, pod)
		waitPodRunning(t, c.cp, c.ns, name)
		dr := readResult(t, c.resultsDir, name).Dirs[0]
		if dr.HashError != "" || !maps.Equal(dr.Files, files) {
			t.Errorf("%s sees %v (%s), want %v", name, dr.Files, dr.HashError, files)
		}
		writable := dr.WriteRead != nil && dr.WriteRead.OK
		if want := v.ID == "rw"; writable != want {
			t.Errorf("%s: writable %v, want %v (%+v)", name, writable, want, dr.WriteRead)
		}
		deletePodAndWait(t, c.cp, c.ns, name)
	}
	if cached := hashTree(t, filepath.Join(c.dir, "pool", datasource.CacheDirName, ds, "tree")); !maps.Equal(cached, files) {
		t.Errorf("a writable copy changed the node's cache: %v", cached)
	}

	// spec.state Completed releases the claims and volumes: Completed, and kubelet unstages. The
	// controller writes the object too (its status), so the change is a merge patch, which
	// carries no resourceVersion to conflict with those writes.
	if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil {
		t.Fatal(err)
	}
	base := got.DeepCopy()
	got.Spec.State = datav1alpha1.RequestCompleted
	if err := cl.Patch(ctx, &got, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vm), &got); err != nil || got.Status.State != datav1alpha1.StateCompleted {
			return false, nil
		}
		var pvs corev1.PersistentVolumeList
		err := cl.List(ctx, &pvs, client.MatchingLabels{volumemanager.LabelManager: vm.Name})
		return err == nil && len(pvs.Items) == 0, nil
	})
	if err != nil {
		t.Fatalf("VolumeManager not Completed with its volumes released: %v; status %+v", err, got.Status)
	}
	// Completed means the outputs are at their target: what the rw pod wrote (the checker's
	// 1 MiB write-read file), byte-identical, and nothing of the unchanged dataset.
	if c := meta.FindStatusCondition(got.Status.Conditions, datav1alpha1.ConditionOutputsUploaded); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Completed without OutputsUploaded: %+v", c)
	}
	keys := map[string]string{}
	list, err := d.s3.Client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(outputs)})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range list.Contents {
		out, err := d.s3.Client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(outputs), Key: o.Key})
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(out.Body)
		_ = out.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(body)
		keys[*o.Key] = hex.EncodeToString(sum[:])
	}
	want := make([]byte, 1<<20) // the checker's pattern (hack/images/checker)
	for i := range want {
		want[i] = byte(i*7 + i/4096)
	}
	sum := sha256.Sum256(want)
	if w := map[string]string{"vm-rw/.checker-write-read": hex.EncodeToString(sum[:])}; !maps.Equal(keys, w) {
		t.Errorf("outputs at s3://%s once Completed: %v, want %v", outputs, keys, w)
	}
	// kubelet unpublishes and unstages through the driver once the pods are gone.
	err = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(context.Context) (bool, error) {
		return slices.Equal(sortedMounts(t, c), mountsBefore), nil
	})
	if err != nil {
		t.Errorf("volume mounts left: %v, before the VolumeManager %v", volumeMounts(t, c), mountsBefore)
	}
	if loops := volumeLoopDevices(t, c); !maps.Equal(loops, loopsBefore) {
		t.Errorf("loop devices left for writable copies: %v, before the VolumeManager %v", loops, loopsBefore)
	}
	if err := cl.Delete(ctx, vm); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		return apierrors.IsNotFound(cl.Get(ctx, client.ObjectKeyFromObject(vm), &got)), nil
	})
	if err != nil {
		t.Errorf("a Completed VolumeManager not deleted: %v (finalizers %v)", err, got.Finalizers)
	}
}

func sortedMounts(t *testing.T, c *cluster) []string {
	m := volumeMounts(t, c)
	slices.Sort(m)
	return m
}

// hashTree is the sha256 of every file under dir, by slash path.
func hashTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		sum := sha256.Sum256(b)
		out[filepath.ToSlash(rel)] = hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		t.Errorf("reading %s: %v", dir, err)
	}
	return out
}
