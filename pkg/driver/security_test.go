package driver

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/pool"
)

// TestTenantEndpoints: inline volumes and VolumeManager PVs may name only the S3 endpoints the
// administrator allows (--tenant-s3-endpoints), an administrator's static PV any endpoint; no
// one may name a metadata service. Only a loopback server is ever contacted.
func TestTenantEndpoints(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	allow, err := egress.ParseAllow([]string{"s3.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	env.cfg.Datasets.TenantEndpoints = allow
	env.start()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	ctx := context.Background()
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	inline := func(endpoint string) map[string]string {
		return map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://data/set",
			"endpoint": endpoint, "pathStyle": "true", "size": "32Mi"}
	}
	publish := func(id string, vc map[string]string, readOnly bool) error {
		target := filepath.Join(env.dir, "target", id)
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
			VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: readOnly})
		t.Cleanup(func() {
			_, _ = env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		})
		return err
	}
	stage := func(id string, vc map[string]string) error {
		staging := filepath.Join(env.dir, "staging", id)
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: roMany, VolumeContext: vc})
		t.Cleanup(func() {
			_, _ = env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		})
		return err
	}
	static := map[string]string{"source": "s3://data/set", "endpoint": srv.URL, "pathStyle": "true"}

	t.Run("failure case - inline read-only volume, endpoint not allowed", func(t *testing.T) {
		wantCode(t, publish("inline-ro", inline(srv.URL), true), codes.PermissionDenied, "allow-list")
	})
	t.Run("failure case - inline writable volume, endpoint not allowed", func(t *testing.T) {
		wantCode(t, publish("inline-rw", inline(srv.URL), false), codes.PermissionDenied, "allow-list")
	})
	t.Run("failure case - VolumeManager PV, endpoint not allowed", func(t *testing.T) {
		wantCode(t, stage("cistern-vm-0123456789abcdef0123", static), codes.PermissionDenied, "allow-list")
	})
	t.Run("failure case - metadata service by address", func(t *testing.T) {
		wantCode(t, publish("inline-md", inline("http://169.254.169.254"), true), codes.PermissionDenied, "link-local")
	})
	t.Run("failure case - metadata service by name, even for an administrator", func(t *testing.T) {
		vc := map[string]string{"source": "s3://data/set", "endpoint": "http://metadata.google.internal"}
		wantCode(t, stage("admin-md", vc), codes.PermissionDenied, "metadata")
	})
	if n := hits.Load(); n != 0 {
		t.Fatalf("refused endpoints were contacted %d times", n)
	}
	t.Run("administrator's static PV may name any endpoint", func(t *testing.T) {
		err := retryUnavailable(t, func() error { return stage("admin-pv", static) })
		if err == nil || strings.Contains(err.Error(), "allow-list") || hits.Load() == 0 {
			t.Fatalf("NodeStageVolume: %v after %d requests; want the server asked (and refusing)", err, hits.Load())
		}
	})
}

// loopsBacking counts the loop devices whose backing file the kernel reports as path.
func loopsBacking(t *testing.T, path string) int {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	n := 0
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == path {
			n++
		}
	}
	return n
}

// TestPoolPathThroughSymlink: a pool configured through a symlink attaches one loop device per
// staged block volume however often it is staged, keeps it staged across a restart and
// detaches it at unstage.
func TestPoolPathThroughSymlink(t *testing.T) {
	testutilRoot(t)
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	link := filepath.Join(env.dir, "pool-link")
	if err := os.Symlink(env.pools[0].path, link); err != nil {
		t.Fatal(err)
	}
	linked := env.pools[0]
	linked.path = link
	writePoolsConfig(t, env.cfg.PoolsConfig, []testPool{linked})
	env.start()
	ctx := context.Background()
	resp, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "blk-link",
		CapacityRange: &csi.CapacityRange{RequiredBytes: 8 * mb}, VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	img := image.VolumePath(env.pools[0].path, pool.MetaDir, id)
	staging := filepath.Join(env.dir, "staging", id)
	stage := func() {
		t.Helper()
		if _, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id,
			StagingTargetPath: staging, VolumeCapability: blockCap()}); err != nil {
			t.Fatalf("NodeStageVolume: %v", err)
		}
	}
	stage()
	stage() // a retried stage finds the device it attached
	if n := loopsBacking(t, img); n != 1 {
		t.Fatalf("%d loop devices back the image after two stages, want 1", n)
	}
	env.restart()
	v, ok := env.driver.volumes.Store().GetVolume(id)
	if !ok || v.StagingPath == "" || v.Device == "" {
		t.Fatalf("staged block volume forgotten across a restart: %+v", v)
	}
	stage()
	if n := loopsBacking(t, img); n != 1 {
		t.Fatalf("%d loop devices back the image after a restart and stage, want 1", n)
	}
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if n := loopsBacking(t, img); n != 0 {
		t.Fatalf("%d loop devices left after unstage", n)
	}
	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}

