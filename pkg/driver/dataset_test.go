package driver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/cistern-csi/cistern/pkg/datasource"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// datasetEnv is a driver whose file:// dataset sources may read src.
func datasetEnv(t *testing.T) (*testEnv, string) {
	env := startDriver(t, testPool{name: "fast"})
	src := filepath.Join(env.dir, "sources")
	writeTree(t, filepath.Join(src, "set"), map[string]string{"a.txt": "alpha", "d/b.txt": "beta", "d/e/c.txt": "gamma"})
	env.stop()
	env.cfg.Datasets.LocalSourceRoots = []string{src}
	env.start()
	return env, src
}

// nfsExport is a directory one of testpeers.NFSServers exports for a driver test.
type nfsExport struct {
	testpeers.NFSExport
	name string // the server's name, for subtests and volume IDs
	dir  string // the exported directory
}

// startNFSServers serves a directory, filled by fill, from each of testpeers.NFSServers and
// restarts env's driver with them allowed in inline volumes (--nfs-servers).
func startNFSServers(t *testing.T, env *testEnv, fill func(dir string)) []nfsExport {
	t.Helper()
	var exports []nfsExport
	for _, srv := range testpeers.NFSServers {
		dir := t.TempDir()
		fill(dir)
		exports = append(exports, nfsExport{NFSExport: srv.Start(t, dir), name: srv.Name, dir: dir})
	}
	env.stop()
	env.cfg.Datasets.NFSServers = nil
	for _, e := range exports {
		env.cfg.Datasets.NFSServers = append(env.cfg.Datasets.NFSServers, e.Host)
	}
	env.start()
	return exports
}

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for k, v := range files {
		p := filepath.Join(dir, k)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func checkFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for k, v := range files {
		b, err := os.ReadFile(filepath.Join(dir, k))
		if err != nil || string(b) != v {
			t.Errorf("%s: %q %v, want %q", k, b, err, v)
		}
	}
}

// retryUnavailable repeats an RPC while it answers Unavailable (staging in progress), as kubelet
// does.
func retryUnavailable(t *testing.T, call func() error) error {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := call()
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var want = map[string]string{"a.txt": "alpha", "d/b.txt": "beta", "d/e/c.txt": "gamma"}

// TestDatasetDynamicVolume: a StorageClass with a source makes volumes that start with the
// dataset, filled once; the user's later changes survive a restage.
func TestDatasetDynamicVolume(t *testing.T) {
	env, src := datasetEnv(t)
	ctx := context.Background()
	vol := env.create("ds-1", 64<<20, map[string]string{"source": "file://" + src + "/set", "pool": "fast"})
	staging := filepath.Join(env.dir, "staging", vol.VolumeId)
	target := filepath.Join(env.dir, "target", vol.VolumeId)
	stage := func() error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
			StagingTargetPath: staging, VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext})
		return err
	}
	if err := retryUnavailable(t, stage); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId,
		StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext}); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, target, want)
	if err := os.WriteFile(filepath.Join(target, "a.txt"), []byte("changed by the user"), 0o644); err != nil {
		t.Fatal(err)
	}
	env.unpublishAndUnstage(vol.VolumeId)
	if err := retryUnavailable(t, stage); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, staging, map[string]string{"a.txt": "changed by the user", "d/b.txt": "beta"})
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}

	t.Run("failure case - source outside the allowed roots", func(t *testing.T) {
		vol := env.create("ds-2", 64<<20, map[string]string{"source": "file:///etc"})
		err := retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
				StagingTargetPath: filepath.Join(env.dir, "staging", vol.VolumeId), VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext})
			return err
		})
		wantCode(t, err, codes.PermissionDenied, "not under an allowed root")
	})
	t.Run("failure case - dataset larger than the volume", func(t *testing.T) {
		writeTree(t, filepath.Join(src, "big"), map[string]string{"big.bin": string(make([]byte, 40<<20))})
		_, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "ds-3", CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Parameters: map[string]string{"source": "file://" + src + "/big"}})
		wantCode(t, err, codes.OutOfRange, "requested capacity 33554432 bytes")
	})
	t.Run("failure case - bad dataset parameters", func(t *testing.T) {
		for _, params := range []map[string]string{
			{"source": "ftp://x/y"},
			{"endpoint": "http://x"},
			{"source": "s3://b", "pathStyle": "maybe"},
		} {
			_, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "bad", Parameters: params,
				VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}})
			wantCode(t, err, codes.InvalidArgument, "")
		}
		_, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "bad-block", Parameters: map[string]string{"source": "s3://b"},
			VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
		wantCode(t, err, codes.InvalidArgument, "block")
	})
}

