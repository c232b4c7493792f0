package driver

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestDatasetSlowStoreShortDeadlines: an S3 server that answers each object GET after 20 s, and
// NodeStageVolume called again and again with a 4 s deadline, as a kubelet with a short timeout
// would. No call lives long enough for one GET, so staging, and the check that the caller may
// read the data, must go on in the background whatever each call's deadline: the volume is
// staged after a bounded number of calls, with the source's bytes.
func TestDatasetSlowStoreShortDeadlines(t *testing.T) {
	const getDelay = 20 * time.Second
	env := startDriver(t, testPool{name: "fast"})
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "slow")
	files := map[string]string{"model/config.json": `{"layers": 2}`, "model/weights.bin": "0123456789abcdef"}
	for k, v := range files {
		s.Put(t, "slow", k, []byte(v))
	}
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodGet && !r.URL.Query().Has("list-type") {
			return testpeers.Fault{ResetAfter: -1, Delay: getDelay}
		}
		return testpeers.None
	})
	params := map[string]string{"source": "s3://slow/model", "endpoint": proxy.URL, "pathStyle": "true", "pool": "fast"}
	secrets := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	resp, err := env.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "slow-store",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Parameters: params, Secrets: secrets})
	if err != nil {
		t.Fatal(err)
	}
	vol := resp.GetVolume()
	staging := filepath.Join(env.dir, "staging", vol.VolumeId)

	// Staging takes a few GETs in a row (objects in parallel, then the caller's pinned read):
	// a handful of delays. Without background progress it never ends.
	start := time.Now()
	limit := start.Add(8 * getDelay)
	calls := 0
	for {
		calls++
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
			StagingTargetPath: staging, VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext, Secrets: secrets})
		cancel()
		if err == nil {
			break
		}
		if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
			t.Fatalf("call %d: %v", calls, err)
		}
		if time.Now().After(limit) {
			t.Fatalf("not staged after %d calls with a 4 s deadline in %s (S3 answers each GET after %s); last: %v",
				calls, time.Since(start).Round(time.Second), getDelay, err)
		}
		time.Sleep(time.Second) // kubelet's retries are further apart
	}
	t.Logf("staged after %d calls in %s", calls, time.Since(start).Round(time.Second))
	checkFiles(t, staging, map[string]string{"config.json": files["model/config.json"], "weights.bin": files["model/weights.bin"]})
	if _, err := env.node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}
