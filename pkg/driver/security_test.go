package driver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource/egress"
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
