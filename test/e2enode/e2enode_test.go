package e2enode

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework/realnode"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/writeback/credstore"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testpeers"
)

const nodeName = "cistern-e2e-node"

// cluster is the one-node cluster the suite's tests share, in order.
type cluster struct {
	cp           *framework.ControlPlane
	bins         *realnode.Binaries
	dir          string
	containerd   *realnode.Containerd
	kubelet      *realnode.Kubelet
	node         *realnode.CisternNode
	storageClass string
	ns           string
	resultsDir   string
	checkerImage string
	// sts exchanges pods' ServiceAccount tokens for S3 keys (webidentity_test.go).
	sts *testpeers.STS
	// caBundles is the driver's --s3-ca-bundles directory (private_ca_test.go).
	caBundles string
}

// requireMachine skips the suite where this machine cannot run a node.
func requireMachine(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		realnode.Unavailable(t, "needs root (kubelet, containerd, runc, mounts)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		realnode.Unavailable(t, "needs loop devices: %v", err)
	}
	filesystems, err := os.ReadFile("/proc/filesystems")
	if err != nil || !strings.Contains(string(filesystems), "overlay") {
		realnode.Unavailable(t, "needs overlayfs for containerd's snapshotter")
	}
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		realnode.Unavailable(t, "needs cgroups: %v", err)
	}
}

// lockHost lets one node suite run on a host at a time, across checkouts: kubelet, containerd and
// CNI use fixed host paths, and a run's cleanup removes them and kills what runs in its cgroups,
// which would tear down another run's pods mid-test.
func lockHost(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "cistern-e2enode.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock; registered first, so it runs last
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		return
	}
	t.Log("waiting for another node e2e run on this host to finish")
	start := time.Now()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatalf("locking the host for the node suite: %v", err)
	}
	t.Logf("waited %s for the other run", time.Since(start).Round(time.Second))
}

// netnsNodesDir makes the directory of a suite whose nodes run in network namespaces (not
// t.TempDir: it must not be removed while something is still mounted below it) and prepares the
// host's node paths. Its cleanup, registered before the nodes', runs after their namespaces, and
// the mounts in them, are gone.
func netnsNodesDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if left := realnode.MountsUnder(t, dir); len(left) > 0 {
			t.Errorf("mounts left under %s, not removing it: %v", dir, left)
			return
		}
		_ = os.RemoveAll(dir)
	})
	realnode.PrepareNodePaths(t)
	return dir
}