// TestDatasetTooLargeAtCreate: with the node plugin in the same process, CreateVolume takes the
// dataset's listing from the real S3 server and refuses a dataset larger than the requested
// capacity with OutOfRange, naming both, before any object is read and leaving no volume, image or
// cached data behind.
func TestDatasetTooLargeAtCreate(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	ctx := context.Background()
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "models")
	s.Put(t, "models", "llm/weights-1.bin", make([]byte, 24<<20))
	s.Put(t, "models", "llm/weights-2.bin", make([]byte, 24<<20))
	proxy := testpeers.StartProxy(t, s.Endpoint, nil)
	params := map[string]string{"source": "s3://models/llm", "endpoint": proxy.URL, "pathStyle": "true"}
	secrets := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	create := func(name string, size int64) (*csi.CreateVolumeResponse, error) {
		return env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Parameters: params, Secrets: secrets})
	}

	_, err := create("too-small", 40<<20)
	wantCode(t, err, codes.OutOfRange, "requested capacity 41943040 bytes")
	t.Logf("refused: %v", err)
	for _, part := range []string{"s3://models/llm", "48.0 MiB"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q does not name %q", err, part)
		}
	}
	for _, k := range []string{"/models/llm/weights-1.bin", "/models/llm/weights-2.bin"} {
		if n := proxy.Gets(k); n != 0 {
			t.Errorf("%s read %d times before the refusal", k, n)
		}
	}
	if vols, err := env.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{}); err != nil || len(vols.GetEntries()) != 0 {
		t.Fatalf("volumes left behind: %v %v", vols.GetEntries(), err)
	}
	if m, _ := filepath.Glob(filepath.Join(env.pools[0].path, ".cistern", "volumes", "*")); len(m) != 0 {
		t.Fatalf("images left behind: %v", m)
	}
	if ents, _ := os.ReadDir(filepath.Join(env.pools[0].path, datasource.CacheDirName)); len(ents) != 0 {
		t.Fatalf("cached data left behind: %v", ents)
	}

	// Large enough: created, and staging has begun.
	resp, err := create("big-enough", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetVolume().GetCapacityBytes() < 64<<20 {
		t.Fatalf("capacity %d", resp.GetVolume().GetCapacityBytes())
	}
	parsed, err := volume.ParseParams(params, cparams.StorageClass)
	if err != nil {
		t.Fatal(err)
	}
	spec := datasource.SpecOf(parsed.Dataset)
	creds, _ := datasource.CredentialsFromSecrets(secrets)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if st, err := env.driver.datasets.Wait(wctx, datasource.Request{Spec: spec, Creds: creds, Pool: env.pools[0].path}); err != nil || !st.Ready() {
		t.Fatalf("pre-staging: %v %v", st, err)
	}
}

// TestDatasetStaticPV: a static PV naming a source, with no volume behind its handle, is the
// node's cached tree bind-mounted read-only; unstaging releases it for eviction.
func TestDatasetStaticPV(t *testing.T) {
	env, src := datasetEnv(t)
	ctx := context.Background()
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	vc := map[string]string{"source": "file://" + src + "/set"}
	id := "imagenet-static"
	staging := filepath.Join(env.dir, "staging", id)
	target := filepath.Join(env.dir, "target", id)
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: roMany, VolumeContext: vc})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: roMany, VolumeContext: vc, Readonly: true}); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, target, want)
	wantReady(t, env.driver, map[string]uint64{"tree": 1})
	if err := os.WriteFile(filepath.Join(target, "x"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("write to a shared dataset: %v, want EROFS", err)
	}
	refs := filepath.Join(env.pools[0].path, datasource.CacheDirName, "*", "refs", "*")
	if m, _ := filepath.Glob(refs); len(m) != 1 {
		t.Fatalf("references %v, want one", m)
	}
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(refs); len(m) != 0 {
		t.Fatalf("references left: %v", m)
	}
}