// TestCorruptStateRecord: one unreadable record does not stop the node plugin; it is set aside,
// logged and counted, and the other volumes are served.
func TestCorruptStateRecord(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	good := env.create("good", 8*mb, nil).GetVolumeId()
	env.stop()
	bad := filepath.Join(env.cfg.StateDir, "volumes", "fast-corrupt.json")
	if err := os.WriteFile(bad, []byte(`{"id": "fast-corrupt", "pool": "fa`), 0o600); err != nil {
		t.Fatal(err)
	}
	env.start()
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Fatalf("corrupt record still in place: %v", err)
	}
	if m, _ := filepath.Glob(bad + ".corrupt-*"); len(m) != 1 {
		t.Fatalf("quarantined copies %v, want 1", m)
	}
	if _, err := env.ctrl.ControllerGetVolume(context.Background(), &csi.ControllerGetVolumeRequest{VolumeId: good}); err != nil {
		t.Fatalf("the good volume: %v", err)
	}
	mux := http.NewServeMux()
	env.driver.Metrics().RegisterToServer(mux, "/metrics")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if want := `cistern_state_records_quarantined_total{node="node-1"} 1`; !strings.Contains(rec.Body.String(), want) {
		t.Fatalf("metrics lack %q:\n%s", want, rec.Body.String())
	}
}

// TestRequestValidation: IDs and node paths from a CSI client are checked before any handler
// touches the disk; sizes near the int64 limit are OutOfRange. (A dataset class with a content
// source restores or clones: TestDatasetRestoreAndClone.)
func TestRequestValidation(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	ctx := context.Background()
	inRoot := func(p ...string) string { return filepath.Join(append([]string{env.dir}, p...)...) }
	outside := filepath.Join(filepath.Dir(env.dir), "elsewhere")
	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
		want string
	}{
		{"failure case - volume ID with a path", func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "../../etc",
				StagingTargetPath: inRoot("staging", "x"), VolumeCapability: mountCap("")})
			return err
		}, codes.InvalidArgument, "ID"},
		{"failure case - volume ID too long", func() error {
			_, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: strings.Repeat("a", 129)})
			return err
		}, codes.InvalidArgument, "ID"},
		{"failure case - snapshot ID with a slash", func() error {
			_, err := env.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "fast-snap-1/../../x"})
			return err
		}, codes.InvalidArgument, "ID"},
		{"failure case - content source ID with a slash", func() error {
			_, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "restore",
				VolumeCapabilities: []*csi.VolumeCapability{mountCap("")},
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
					Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "a/b"}}}})
			return err
		}, codes.InvalidArgument, "ID"},
		{"failure case - target outside the kubelet root", func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "fast-0123",
				StagingTargetPath: inRoot("staging", "x"), TargetPath: outside, VolumeCapability: mountCap("")})
			return err
		}, codes.InvalidArgument, "kubelet root"},
		{"failure case - staging path escaping the kubelet root", func() error {
			_, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "fast-0123",
				StagingTargetPath: inRoot("staging", "..", "..", "elsewhere")})
			return err
		}, codes.InvalidArgument, "kubelet root"},
		{"failure case - relative target", func() error {
			_, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "fast-0123", TargetPath: "target/x"})
			return err
		}, codes.InvalidArgument, "kubelet root"},
		{"failure case - required bytes at the int64 limit", func() error {
			_, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "huge",
				CapacityRange: &csi.CapacityRange{RequiredBytes: math.MaxInt64}, VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}})
			return err
		}, codes.OutOfRange, "largest"},
		{"failure case - required bytes just below the int64 limit", func() error {
			_, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "huge2",
				CapacityRange: &csi.CapacityRange{RequiredBytes: math.MaxInt64 - 100}, VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}})
			return err
		}, codes.OutOfRange, "largest"},
	} {
		t.Run(tc.name, func(t *testing.T) { wantCode(t, tc.call(), tc.code, tc.want) })
	}
	if _, err := os.Stat(outside); !os.IsNotExist(err) {
		t.Fatalf("a path outside the kubelet root was touched: %v", err)
	}
}

// TestTenantEndpointsFailClosed: without --tenant-s3-endpoints an inline volume's S3 endpoint
// is refused (PermissionDenied, naming the flag) before anything is dialled.
func TestTenantEndpointsFailClosed(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	env.cfg.Datasets.TenantEndpoints = egress.Allow{}
	env.start()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	err := publishInlineS3(t, env, "inline-closed", srv.URL)
	wantCode(t, err, codes.PermissionDenied, "--tenant-s3-endpoints")
	if n := hits.Load(); n != 0 {
		t.Fatalf("the refused endpoint got %d requests", n)
	}
}

// TestRedirectNotFollowedThroughSocket: an inline volume whose S3 endpoint redirects every
// request to an internal URL fails, and the internal URL is never asked.
func TestRedirectNotFollowedThroughSocket(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"})
	var internalHits atomic.Int32
	internal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		internalHits.Add(1)
		_, _ = w.Write([]byte("node secret"))
	}))
	t.Cleanup(internal.Close)
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, internal.URL+"/latest/meta-data/", http.StatusFound)
	}))
	t.Cleanup(redirector.Close)
	err := publishInlineS3(t, env, "inline-redirect", redirector.URL)
	wantCode(t, err, codes.InvalidArgument, "redirect")
	if n := internalHits.Load(); n != 0 {
		t.Fatalf("the redirect target got %d requests", n)
	}
}

// publishInlineS3 publishes a read-only inline volume of s3://data/set at endpoint, retrying while
// the driver answers Unavailable, and unpublishes it when the test ends.
func publishInlineS3(t *testing.T, env *testEnv, id, endpoint string) error {
	t.Helper()
	ctx := context.Background()
	target := filepath.Join(env.dir, "target", id)
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://data/set",
		"endpoint": endpoint, "pathStyle": "true"}
	err := retryUnavailable(t, func() error {
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
			VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: true})
		return err
	})
	t.Cleanup(func() {
		_, _ = env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	})
	return err
}