// startCluster brings up control plane, containerd, kubelet and the Cistern node; every piece is
// torn down by t.Cleanup in reverse order, and the host is cleaned last.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	requireMachine(t)
	lockHost(t)
	bins := realnode.FindBinaries(t)

	// Not t.TempDir: it must not be removed while something is still mounted below it.
	dir, err := os.MkdirTemp("", "cistern-e2enode-")
	if err != nil {
		t.Fatal(err)
	}
	// kubelet's device manager, containerd's shims and CNI's result cache use these fixed paths
	// whatever the root directories; remove them afterwards if they are ours.
	var created []string
	for _, p := range []string{"/var/lib/kubelet", "/run/containerd", "/var/lib/cni"} {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			created = append(created, p)
		}
	}
	t.Cleanup(func() {
		defer realnode.LogDuration(t, "host cleanup", time.Now())
		realnode.CleanupHost(t, dir)
		for _, p := range created {
			_ = os.RemoveAll(p)
		}
		realnode.CleanupCgroups(t)
		if left := realnode.MountsUnder(t, dir); len(left) > 0 {
			t.Errorf("mounts left under %s, not removing it: %v", dir, left)
			return
		}
		_ = os.RemoveAll(dir)
	})

	begin := time.Now()
	ca := realnode.NewNodeCA(t, dir)
	c := &cluster{bins: bins, dir: dir, resultsDir: filepath.Join(dir, "results"), checkerImage: bins.Images["checker"].Ref}
	c.cp = framework.StartControlPlane(t, framework.Options{
		ControllerManager: true,
		Scheduler:         true,
		APIServerArgs:     []string{"--client-ca-file=" + ca.CertFile},
	})
	// The images its pods run; images.json also has the install suite's.
	c.containerd = realnode.StartContainerd(t, bins, filepath.Join(dir, "containerd"), realnode.ContainerdOptions{
		Imported: []string{"pause", "checker", "git", "controller", "papermill"},
	})
	kubeletRoot := filepath.Join(dir, "kubelet")
	c.kubelet = realnode.StartKubelet(t, c.cp, ca, bins.Kubelet, nodeName, kubeletRoot, c.containerd.Socket, "")
	realnode.WaitNodeReady(t, c.cp, c.kubelet, nodeName, 2*time.Minute)
	t.Logf("node %s Ready %s after start", nodeName, time.Since(begin).Round(time.Millisecond))

	// Writable by the non-root users the pods run as.
	if err := os.Mkdir(c.resultsDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(c.resultsDir, 0o1777); err != nil {
		t.Fatal(err)
	}
	c.node = realnode.NewCisternNode(t, bins, dir, kubeletRoot, nodeName)
	c.storageClass = realnode.CreateStorageObjects(t, c.cp)
	c.sts = startSTS(t, c.cp)
	c.caBundles = filepath.Join(dir, "s3-ca-bundles")
	if err := os.Mkdir(c.caBundles, 0o755); err != nil {
		t.Fatal(err)
	}
	// --kubeconfig: the driver reads the ServiceAccounts of web-identity claims (webidentity_test.go).
	// --writeback-dir: the journals of the notebook outputs' uploads (notebook_test.go), the run's own.
	c.node.DriverArgs = []string{"--sts-endpoint=" + c.sts.URL, "--s3-ca-bundles=" + c.caBundles, "--kubeconfig=" + c.cp.Kubeconfig,
		"--writeback-dir=" + filepath.Join(dir, "writeback")}
	// The kernel keeps the key of the uploads' sealed credentials beyond the run (credstore).
	t.Cleanup(func() { _ = credstore.Drop(filepath.Join(dir, "writeback", "secrets")) })
	c.node.StartDriver(t)
	c.node.StartProvisioner(t, c.cp)
	c.ns = framework.CreateNamespace(t, c.cp, "e2enode")
	// Runs before the driver stops: kubelet unmounts through it.
	t.Cleanup(func() {
		defer realnode.LogDuration(t, "deleting the remaining pods", time.Now())
		c.deleteAllPods(t)
	})
	return c
}

// deleteAllPods deletes the test namespace's pods and waits for them to go, so that kubelet
// tears their volumes down while the driver still runs.
func (c *cluster) deleteAllPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = framework.DeleteAllPods(ctx, c.cp, c.ns)
	// kubelet unstages after the pod is gone; give it the time to do so through the driver.
	_ = wait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
		return len(volumeMounts(t, c)) == 0, nil
	})
}

