package storagepool_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/units"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil/cacheondisk"
)

// cacheOnDisk is cacheondisk.Read, failing the test on an error.
func cacheOnDisk(t *testing.T, pool string) map[string]cacheondisk.Dataset {
	t.Helper()
	disk, err := cacheondisk.Read(pool)
	if err != nil {
		t.Fatal(err)
	}
	return disk
}

func matchesDisk(obj *spapi.StoragePool, disk map[string]cacheondisk.Dataset) bool {
	return cacheondisk.Matches(obj, disk) == nil
}

// TestDatasetInventory stages datasets through the real driver (NodeStageVolume of static
// dataset PVs) and checks that the pool's StoragePool lists exactly what is in the cache on disk
// after staging, with the volume's reference, after unstaging, and after an eviction; and that a
// sidecar at rest writes nothing.
func TestDatasetInventory(t *testing.T) {
	cp := framework.Shared(t)
	c := adminClient(t, cp)
	node := uniqueNode(t, "n1")
	pool := poolConfig{name: "fast", path: poolDir(t, 64)}
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "a", "weights.bin"), 20<<20)
	writeFile(t, filepath.Join(src, "a", "config.json"), 1234)
	writeFile(t, filepath.Join(src, "b", "weights.bin"), 26<<20)
	// Staging b leaves less than 40% of the 64 MiB free: the unused a is evicted for it.
	kubeletRoot := t.TempDir()
	d := startDriverArgs(t, node, []string{"--local-source-roots=" + src, "--cache-low-watermark=0.4",
		"--cache-high-watermark=0.5", "--kubelet-root=" + kubeletRoot}, pool)
	sc := startSidecar(t, cp, d)
	name := "fast." + node
	waitPool(t, c, name, "published with an empty cache", func(o *spapi.StoragePool) bool {
		return o.Status.Cache != nil && o.Status.Cache.Total == 0
	})

	conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	nodeRPC := csi.NewNodeClient(conn)
	stagingDir := filepath.Join(kubeletRoot, "plugins", "kubernetes.io", "csi", consts.DriverName)
	stage := func(t *testing.T, volumeID, dataset string) time.Time {
		t.Helper()
		target := filepath.Join(stagingDir, volumeID)
		if err := os.MkdirAll(target, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
		req := &csi.NodeStageVolumeRequest{
			VolumeId: volumeID, StagingTargetPath: target,
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
			},
			VolumeContext: map[string]string{consts.ParamSource: "file://" + filepath.Join(src, dataset), consts.ParamPool: "fast"},
		}
		waitFor(t, "NodeStageVolume of "+volumeID, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := nodeRPC.NodeStageVolume(ctx, req)
			if code := status.Code(err); err != nil && code != codes.Unavailable && code != codes.DeadlineExceeded && code != codes.Aborted {
				t.Fatalf("NodeStageVolume: %v", err)
			}
			return err == nil
		})
		return time.Now()
	}
	unstage := func(t *testing.T, volumeID string) {
		t.Helper()
		if _, err := nodeRPC.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{
			VolumeId: volumeID, StagingTargetPath: filepath.Join(stagingDir, volumeID),
		}); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
	}
	// atRest checks that, once the last change settled (capacity follows the deletion of an
	// evicted dataset's files), the sidecar makes no API write over three resyncs (2 s each).
	settle := func(t *testing.T) {
		t.Helper()
		waitFor(t, "a quiet sidecar", func() bool {
			w := sc.metric("storagepool_sidecar_api_writes_total", "")
			time.Sleep(2500 * time.Millisecond)
			return w >= 0 && sc.metric("storagepool_sidecar_api_writes_total", "") == w
		})
	}
	atRest := func(t *testing.T) {
		t.Helper()
		settle(t)
		w := sc.metric("storagepool_sidecar_api_writes_total", "")
		syncs := sc.metric("storagepool_sidecar_syncs_total", `result="success"`)
		waitFor(t, "three more syncs", func() bool {
			return sc.metric("storagepool_sidecar_syncs_total", `result="success"`) >= syncs+3
		})
		if got := sc.metric("storagepool_sidecar_api_writes_total", ""); got != w {
			t.Errorf("at rest the sidecar made %v API writes, want 0", got-w)
		}
	}

	var idA string
	ok := t.Run("a staged dataset is listed as on disk, with its volume", func(t *testing.T) {
		staged := stage(t, "dataset-a-1", "a")
		obj := waitPool(t, c, name, "dataset a Ready", func(o *spapi.StoragePool) bool {
			return matchesDisk(o, cacheOnDisk(t, pool.path)) && len(o.Status.Cache.Datasets) == 1 &&
				o.Status.Cache.Datasets[0].References == 1
		})
		for id := range cacheOnDisk(t, pool.path) {
			idA = id // the only one
		}
		t.Logf("the StoragePool showed the staged dataset %v after NodeStageVolume returned", time.Since(staged).Round(100*time.Millisecond))
		ds := obj.Status.Cache.Datasets[0]
		if ds.ID != idA || ds.Source != "file://"+filepath.Join(src, "a") || ds.Scheme != "file" || ds.LastUsed == nil ||
			ds.BytesDone != 20<<20+1234 {
			t.Errorf("dataset a = %+v", ds)
		}
		out := framework.Kubectl(t, cp, "get", "storagepools", name)
		// The CACHED column in human units, not the quantity's raw bytes.
		if cached := units.HumanBytes(obj.Status.Cache.Bytes.Value()); !strings.Contains(out, "CACHED") || !strings.Contains(out, cached) ||
			cached != "20.0 MiB" || strings.Contains(out, "20972754") {
			t.Errorf("kubectl get storagepools:\n%s", out)
		}
		out = framework.Kubectl(t, cp, "get", "storagepools", "-l", consts.LabelDatasetPrefix+idA, "-o", "name")
		if strings.TrimSpace(out) != "storagepool.storagepool.storage.k8s.io/"+name {
			t.Errorf("selecting the pools that hold a: %q", out)
		}
		atRest(t)
	})

	ok = ok && t.Run("unstaged, the reference goes", func(t *testing.T) {
		unstage(t, "dataset-a-1")
		waitPool(t, c, name, "dataset a without references", func(o *spapi.StoragePool) bool {
			return matchesDisk(o, cacheOnDisk(t, pool.path)) && len(o.Status.Cache.Datasets) == 1 && o.Status.Cache.Datasets[0].References == 0
		})
	})

	ok = ok && t.Run("an evicted dataset leaves the list and its label", func(t *testing.T) {
		stage(t, "dataset-b-1", "b")
		obj := waitPool(t, c, name, "b Ready and a evicted", func(o *spapi.StoragePool) bool {
			disk := cacheOnDisk(t, pool.path)
			_, hasA := disk[idA]
			return !hasA && matchesDisk(o, disk) && len(o.Status.Cache.Datasets) == 1 &&
				o.Status.Cache.Datasets[0].Source == "file://"+filepath.Join(src, "b")
		})
		if _, ok := obj.Labels[consts.LabelDatasetPrefix+idA]; ok {
			t.Errorf("labels = %v", obj.Labels)
		}
		atRest(t)
		unstage(t, "dataset-b-1")
	})

	_ = ok && t.Run("a restarted sidecar rewrites nothing", func(t *testing.T) {
		waitPool(t, c, name, "b without references", func(o *spapi.StoragePool) bool {
			return matchesDisk(o, cacheOnDisk(t, pool.path)) && len(o.Status.Cache.Datasets) == 1 && o.Status.Cache.Datasets[0].References == 0
		})
		// Capacity changes below the driver's granularity (the 4 KiB of a reference file) are
		// published at the next resync: let it pass.
		settle(t)
		sc = restartWritesNothing(t, t, cp, c, d, sc, name)
	})
}
