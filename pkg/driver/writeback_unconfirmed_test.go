package driver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/volume"
)

// TestWriteBackUnconfirmed unstages a claim whose output target answers its uploads with neither
// a checksum nor an MD5 ETag (as a bucket encrypted with SSE-KMS answers): the upload stops,
// reported by a Warning Event and cistern_writeback_unconfirmed_total, it is not retried, and the
// claim keeps its data (DeleteVolume refuses).
func TestWriteBackUnconfirmed(t *testing.T) {
	env, s, _, events := writeBackEnv(t)
	target, err := url.Parse(s.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var puts atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodPut || strings.Contains(resp.Request.URL.Path, "cistern-write-probe") {
			return nil
		}
		puts.Add(1)
		for k := range resp.Header {
			if strings.HasPrefix(strings.ToLower(k), "x-amz-checksum") {
				resp.Header.Del(k)
			}
		}
		resp.Header.Set("ETag", `"a1b2c3d4e5f60718293a4b5c6d7e8f90"`)
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)

	ctx := context.Background()
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	vol, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "claim", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Secrets: owner,
		Parameters: map[string]string{"source": "s3://shared/set", "endpoint": srv.URL, "pathStyle": "true", "pool": "fast", "outputTarget": "s3://out/claim",
			"csi.storage.k8s.io/pvc/name": "work", "csi.storage.k8s.io/pvc/namespace": "team"}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.Volume.VolumeId
	staging, mnt := filepath.Join(env.dir, "staging", id), filepath.Join(env.dir, "target", id)
	if _, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: mountCap(""), VolumeContext: vol.Volume.VolumeContext, Secrets: owner}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: mnt, VolumeCapability: mountCap("")}); err != nil {
		t.Fatal(err)
	}
	writeOutputs(t, mnt, map[string][]byte{"out/eval.csv": []byte("a,b\n1,2\n")})
	env.unpublishAndUnstage(id)
	claim := volume.ObjectRef{Kind: "PersistentVolumeClaim", Namespace: "team", Name: "work"}
	waitFor(t, "the unconfirmed upload to be reported on the claim", func() bool {
		return events.has(claim, true, volume.ReasonOutputUploadUnconfirmed, "neither the object's checksum nor its MD5", "not retried", "the data is kept")
	})
	_, err = env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.FailedPrecondition, "keeps its data until its outputs are uploaded")
	if n := writeBackMetric(t, env, "cistern_writeback_unconfirmed_total"); n != 1 {
		t.Errorf("cistern_writeback_unconfirmed_total = %v, want 1", n)
	}
	if n, refusals := puts.Load(), writeBackMetric(t, env, "cistern_writeback_refusals_total"); n != 1 || refusals != 1 {
		t.Errorf("%d PUTs of outputs and %v failed passes, want 1 of each: not retried", n, refusals)
	}
	if events.has(claim, true, volume.ReasonOutputUploadFailed) {
		t.Error("an OutputUploadFailed Event (retrying) for an upload that cannot be confirmed")
	}
}
