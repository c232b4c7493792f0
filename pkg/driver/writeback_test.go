package driver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestWriteBackInline publishes a writable inline volume of an S3 dataset that names an output
// target, writes through it, and unpublishes it while the target refuses writes: NodeUnpublish
// returns, the volume stays through a driver restart, and once the target accepts, every change
// (and nothing unchanged) is at the target, byte for byte, and the volume is gone. A caller who
// may read the dataset but not write the target is refused at publish.
func TestWriteBackInline(t *testing.T) {
	env, s, proxy := writeBackEnv(t)
	ctx := context.Background()
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
		"pathStyle": "true", "size": "64Mi", "outputTarget": "s3://out/runs/${pod.namespace}/${pod.name}",
		"csi.storage.k8s.io/pod.namespace": "team", "csi.storage.k8s.io/pod.name": "train-0"}
	publish := func(id string, secrets map[string]string) (string, error) {
		target := filepath.Join(env.dir, "target", id)
		return target, retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
				VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: secrets})
			return err
		})
	}

	t.Run("failure case - a reader of the dataset who may not write the target", func(t *testing.T) {
		target, err := publish("wb-anonymous", nil)
		wantCode(t, err, codes.PermissionDenied, "outputTarget s3://out/runs/team/train-0/")
		if mounted(t, target) {
			t.Error("the refused volume is mounted")
		}
		if _, ok := env.driver.volumes.Store().GetVolume("wb-anonymous"); ok {
			t.Error("the refused volume was created")
		}
	})

	id := "wb-owner"
	target, err := publish(id, map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"ckpt/model.bin": randomBytes(t, 13<<20+5), "metrics.json": []byte(`{"loss":0.1}`)}
	writeOutputs(t, target, want)
	if err := os.WriteFile(filepath.Join(target, "f1"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	want["f1"] = []byte("changed")

	// The target refuses from now on: the upload fails and is retried, the volume stays.
	proxy.SetFaults(refuseWrites)
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if mounted(t, target) {
		t.Error("the target is still mounted after NodeUnpublish")
	}
	refused := proxy.Requests.Load()
	waitFor(t, "the upload to be refused again", func() bool { return proxy.Requests.Load() > refused+10 })
	waitFor(t, "the refusals to be counted", func() bool { return writeBackMetric(t, env, "cistern_writeback_refusals_total") >= 2 })
	if n := writeBackMetric(t, env, "cistern_writeback_pending_bytes"); n < 13<<20 {
		t.Errorf("cistern_writeback_pending_bytes = %v while the outputs wait", n)
	}
	env.restart() // a node plugin upgraded mid-upload
	if _, ok := env.driver.volumes.Store().GetVolume(id); !ok {
		t.Fatal("the volume was deleted before its outputs were uploaded")
	}
	if _, err := os.Stat(image.VolumePath(env.pools[0].path, pool.MetaDir, id)); err != nil {
		t.Fatalf("the volume's data is gone before its outputs were uploaded: %v", err)
	}
	proxy.SetFaults(nil)
	waitFor(t, "the volume to be uploaded and deleted", func() bool {
		_, ok := env.driver.volumes.Store().GetVolume(id)
		return !ok
	})
	checkOutputs(t, s, "runs/team/train-0/", want)
	if _, err := os.Stat(image.VolumePath(env.pools[0].path, pool.MetaDir, id)); !os.IsNotExist(err) {
		t.Errorf("the volume's image is left: %v", err)
	}
}

// writeBackEnv is a driver with write-back on, and versitygw (behind a proxy the test may make
// refuse writes) holding bucket "shared", which anyone may read, and "out", which only the owner
// may write.
func writeBackEnv(t *testing.T) (*testEnv, *testpeers.S3, *testpeers.Proxy) {
	env := startDriver(t, testPool{name: "fast", size: 1 << 30})
	env.stop()
	env.cfg.Writable.WriteBack = volume.WriteBack{Dir: filepath.Join(env.dir, "writeback"),
		Uploader: writeback.Config{PartSize: 5 << 20, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}}
	env.start()
	ctx := context.Background()
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "shared")
	s.Bucket(t, "out")
	for i := range 4 {
		s.Put(t, "shared", fmt.Sprintf("set/f%d", i), bytes.Repeat([]byte{byte('a' + i)}, 100<<10))
	}
	// Anyone may read the dataset; only the owner may write "out".
	policy := `{"Version":"2012-10-17","Statement":[` +
		`{"Effect":"Allow","Principal":"*","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::shared"]},` +
		`{"Effect":"Allow","Principal":"*","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::shared/*"]}]}`
	if _, err := s.Client.PutBucketPolicy(ctx, &s3.PutBucketPolicyInput{Bucket: aws.String("shared"), Policy: aws.String(policy)}); err != nil {
		t.Fatal(err)
	}
	proxy := testpeers.StartProxy(t, s.Endpoint, nil)
	return env, s, proxy
}