// TestDatasetStaticPVCapacity: a VolumeManager's static PV carries its capacity. A dataset
// larger than it fails staging with OutOfRange naming both sizes; within it, each writable
// publication gets its own volume layered on the cached dataset, deleted at unpublish, while
// read-only ones share the cached tree.
func TestDatasetStaticPVCapacity(t *testing.T) {
	env, src := datasetEnv(t)
	ctx := context.Background()
	rwx := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
	}
	stage := func(id string, vc map[string]string) (string, error) {
		staging := filepath.Join(env.dir, "staging", id)
		return staging, retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				VolumeCapability: rwx, VolumeContext: vc})
			return err
		})
	}
	t.Run("failure case - dataset larger than capacity", func(t *testing.T) {
		_, err := stage("cistern-vm-small", map[string]string{"source": "file://" + src + "/set", "capacity": "4"})
		wantCode(t, err, codes.OutOfRange, "more than the 4 B the volume has room for")
	})

	id := "cistern-vm-rw"
	vc := map[string]string{"source": "file://" + src + "/set", "capacity": "32Mi"}
	staging, err := stage(id, vc)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(target string, readOnly bool) {
		t.Helper()
		if err := retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				TargetPath: target, VolumeCapability: rwx, VolumeContext: vc, Readonly: readOnly})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	podA, podB, ro := filepath.Join(env.dir, "target", "a"), filepath.Join(env.dir, "target", "b"), filepath.Join(env.dir, "target", "ro")
	publish(podA, false)
	publish(podB, false)
	publish(ro, true)
	for _, dir := range []string{podA, podB, ro} {
		checkFiles(t, dir, want)
	}
	for _, dir := range []string{podA, podB} {
		if !isOverlayMount(t, dir) {
			t.Errorf("the writable publication %s is not layered on the cache", dir)
		}
	}
	if err := os.WriteFile(filepath.Join(podA, "a.txt"), []byte("changed"), 0o644); err != nil {
		t.Fatalf("write to a writable copy: %v", err)
	}
	checkFiles(t, podB, want) // copies are per pod
	checkFiles(t, ro, want)   // the cache is untouched
	if err := os.WriteFile(filepath.Join(ro, "x"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("write to the shared tree: %v, want EROFS", err)
	}
	// A reader-only access mode (a ReadOnlyMany PV) is the shared tree even when the publication
	// is not marked read-only.
	reader := filepath.Join(env.dir, "target", "reader")
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: reader,
		VolumeCapability: &csi.VolumeCapability{AccessType: rwx.AccessType, AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY}},
		VolumeContext:    vc}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(reader, "x"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("write through a reader-only capability: %v, want EROFS", err)
	}
	for _, dir := range []string{podA, podB, ro, reader} {
		if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: dir}); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range env.driver.volumes.Store().ListVolumes() {
		t.Errorf("writable copy %s left after unpublish", v.ID)
	}
	if imgs, _ := filepath.Glob(filepath.Join(env.pools[0].path, ".cistern", "volumes", "*.img")); len(imgs) > 0 {
		t.Errorf("images left: %v", imgs)
	}
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}

