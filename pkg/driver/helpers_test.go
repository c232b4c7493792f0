package driver

import (
	"context"
	"fmt"
	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/testutil"
)

// testPool is one pool of a test driver: a directory, or a real filesystem (fs, ext4 when empty)
// when size > 0.
type testPool struct {
	name   string
	fs     string
	labels map[string]string
	size   int64
	path   string
	shared bool
}

// testEnv is a running driver with clients over its real unix socket.
type testEnv struct {
	t        *testing.T
	dir      string
	cfg      Config
	pools    []testPool
	driver   *Driver
	stop     func()
	ctrl     csi.ControllerClient
	node     csi.NodeClient
	ident    csi.IdentityClient
	group    csi.GroupControllerClient
	poolsRPC spv1.StoragePoolControllerClient
	// wrapImages, when set, wraps the driver's image operations (to count or pause them).
	wrapImages func(volume.Images) volume.Images
	// prepare, when set, adjusts a new driver before it serves (to wrap its exec).
	prepare func(*Driver)
}

func writePoolsConfig(t *testing.T, path string, pools []testPool) {
	t.Helper()
	var b strings.Builder
	b.WriteString("pools:\n")
	for _, p := range pools {
		fmt.Fprintf(&b, "- name: %s\n  path: %s\n", p.name, p.path)
		if p.shared {
			b.WriteString("  shared: true\n")
		}
		if len(p.labels) > 0 {
			b.WriteString("  labels:\n")
			for k, v := range p.labels {
				fmt.Fprintf(&b, "    %s: %s\n", k, v)
			}
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// startDriver starts a driver (mode all) over the given pools.
func startDriver(t *testing.T, pools ...testPool) *testEnv {
	t.Helper()
	dir := t.TempDir()
	for i := range pools {
		if pools[i].path != "" {
			continue // made by the test (a benchmark's pool on disk)
		}
		if pools[i].size > 0 {
			fs := pools[i].fs
			if fs == "" {
				fs = "ext4"
			}
			pools[i].path = testutil.LoopFS(t, fs, pools[i].size)
		} else {
			pools[i].path = filepath.Join(dir, "pools", pools[i].name)
			if err := os.MkdirAll(pools[i].path, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	env := &testEnv{t: t, dir: dir, pools: pools}
	t.Cleanup(func() {
		testutil.UnmountUnder(dir)
		for _, p := range pools {
			testutil.UnmountUnder(p.path)
			testutil.DetachLoopsUnder(p.path)
		}
	})
	writePoolsConfig(t, filepath.Join(dir, "pools.yaml"), pools)
	env.cfg = Config{
		DriverName:        "cistern.csi.dev",
		Endpoint:          socketEndpoint(t),
		NodeID:            "node-1",
		Mode:              ModeAll,
		PoolsConfig:       filepath.Join(dir, "pools.yaml"),
		StateDir:          filepath.Join(dir, "state"),
		DefaultVolumeSize: 32 << 20,
		PoolCheckInterval: time.Hour, // tests refresh explicitly
		KubeletRoot:       dir,
	}
	// Tests name loopback S3 servers in inline volumes; the fail-closed default has its own test.
	env.cfg.Datasets.TenantEndpoints = egress.Allow{Any: true}
	env.start()
	return env
}

// socketEndpoint is a CSI endpoint in a short directory of its own: a socket's path must fit
// in 108 bytes, which a test's TempDir (named after the test) may not.
func socketEndpoint(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return "unix://" + filepath.Join(dir, "csi.sock")
}

func (e *testEnv) start() {
	e.t.Helper()
	var images volume.Images = volume.LoopImages{}
	if e.wrapImages != nil {
		images = e.wrapImages(images)
	}
	d, err := newDriver(e.cfg, images)
	if err != nil {
		e.t.Fatal(err)
	}
	if e.prepare != nil {
		e.prepare(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	<-d.Ready()
	conn, err := grpc.NewClient(e.cfg.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	stopped := false
	e.stop = func() {
		if stopped {
			return
		}
		stopped = true
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("driver stopped with %v", err)
		}
	}
	e.t.Cleanup(e.stop)
	e.driver = d
	e.ctrl = csi.NewControllerClient(conn)
	e.node = csi.NewNodeClient(conn)
	e.ident = csi.NewIdentityClient(conn)
	e.group = csi.NewGroupControllerClient(conn)
	e.poolsRPC = spv1.NewStoragePoolControllerClient(conn)
}

// restart stops the driver and starts a new one over the same state and pools.
func (e *testEnv) restart() {
	e.t.Helper()
	e.stop()
	e.start()
}

func mountCap(fs string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func (e *testEnv) create(name string, size int64, params map[string]string) *csi.Volume {
	e.t.Helper()
	resp, err := e.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Parameters: params,
	})
	if err != nil {
		e.t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.GetVolume()
}

// stageAndPublish stages a mount volume and publishes it; it returns the target path.
func (e *testEnv) stageAndPublish(id string, c *csi.VolumeCapability) string {
	e.t.Helper()
	staging := filepath.Join(e.dir, "staging", id)
	target := filepath.Join(e.dir, "target", id)
	if _, err := e.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: c,
	}); err != nil {
		e.t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := e.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c,
	}); err != nil {
		e.t.Fatalf("NodePublishVolume: %v", err)
	}
	return target
}

func (e *testEnv) unpublishAndUnstage(id string) {
	e.t.Helper()
	if _, err := e.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{
		VolumeId: id, TargetPath: filepath.Join(e.dir, "target", id),
	}); err != nil {
		e.t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := e.node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{
		VolumeId: id, StagingTargetPath: filepath.Join(e.dir, "staging", id),
	}); err != nil {
		e.t.Fatalf("NodeUnstageVolume: %v", err)
	}
}

func wantCode(t *testing.T, err error, c codes.Code, contains string) {
	t.Helper()
	if status.Code(err) != c {
		t.Fatalf("want %s, got %v", c, err)
	}
	if contains != "" && !strings.Contains(err.Error(), contains) {
		t.Fatalf("want error containing %q, got %v", contains, err)
	}
}