// refuseWrites makes proxy answer every write 503.
func refuseWrites(r *http.Request, _ int64) testpeers.Fault {
	if r.Method == http.MethodPut || r.Method == http.MethodPost {
		return testpeers.Fault{Status: http.StatusServiceUnavailable, Code: "ServiceUnavailable", ResetAfter: -1}
	}
	return testpeers.None
}

// writeOutputs writes the files of want under dir.
func writeOutputs(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	for p, b := range want {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkOutputs fails unless prefix of "out" holds exactly want.
func checkOutputs(t *testing.T, s *testpeers.S3, prefix string, want map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	got := map[string][]byte{}
	out, err := s.Client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("out"), Prefix: aws.String(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out.Contents {
		g, err := s.Client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("out"), Key: o.Key})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(g.Body)
		g.Body.Close()
		got[(*o.Key)[len(prefix):]] = b
	}
	if len(got) != len(want) {
		t.Errorf("%d objects at the target, want %d (the changed files only)", len(got), len(want))
	}
	for p, b := range want {
		if !bytes.Equal(got[p], b) {
			t.Errorf("%s: %d bytes at the target, %d written", p, len(got[p]), len(b))
		}
	}
}

// writeBackMetric is the value of one of the driver's write-back metrics.
func writeBackMetric(t *testing.T, env *testEnv, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(env.driver.volumes.WriteBackCollectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + i>>9)
	}
	return b
}

// waitFor polls cond until it holds, for at most a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestWriteBackClaim stages a claim of a dataset class that names an output target, writes
// through it and unstages it while the target refuses: NodeUnstage returns, DeleteVolume keeps
// the data and says why, staging again waits; once the target accepts, the changes are there and
// DeleteVolume deletes the volume.
func TestWriteBackClaim(t *testing.T) {
	env, s, proxy := writeBackEnv(t)
	ctx := context.Background()
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	vol, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "claim", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Secrets: owner,
		Parameters: map[string]string{"source": "s3://shared/set", "endpoint": proxy.URL, "pathStyle": "true", "pool": "fast", "outputTarget": "s3://out/claim"}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.Volume.VolumeId
	staging, target := filepath.Join(env.dir, "staging", id), filepath.Join(env.dir, "target", id)
	stage := func(secrets map[string]string) error {
		return retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				VolumeCapability: mountCap(""), VolumeContext: vol.Volume.VolumeContext, Secrets: secrets})
			return err
		})
	}
	wantCode(t, stage(nil), codes.PermissionDenied, "outputTarget s3://out/claim/")
	if err := stage(owner); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap("")}); err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"out/eval.csv": []byte("a,b\n1,2\n"), "ckpt.bin": randomBytes(t, 6<<20)}
	writeOutputs(t, target, want)
	proxy.SetFaults(refuseWrites)
	env.unpublishAndUnstage(id)
	_, err = env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.FailedPrecondition, "keeps its data until its outputs are uploaded")
	_, err = env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: mountCap(""), VolumeContext: vol.Volume.VolumeContext, Secrets: owner})
	wantCode(t, err, codes.Unavailable, "outputs are uploaded")
	proxy.SetFaults(nil)
	waitFor(t, "the claim's outputs to be uploaded", func() bool { return env.driver.volumes.WriteBackHolds(id) == "" })
	checkOutputs(t, s, "claim/", want)
	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}