// TestDatasetStaticPVsShareTree: two static PVs of one dataset on a node (two VolumeManagers,
// or two volumes of one) share the cached tree, yet kubelet can unstage each: its check that no
// other mount shares a staging path's mount (GetDeviceMountRefs) finds none.
func TestDatasetStaticPVsShareTree(t *testing.T) {
	env, src := datasetEnv(t)
	ctx := context.Background()
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	vc := map[string]string{"source": "file://" + src + "/set"}
	var stagings []string
	for _, id := range []string{"cistern-vm-a", "cistern-vm-b"} {
		staging, target := filepath.Join(env.dir, "staging", id), filepath.Join(env.dir, "target", id)
		if err := retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				VolumeCapability: roMany, VolumeContext: vc})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: roMany, VolumeContext: vc, Readonly: true}); err != nil {
			t.Fatal(err)
		}
		checkFiles(t, target, want)
		stagings = append(stagings, staging)
	}
	for i, id := range []string{"cistern-vm-a", "cistern-vm-b"} {
		if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(env.dir, "target", id)}); err != nil {
			t.Fatal(err)
		}
		if refs, err := mount.New("").GetMountRefs(stagings[i]); err != nil || len(refs) > 0 {
			t.Fatalf("kubelet would refuse to unstage %s: mount refs %v %v", id, refs, err)
		}
		if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stagings[i]}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDatasetInline: CSI inline volumes with an NFS dataset (go-nfs and nfs-ganesha, the node's
// identity nobody reading world-readable files), read-only (shared cached tree) and writable
// (own copy); file:// is refused since any pod author writes inline volumes.
func TestDatasetInline(t *testing.T) {
	env, src := datasetEnv(t)
	ctx := context.Background()
	exports := startNFSServers(t, env, func(dir string) { writeTree(t, filepath.Join(dir, "data"), want) })
	mc := mountCap("")
	for _, srv := range exports {
		for _, tc := range []struct {
			name     string
			readOnly bool
		}{{"read-only", true}, {"writable", false}} {
			t.Run(srv.name+"/"+tc.name, func(t *testing.T) {
				id := "inline-" + srv.name + "-" + tc.name
				target := filepath.Join(env.dir, "target", id)
				vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": srv.URL("data"), "size": "32Mi"}
				if err := retryUnavailable(t, func() error {
					_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
						VolumeCapability: mc, VolumeContext: vc, Readonly: tc.readOnly})
					return err
				}); err != nil {
					t.Fatal(err)
				}
				checkFiles(t, target, want)
				if !tc.readOnly && !isOverlayMount(t, target) {
					t.Error("the writable inline volume is not layered on the cache")
				}
				err := os.WriteFile(filepath.Join(target, "new"), []byte("x"), 0o644)
				if tc.readOnly != errors.Is(err, unix.EROFS) {
					t.Fatalf("write: %v (read-only %v)", err, tc.readOnly)
				}
				if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(target); !os.IsNotExist(err) {
					t.Fatalf("target left behind: %v", err)
				}
			})
		}
	}
	t.Run("failure case - file source inline", func(t *testing.T) {
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "inline-file",
			TargetPath: filepath.Join(env.dir, "target", "inline-file"), VolumeCapability: mc, Readonly: true,
			VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "file://" + src + "/set"}})
		wantCode(t, err, codes.PermissionDenied, "inline")
	})
}

// countingExec counts the commands the driver runs through its mounter (mkfs, blkid, fsck).
type countingExec struct {
	utilexec.Interface
	mu   sync.Mutex
	runs map[string]int
}

func (c *countingExec) count(cmd string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs[cmd]++
}

func (c *countingExec) Command(cmd string, args ...string) utilexec.Cmd {
	c.count(cmd)
	return c.Interface.Command(cmd, args...)
}

func (c *countingExec) CommandContext(ctx context.Context, cmd string, args ...string) utilexec.Cmd {
	c.count(cmd)
	return c.Interface.CommandContext(ctx, cmd, args...)
}

func (c *countingExec) mkfs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for cmd, k := range c.runs {
		if strings.HasPrefix(cmd, "mkfs.") {
			n += k
		}
	}
	return n
}

// countingImages counts loop device attachments.
type countingImages struct {
	volume.Images
	attaches atomic.Int32
}

func (c *countingImages) Attach(path string) (string, error) {
	c.attaches.Add(1)
	return c.Images.Attach(path)
}