func TestNode(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()

	t.Run("registration", func(t *testing.T) {
		csiNode := c.node.WaitRegistered(t, c.cp)
		for _, d := range csiNode.Spec.Drivers {
			if d.Name == consts.DriverName && !slices.Contains(d.TopologyKeys, consts.TopologyKey) {
				t.Errorf("CSINode driver topology keys %v lack %s", d.TopologyKeys, consts.TopologyKey)
			}
		}
		node, err := c.cp.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := node.Labels[consts.TopologyKey]; got != nodeName {
			t.Errorf("Node label %s = %q, want %q (kubelet sets it from NodeGetInfo)", consts.TopologyKey, got, nodeName)
		}
	})

	var pvcPod *corev1.Pod
	t.Run("pvc", func(t *testing.T) {
		claim := pvc("data", c.storageClass, "64Mi")
		if _, err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := checkerPod(c.checkerImage, c.resultsDir, "pvc",
			[]corev1.Volume{pvcVolume("data", "data")},
			[]corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			"-dir", "/data", "-write-read", "-size", "4194304", "-fill", "-heartbeat", "1s")
		// A non-root user that can write only through fsGroup: kubelet applies it to the volume.
		pod.Spec.SecurityContext = &corev1.PodSecurityContext{
			RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](1000), FSGroup: ptr.To[int64](2000),
		}
		createPod(t, c.cp, c.ns, pod)
		pvcPod = waitPodRunning(t, c.cp, c.ns, "pvc")

		res := readResult(t, c.resultsDir, "pvc")
		if len(res.Dirs) != 1 {
			t.Fatalf("result has %d dirs", len(res.Dirs))
		}
		d := res.Dirs[0]
		if d.WriteRead == nil || !d.WriteRead.OK {
			t.Errorf("write and read back in the container failed: %+v", d.WriteRead)
		}
		if d.Fill == nil || !d.Fill.ENOSPC {
			t.Errorf("writing past the requested size did not fail with ENOSPC: %+v", d.Fill)
		} else if d.Fill.Bytes > 64<<20 {
			t.Errorf("wrote %d bytes into a 64 MiB volume", d.Fill.Bytes)
		}
		if d.TotalBytes > 64<<20 || d.TotalBytes < 32<<20 {
			t.Errorf("the container sees a %d-byte filesystem for a 64 MiB claim", d.TotalBytes)
		}
		if !slices.Contains(res.Groups, 2000) {
			t.Errorf("container groups %v lack the fsGroup 2000", res.Groups)
		}

		claim, err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pv, err := c.cp.Client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("PV of the claim: %v", err)
		}
		if pv.Spec.CSI == nil || !strings.HasPrefix(pv.Spec.CSI.VolumeHandle, realnode.PoolName+"-") {
			t.Errorf("PV %s is not a volume of pool %s: %+v", pv.Name, realnode.PoolName, pv.Spec.CSI)
		}
		if !pvPinnedTo(pv, nodeName) {
			t.Errorf("PV %s has no node affinity to %s: %+v", pv.Name, nodeName, pv.Spec.NodeAffinity)
		}
		if n := len(volumeMounts(t, c)); n < 2 {
			t.Errorf("expected a staging and a publish mount under kubelet's directory, found %d", n)
		}
	})

	t.Run("inline-ephemeral", func(t *testing.T) {
		pod := checkerPod(c.checkerImage, c.resultsDir, "inline",
			[]corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver:           consts.DriverName,
				VolumeAttributes: map[string]string{"pool": realnode.PoolName, "size": "32Mi"},
			}}}},
			[]corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}},
			"-dir", "/scratch", "-write-read", "-fill")
		createPod(t, c.cp, c.ns, pod)
		waitPodRunning(t, c.cp, c.ns, "inline")
		d := readResult(t, c.resultsDir, "inline").Dirs[0]
		if d.WriteRead == nil || !d.WriteRead.OK {
			t.Errorf("write and read back failed: %+v", d.WriteRead)
		}
		if d.Fill == nil || !d.Fill.ENOSPC || d.Fill.Bytes > 32<<20 {
			t.Errorf("filling a 32 MiB inline volume: %+v, want ENOSPC within 32 MiB", d.Fill)
		}
		deletePodAndWait(t, c.cp, c.ns, "inline")
	})

	d := startDataset(t, c)
	t.Run("datasets", func(t *testing.T) { testDatasets(t, c, d) })
	t.Run("web-identity", func(t *testing.T) { testWebIdentity(t, c, d) })
	t.Run("private-ca", func(t *testing.T) { testPrivateCA(t, c) })
	t.Run("streaming-restart", func(t *testing.T) { testStreamingRestart(t, c, d) })

	// The leaderworkerset and notebooks scenarios share one workload-controller.
	workloadsErr := startWorkloadController(t, c)
	t.Run("leaderworkerset", func(t *testing.T) {
		if workloadsErr != nil {
			t.Fatal(workloadsErr)
		}
		testLeaderWorkerSet(t, c)
	})
	t.Run("notebooks", func(t *testing.T) {
		if workloadsErr != nil {
			t.Fatal(workloadsErr)
		}
		testNotebooks(t, c, d)
	})

	t.Run("volumemanager", func(t *testing.T) {
		if workloadsErr != nil {
			t.Fatal(workloadsErr)
		}
		testVolumeManager(t, c, d)
	})

	t.Run("driver-restart", func(t *testing.T) {
		if pvcPod == nil {
			t.Skip("the pvc pod did not start")
		}
		before := volumeMounts(t, c)
		c.node.RestartDriver()
		c.node.WaitRegistered(t, c.cp)
		// Heartbeats written and read back after the restart prove the mount still works.
		restarted := time.Now()
		deadline := restarted.Add(time.Minute)
		var hb Heartbeat
		for {
			readJSON(t, filepath.Join(c.resultsDir, "pvc.heartbeat.json"), &hb)
			if !hb.OK {
				t.Fatalf("heartbeat after the driver restart failed: %s", hb.Error)
			}
			if hb.Time.After(restarted.Add(3 * time.Second)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no heartbeat from the pod since the driver restarted (last %+v)", hb)
			}
			time.Sleep(500 * time.Millisecond)
		}
		after := volumeMounts(t, c)
		if strings.Join(before, "\n") != strings.Join(after, "\n") {
			t.Errorf("volume mounts changed across the driver restart:\nbefore %v\nafter  %v", before, after)
		}
		if pod, err := c.cp.Client.CoreV1().Pods(c.ns).Get(ctx, "pvc", metav1.GetOptions{}); err != nil || pod.Status.Phase != corev1.PodRunning {
			t.Errorf("pvc pod after the driver restart: %v %v", err, pod.Status.Phase)
		}
	})

	t.Run("teardown", func(t *testing.T) {
		deletePodAndWait(t, c.cp, c.ns, "pvc")
		if left := volumeMounts(t, c); len(left) > 0 {
			t.Errorf("mounts left in kubelet's directories after the pods are gone: %v", left)
		}
		if err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitNoPVs(t, c)
		if loops := volumeLoopDevices(t, c); len(loops) > 0 {
			t.Errorf("loop devices left for volumes: %v", loops)
		}
		images, _ := filepath.Glob(filepath.Join(c.dir, "pool", ".cistern", "volumes", "*"))
		if len(images) > 0 {
			t.Errorf("volume images left in the pool: %v", images)
		}
	})
}

// volumeMounts lists the CSI mounts in kubelet's directories: staging (plugins/kubernetes.io/csi)
// and publish (pods/<uid>/volumes/kubernetes.io~csi) paths.
func volumeMounts(t *testing.T, c *cluster) []string {
	t.Helper()
	var csi []string
	for _, mp := range realnode.MountsUnder(t, c.kubelet.RootDir) {
		if strings.Contains(mp, "/kubernetes.io~csi/") || strings.Contains(mp, "/plugins/kubernetes.io/csi/") {
			csi = append(csi, mp)
		}
	}
	return csi
}

// volumeLoopDevices lists loop devices backed by volume images in the pool (not the pool's own).
func volumeLoopDevices(t *testing.T, c *cluster) map[string]string {
	t.Helper()
	return realnode.LoopDevicesUnder(t, filepath.Join(c.dir, "pool"))
}

func waitNoPVs(t *testing.T, c *cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := c.cp.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		t.Fatalf("PersistentVolumes not deleted: %v", err)
	}
}

func pvPinnedTo(pv *corev1.PersistentVolume, node string) bool {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return false
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == consts.TopologyKey && slices.Contains(e.Values, node) {
				return true
			}
		}
	}
	return false
}