// TestDatasetStageRetriedDuringDownload: while a dataset downloads, NodeStageVolume answers
// Unavailable without touching the node; kubelet's retries do not attach, format or mount the
// volume again and again. Once the data is there, one attempt formats, mounts and fills it.
func TestDatasetStageRetriedDuringDownload(t *testing.T) {
	env, src := datasetEnv(t)
	writeTree(t, filepath.Join(src, "slow"), map[string]string{"weights.bin": strings.Repeat("w", 4<<20), "config.json": "{}"})
	run := &countingExec{runs: map[string]int{}}
	imgs := &countingImages{}
	env.stop()
	// 1 MiB/s: the 4 MiB file takes at least three seconds, longer than one attempt's budget.
	env.cfg.Datasets.BandwidthBytesPerSec = 1 << 20
	env.prepare = func(d *Driver) { run.Interface, d.mounter.Exec = d.mounter.Exec, run }
	env.wrapImages = func(i volume.Images) volume.Images { imgs.Images = i; return imgs }
	env.start()
	// CreateVolume (mode all) starts the download and returns once the listing is taken.
	vol := env.create("slow-ds", 64<<20, map[string]string{"source": "file://" + src + "/slow"})
	staging := filepath.Join(env.dir, "staging", vol.VolumeId)

	attempts, waiting := 0, 0
	err := retryUnavailable(t, func() error {
		attempts++
		// kubelet's budget: the driver answers shortly before the deadline (waitBudget).
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
			StagingTargetPath: staging, VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext})
		if status.Code(err) == codes.Unavailable {
			waiting++
			if n := imgs.attaches.Load(); n != 0 {
				t.Errorf("attempt %d: %d loop attachments while the dataset downloads", attempts, n)
			}
		}
		return err
	})
	if err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if waiting == 0 {
		t.Fatalf("no attempt saw the download in progress (%d attempts)", attempts)
	}
	if n := run.mkfs(); n != 1 {
		t.Errorf("mkfs ran %d times over %d attempts, want once", n, attempts)
	}
	if n := imgs.attaches.Load(); n != 1 {
		t.Errorf("loop device attached %d times over %d attempts, want once", n, attempts)
	}
	checkFiles(t, staging, map[string]string{"config.json": "{}"})
	t.Logf("%d attempts, %d answered Unavailable", attempts, waiting)
	// One volume made ready, timed once across its attempts.
	wantReady(t, env.driver, map[string]uint64{"layer": 1})

	// Restaging a filled volume neither formats nor waits for the dataset again.
	if _, err := env.node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
		StagingTargetPath: staging, VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext}); err != nil {
		t.Fatal(err)
	}
	if n := run.mkfs(); n != 1 {
		t.Errorf("mkfs ran %d times after a restage, want once", n)
	}
	wantReady(t, env.driver, map[string]uint64{"layer": 1}) // a restage is not timed again
	if _, err := env.node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}

// TestLegacyTreeRecordsMove: a cached-tree volume recorded by an older version (its own JSON
// store) is moved into the state store at start, so it can still be unstaged.
func TestLegacyTreeRecordsMove(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	dir := filepath.Join(env.cfg.StateDir, volume.LegacyTreeDir)
	writeTree(t, dir, map[string]string{
		"0123.json": `{"volumeID":"imagenet-static","pool":"fast","poolPath":"/p","datasetID":"abc","params":{"source":"s3://b"},"path":"/staging/x"}`,
		"bad.json":  `{`,
	})
	env.start()
	got, ok := env.driver.volumes.Store().GetTreeVolume("imagenet-static")
	if !ok || got.Pool != "fast" || got.DatasetID != "abc" || got.Path != "/staging/x" || got.Parameters["source"] != "s3://b" || got.Inline {
		t.Fatalf("moved record %+v %v", got, ok)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("legacy records left behind: %v", err)
	}
}

// TestInlineDatasetTenants, as a new user would meet it: tenant A's pod publishes an inline
// volume of its private bucket, with its secret; while A's staging runs, tenant B's pod on the
// same node publishes an inline volume of the same source with no secret. B is refused with
// PermissionDenied, during A's staging and once A's data is cached; A's volume gets the data.
// An inline nfs:// volume is refused unless the administrator allowed its server.
func TestInlineDatasetTenants(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	ctx := context.Background()
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "private")
	for i := range 8 {
		s.Put(t, "private", fmt.Sprintf("set/f%d", i), []byte(strings.Repeat("secret ", 100+i)))
	}
	var slow atomic.Bool
	slow.Store(true)
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		f := testpeers.None
		if r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "" && slow.Load() {
			f.Delay = 6 * time.Second // longer than a publish's budget below
		}
		return f
	})
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://private/set",
		"endpoint": proxy.URL, "pathStyle": "true"}
	publish := func(id string, secrets map[string]string) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // kubelet's calls have deadlines too
		defer cancel()
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id,
			TargetPath: filepath.Join(env.dir, "target", id), VolumeCapability: mountCap(""),
			VolumeContext: vc, Readonly: true, Secrets: secrets})
		return err
	}
	secrets := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	wantCode(t, publish("tenant-a", secrets), codes.Unavailable, "")
	wantCode(t, publish("tenant-b", nil), codes.PermissionDenied, "access denied")
	slow.Store(false)
	if err := retryUnavailable(t, func() error { return publish("tenant-a", secrets) }); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(env.dir, "target", "tenant-a", "f0")); err != nil || !strings.HasPrefix(string(b), "secret") {
		t.Fatalf("tenant A's volume: %q %v", b, err)
	}
	wantCode(t, publish("tenant-b", nil), codes.PermissionDenied, "access denied")
	if _, err := os.ReadDir(filepath.Join(env.dir, "target", "tenant-b")); err == nil {
		if ents, _ := os.ReadDir(filepath.Join(env.dir, "target", "tenant-b")); len(ents) != 0 {
			t.Fatalf("tenant B's target shows %v", ents)
		}
	}

	for _, srv := range testpeers.NFSServers {
		t.Run("failure case - inline "+srv.Name+" not allowed", func(t *testing.T) {
			export := t.TempDir()
			writeTree(t, filepath.Join(export, "data"), want)
			exp := srv.Start(t, export)
			id := "inline-nfs-" + srv.Name
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id,
				TargetPath: filepath.Join(env.dir, "target", id), VolumeCapability: mountCap(""), Readonly: true,
				VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": exp.URL("data")}})
			wantCode(t, err, codes.PermissionDenied, "--nfs-servers")
		})
	}
}

// TestStaticPVKeepsItsVersion: a static PV's publications bind the dataset version its staging
// was served, even after another version was staged in its place (the source changed, or
// another tenant sees other data): the publication finds the version by the volume's reference,
// not by the path of the dataset's current version, which by then holds the other version.
func TestStaticPVKeepsItsVersion(t *testing.T) {
	env, src := datasetEnv(t)
	ctx := context.Background()
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	vc := map[string]string{"source": "file://" + src + "/set"}
	stage := func(id string) (staging, target string) {
		staging, target = filepath.Join(env.dir, "staging", id), filepath.Join(env.dir, "target", id)
		if err := retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				VolumeCapability: roMany, VolumeContext: vc})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return staging, target
	}
	publish := func(id, staging, target string) {
		if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: roMany, VolumeContext: vc, Readonly: true}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = env.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		})
	}
	stagingA, targetA := stage("dataset-a")
	// The source changes; the next volume gets the new version, staged where the first was.
	newer := map[string]string{"a.txt": "alpha, second edition", "d/b.txt": "beta", "d/e/c.txt": "gamma"}
	writeTree(t, filepath.Join(src, "set"), newer)
	stagingB, targetB := stage("dataset-b")
	publish("dataset-b", stagingB, targetB)
	checkFiles(t, targetB, newer)
	// A's first publication comes now, as kubelet's may, long after A's staging.
	publish("dataset-a", stagingA, targetA)
	checkFiles(t, targetA, want)
}
