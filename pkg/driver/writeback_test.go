package driver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/pool"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/pkg/writeback/credstore"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestWriteBackInline publishes a writable inline volume of an S3 dataset that names an output
// target, writes through it, and unpublishes it while the target refuses writes: NodeUnpublish
// returns, the volume stays through a driver restart, and once the target accepts, every change
// (and nothing unchanged) is at the target, byte for byte, and the volume is gone. A caller who
// may read the dataset but not write the target is refused at publish. The keys kept for the
// upload are nowhere on the node's disk in plaintext, and still open after the restart.
func TestWriteBackInline(t *testing.T) {
	env, s, proxy, events := writeBackEnv(t)
	ctx := context.Background()
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
		"pathStyle": "true", "size": "64Mi", "outputTarget": "s3://out/runs/${pod.namespace}/${pod.name}",
		"csi.storage.k8s.io/pod.namespace": "team", "csi.storage.k8s.io/pod.name": "train-0", "csi.storage.k8s.io/pod.uid": "uid-1"}
	pod := volume.ObjectRef{Kind: "Pod", Namespace: "team", Name: "train-0", UID: "uid-1"}
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
	// The keys kept for the upload are on the node's disk sealed, never in plaintext.
	noSecretOnDisk(t, env, s.SecretKey)
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
	noSecretOnDisk(t, env, s.SecretKey)
	env.restart() // a node plugin upgraded mid-upload: the kernel still holds the credentials' key
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
	// What the pod's owner reads with kubectl describe pod (--events records these).
	events.want(t, pod, true, volume.ReasonOutputTargetRefused, "wb-anonymous", "may not write its outputTarget s3://out/runs/team/train-0/")
	events.want(t, pod, false, volume.ReasonOutputUploadStarted, "wb-owner", "3 objects")
	events.want(t, pod, true, volume.ReasonOutputUploadFailed, "wb-owner", "ServiceUnavailable", "retrying in", "the data is kept")
	events.want(t, pod, false, volume.ReasonOutputUploadFinished, "wb-owner", "3 objects", fmt.Sprintf("%d bytes", 13<<20+5+12+7))
}

// TestWriteBackRestartAfterHandOff: NodeUnpublish of a writable inline volume that names an
// output target unmounts the target only and hands the volume's filesystem, still mounted
// (read-only, aside) and attached, to the upload. A node plugin stopped right after (the target
// refusing, so the upload cannot finish first) leaves that mount and loop device as a killed one
// does. The next one finds them, or only the loop device where the mount went with the old
// container's mount namespace (the DaemonSet mounts --writeback-dir without propagation); it
// takes kubelet's repeated NodeUnpublish without mounting anything twice, finishes the upload
// once the target accepts, and leaves no mount, loop device or record.
func TestWriteBackRestartAfterHandOff(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mountLost bool
	}{{"kept", false}, {"lost", true}} { // short: the socket's path has a length limit
		t.Run(tc.name, func(t *testing.T) { testRestartAfterHandOff(t, tc.mountLost) })
	}
}

func testRestartAfterHandOff(t *testing.T, mountLost bool) {
	env, s, proxy, _ := writeBackEnv(t)
	ctx := context.Background()
	id := "wb-restart"
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
		"pathStyle": "true", "size": "64Mi", "outputTarget": "s3://out/restart",
		"csi.storage.k8s.io/pod.namespace": "team", "csi.storage.k8s.io/pod.name": "train-0", "csi.storage.k8s.io/pod.uid": "uid-1"}
	target := filepath.Join(env.dir, "target", id)
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
			VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"ckpt/model.bin": randomBytes(t, 11<<20+3), "eval.json": []byte(`{"acc":0.9}`)}
	writeOutputs(t, target, want) // not synced: the hand-off syncs what the pod left dirty

	proxy.SetFaults(refuseWrites)
	unpublish := func() {
		t.Helper()
		if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}
	unpublish()
	aside := filepath.Join(env.cfg.Writable.WriteBack.Dir, "mnt", id)
	if mounted(t, target) {
		t.Error("the target is still mounted after NodeUnpublish")
	}
	if opts := mountOptions(t, aside); len(opts) != 1 || !strings.HasPrefix(opts[0], "ro,") {
		t.Errorf("the volume's filesystem is mounted aside with %q, want one read-only mount", opts)
	}
	refused := proxy.Requests.Load()
	waitFor(t, "the upload to be refused", func() bool { return proxy.Requests.Load() > refused+3 })

	env.stop()
	// What a killed node plugin leaves: the mount aside and the loop device.
	if !mounted(t, aside) || len(testutil.LoopDevicesUnder(env.pools[0].path)) != 1 {
		t.Fatalf("after the stop: mounted aside %v, loop devices %v; want both kept", mounted(t, aside), testutil.LoopDevicesUnder(env.pools[0].path))
	}
	if mountLost {
		if err := unix.Unmount(aside, 0); err != nil {
			t.Fatal(err)
		}
	}
	env.start()
	unpublish() // kubelet's retry, had the plugin been killed before it answered
	refused = proxy.Requests.Load()
	waitFor(t, "the upload to be refused again", func() bool { return proxy.Requests.Load() > refused+3 })
	if opts := mountOptions(t, aside); len(opts) != 1 || !strings.HasPrefix(opts[0], "ro,") {
		t.Errorf("after the restart and a repeated NodeUnpublish: mounts aside %q, want one read-only mount", opts)
	}
	proxy.SetFaults(nil)
	waitFor(t, "the volume to be uploaded and deleted", func() bool {
		_, ok := env.driver.volumes.Store().GetVolume(id)
		return !ok
	})
	checkOutputs(t, s, "restart/", want)
	if mounted(t, aside) {
		t.Error("the volume's filesystem is still mounted aside after its upload")
	}
	if devs := testutil.LoopDevicesUnder(env.pools[0].path); len(devs) != 0 {
		t.Errorf("loop devices left after the upload: %v", devs)
	}
	if _, err := os.Stat(image.VolumePath(env.pools[0].path, pool.MetaDir, id)); !os.IsNotExist(err) {
		t.Errorf("the volume's image is left: %v", err)
	}
}

// mountOptions lists the per-mount options of each mount at p, bottom first.
func mountOptions(t *testing.T, p string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == p {
			out = append(out, f[5])
		}
	}
	return out
}

// poolOutputs is what the node's pools report of volumes' outputs not at their targets, by volume.
func poolOutputs(t *testing.T, env *testEnv) map[string]*spv1.VolumeOutputs {
	t.Helper()
	resp, err := (&poolServer{d: env.driver}).ControllerListStoragePools(context.Background(), &spv1.ControllerListStoragePoolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*spv1.VolumeOutputs{}
	for _, p := range resp.GetPools() {
		if c := p.GetCache(); c != nil && int(c.GetOutputsTotal()) != len(c.GetOutputs()) {
			t.Errorf("pool %s lists %d of %d outputs", p.GetName(), len(c.GetOutputs()), c.GetOutputsTotal())
		}
		for _, o := range p.GetCache().GetOutputs() {
			out[o.GetVolume()] = o
		}
	}
	return out
}

// writeBackEnv is a driver with write-back on, and versitygw (behind a proxy the test may make
// refuse writes) holding bucket "shared", which anyone may read, and "out", which only the owner
// may write.
func writeBackEnv(t *testing.T, pools ...testPool) (*testEnv, *testpeers.S3, *testpeers.Proxy, *eventLog) {
	return writeBackEnvS3(t, "", pools...)
}

// writeBackEnvS3 is writeBackEnv with the S3 server's data in s3Dir ("": the test's own
// temporary directory).
func writeBackEnvS3(t *testing.T, s3Dir string, pools ...testPool) (*testEnv, *testpeers.S3, *testpeers.Proxy, *eventLog) {
	if len(pools) == 0 {
		pools = []testPool{{name: "fast", size: 1 << 30}}
	}
	env := startDriver(t, pools...)
	env.stop()
	events := &eventLog{}
	env.cfg.Writable.WriteBack = volume.WriteBack{Dir: filepath.Join(env.dir, "writeback"),
		Uploader: writeback.Config{PartSize: 5 << 20, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
			Settle: time.Second},
		MinInterval: 100 * time.Millisecond, OnEvent: events.add}
	// The kernel keeps the key the credentials are sealed with beyond the test (credstore).
	t.Cleanup(func() { _ = credstore.Drop(filepath.Join(env.cfg.Writable.WriteBack.Dir, "secrets")) })
	env.start()
	ctx := context.Background()
	s := testpeers.StartS3(t, s3Dir)
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
	return env, s, proxy, events
}

// eventLog keeps the write-back's Events (what the node plugin records with --events).
type eventLog struct {
	mu     sync.Mutex
	events []volume.Event
}

func (l *eventLog) add(e volume.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// want fails unless an Event of reason about obj holds every one of texts.
func (l *eventLog) want(t *testing.T, obj volume.ObjectRef, warning bool, reason string, texts ...string) {
	t.Helper()
	if !l.has(obj, warning, reason, texts...) {
		l.mu.Lock()
		defer l.mu.Unlock()
		t.Errorf("no %s Event on %+v holding %q; Events: %+v", reason, obj, texts, l.events)
	}
}

// hasAny reports whether an Event of reason, about any object, holds every one of texts.
func (l *eventLog) hasAny(reason string, texts ...string) bool {
	return l.find(func(e volume.Event) bool { return e.Reason == reason }, texts)
}

// has reports whether an Event of reason about obj holds every one of texts.
func (l *eventLog) has(obj volume.ObjectRef, warning bool, reason string, texts ...string) bool {
	return l.find(func(e volume.Event) bool { return e.Object == obj && e.Reason == reason && e.Warning == warning }, texts)
}

// find reports whether an Event that is(it) holds every one of texts.
func (l *eventLog) find(is func(volume.Event) bool, texts []string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
next:
	for _, e := range l.events {
		if !is(e) {
			continue
		}
		for _, s := range texts {
			if !strings.Contains(e.Message, s) {
				continue next
			}
		}
		return true
	}
	return false
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
	got := objectsAt(t, s, prefix)
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
	env, s, proxy, events := writeBackEnv(t)
	ctx := context.Background()
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	vol, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "claim", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Secrets: owner,
		Parameters: map[string]string{"source": "s3://shared/set", "endpoint": proxy.URL, "pathStyle": "true", "pool": "fast", "outputTarget": "s3://out/claim",
			"csi.storage.k8s.io/pvc/name": "work", "csi.storage.k8s.io/pvc/namespace": "team"}})
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
	claim := volume.ObjectRef{Kind: "PersistentVolumeClaim", Namespace: "team", Name: "work"}
	waitFor(t, "the refused upload to be reported on the claim", func() bool {
		return events.has(claim, true, volume.ReasonOutputUploadFailed, "attempt", "the data is kept")
	})
	proxy.SetFaults(nil)
	waitFor(t, "the claim's outputs to be uploaded", func() bool { return env.driver.volumes.WriteBackHolds(id) == "" })
	checkOutputs(t, s, "claim/", want)
	// A repeated NodeUnstageVolume (kubelet retrying one whose answer it lost) succeeds and
	// uploads nothing again.
	var writes atomic.Int64
	proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodPut || r.Method == http.MethodPost {
			writes.Add(1)
		}
		return testpeers.None
	})
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("a repeated NodeUnstageVolume: %v", err)
	}
	if holds := env.driver.volumes.WriteBackHolds(id); holds != "" {
		t.Errorf("a repeated NodeUnstageVolume started another upload: %s", holds)
	}
	if n := writes.Load(); n != 0 {
		t.Errorf("%d writes to the target after the upload had finished, want 0", n)
	}

	// Staged and written again: the next upload sends what changed since the last one, not
	// ckpt.bin again.
	if err := stage(owner); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap("")}); err != nil {
		t.Fatal(err)
	}
	again := map[string][]byte{"out/eval.csv": []byte("a,b\n1,2\n3,4\n"), "notes.txt": []byte("second run\n")}
	writeOutputs(t, target, again)
	var sent atomic.Int64
	proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodPut {
			sent.Add(bodyLength(r))
		}
		return testpeers.None
	})
	env.unpublishAndUnstage(id)
	waitFor(t, "the second upload", func() bool { return env.driver.volumes.WriteBackHolds(id) == "" })
	maps.Copy(want, again)
	checkOutputs(t, s, "claim/", want)
	if got, changed := sent.Load(), int64(len(again["out/eval.csv"])+len(again["notes.txt"])); got != changed {
		t.Errorf("the second upload sent %d bytes, want the %d changed since the first", got, changed)
	}

	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	events.want(t, claim, true, volume.ReasonOutputTargetRefused, "may not write its outputTarget s3://out/claim/")
	events.want(t, claim, false, volume.ReasonOutputUploadFinished, "2 objects")
	if _, err := os.Stat(filepath.Join(env.dir, "writeback", "journals", id)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the deleted claim's write-back journal: %v, want it gone", err)
	}
}

// TestWriteBackClaimLegacy writes through a claim whose output target answers as an S3 server
// without flexible checksums (the test proxy's legacy mode on the output bucket: Ceph RGW 16):
// the upload completes in one pass, confirmed by MD5 ETags, and the claim's next upload, one file
// changed, sends only that file.
func TestWriteBackClaimLegacy(t *testing.T) {
	env, s, proxy, events := writeBackEnv(t)
	var sent atomic.Int64
	proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
		if !strings.HasPrefix(r.URL.Path, "/out") {
			return testpeers.None
		}
		if r.Method == http.MethodPut {
			sent.Add(bodyLength(r))
		}
		return testpeers.Fault{Legacy: true, ResetAfter: -1}
	})
	ctx := context.Background()
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	vol, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "claim", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Secrets: owner,
		Parameters: map[string]string{"source": "s3://shared/set", "endpoint": proxy.URL, "pathStyle": "true", "pool": "fast", "outputTarget": "s3://out/claim",
			"csi.storage.k8s.io/pvc/name": "work", "csi.storage.k8s.io/pvc/namespace": "team"}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.Volume.VolumeId
	staging, target := filepath.Join(env.dir, "staging", id), filepath.Join(env.dir, "target", id)
	write := func(files map[string][]byte) {
		t.Helper()
		if err := retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				VolumeCapability: mountCap(""), VolumeContext: vol.Volume.VolumeContext, Secrets: owner})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: mountCap("")}); err != nil {
			t.Fatal(err)
		}
		writeOutputs(t, target, files)
		sent.Store(0)
		env.unpublishAndUnstage(id)
		waitFor(t, "the claim's outputs to be uploaded", func() bool { return env.driver.volumes.WriteBackHolds(id) == "" })
	}
	want := map[string][]byte{"out/eval.csv": []byte("a,b\n1,2\n"), "ckpt.bin": randomBytes(t, 12<<20+7)}
	write(want)
	checkOutputs(t, s, "claim/", want)
	claim := volume.ObjectRef{Kind: "PersistentVolumeClaim", Namespace: "team", Name: "work"}
	if events.has(claim, true, volume.ReasonOutputUploadFailed) {
		t.Error("an upload pass failed against the legacy server")
	}
	again := map[string][]byte{"out/eval.csv": []byte("a,b\n1,2\n3,4\n")}
	write(again)
	maps.Copy(want, again)
	checkOutputs(t, s, "claim/", want)
	if got := sent.Load(); got != int64(len(again["out/eval.csv"])) {
		t.Errorf("the second upload sent %d bytes, want only the changed file's %d (the probe's empty object aside)", got, len(again["out/eval.csv"]))
	}
	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}

// bodyLength is the size of what a request sends: its payload's, without the aws-chunked
// framing of a streamed checksum.
func bodyLength(r *http.Request) int64 {
	if d := r.Header.Get("X-Amz-Decoded-Content-Length"); d != "" {
		n, _ := strconv.ParseInt(d, 10, 64)
		return n
	}
	return max(r.ContentLength, 0)
}

// TestWriteBackDeletions publishes writable inline volumes whose target mirrors the dataset,
// deletes a dataset file and renames another through each: with outputDeletions the upload
// deletes the old paths at the target too, without (the default) the target keeps them; the
// renamed file is uploaded at its new path either way. A bad value is refused before anything
// is made.
func TestWriteBackDeletions(t *testing.T) {
	env, s, proxy, _ := writeBackEnv(t)
	ctx := context.Background()
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	dataset := map[string][]byte{}
	for i := range 4 {
		dataset[fmt.Sprintf("f%d", i)] = bytes.Repeat([]byte{byte('a' + i)}, 100<<10)
	}
	publish := func(id string, attrs map[string]string) (string, error) {
		vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
			"pathStyle": "true", "size": "64Mi"}
		for k, v := range attrs {
			vc[k] = v
		}
		target := filepath.Join(env.dir, "target", id)
		return target, retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
				VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: owner})
			return err
		})
	}
	t.Run("failure case - outputDeletions not a boolean", func(t *testing.T) {
		_, err := publish("wb-bad", map[string]string{"outputTarget": "s3://out/bad", "outputDeletions": "yes"})
		wantCode(t, err, codes.InvalidArgument, "outputDeletions")
		if _, ok := env.driver.volumes.Store().GetVolume("wb-bad"); ok {
			t.Error("the refused volume was created")
		}
	})
	for _, tc := range []struct {
		name, deletions string
		keeps           bool
	}{{"deletions asked", "true", false}, {"deletions by default off", "", true}} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "sync-" + tc.deletions + "/"
			for p, b := range dataset {
				s.Put(t, "out", prefix+p, b)
			}
			attrs := map[string]string{"outputTarget": "s3://out/" + prefix}
			if tc.deletions != "" {
				attrs["outputDeletions"] = tc.deletions
			}
			id := "wb-del-" + tc.deletions
			target, err := publish(id, attrs)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(target, "f1")); err != nil {
				t.Fatal(err)
			}
			// A rename keeps the dataset's bytes in the lower layer (metacopy): uploaded from there.
			if err := os.Rename(filepath.Join(target, "f3"), filepath.Join(target, "f3-renamed")); err != nil {
				t.Fatal(err)
			}
			writeOutputs(t, target, map[string][]byte{"f2": []byte("changed")})
			if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the volume to be uploaded and deleted", func() bool {
				_, ok := env.driver.volumes.Store().GetVolume(id)
				return !ok
			})
			want := map[string][]byte{"f0": dataset["f0"], "f2": []byte("changed"), "f3-renamed": dataset["f3"]}
			if tc.keeps {
				want["f1"], want["f3"] = dataset["f1"], dataset["f3"]
			}
			checkOutputs(t, s, prefix, want)
		})
	}
}

// TestWriteBackStaticPV stages an administrator's static PV of an S3 dataset that names an
// output target with the pod's name, and publishes a writable per-pod copy: what the pod wrote is
// uploaded under its name once it lets the copy go, and the copy is then deleted. A static PV
// without a capacity (read-only publications only) is refused at stage, and a pod whose
// credentials may not write the target at publish.
func TestWriteBackStaticPV(t *testing.T) {
	env, s, proxy, events := writeBackEnv(t)
	ctx := context.Background()
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	rwx := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
	}
	vc := map[string]string{"source": "s3://shared/set", "endpoint": proxy.URL, "pathStyle": "true",
		"capacity": "64Mi", "outputTarget": "s3://out/static/${pod.name}"}
	stage := func(id string, vc map[string]string) (string, error) {
		staging := filepath.Join(env.dir, "staging", id)
		return staging, retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				VolumeCapability: rwx, VolumeContext: vc, Secrets: owner})
			return err
		})
	}
	t.Run("failure case - an output target without capacity", func(t *testing.T) {
		noCap := map[string]string{"source": "s3://shared/set", "endpoint": proxy.URL, "pathStyle": "true", "outputTarget": "s3://out/static"}
		_, err := stage("results-nocap", noCap)
		wantCode(t, err, codes.InvalidArgument, "no capacity")
	})
	id := "results"
	staging, err := stage(id, vc)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(pod string, secrets map[string]string) (string, error) {
		target := filepath.Join(env.dir, "target", pod)
		pc := map[string]string{"csi.storage.k8s.io/pod.name": pod, "csi.storage.k8s.io/pod.namespace": "team", "csi.storage.k8s.io/pod.uid": "uid-" + pod}
		for k, v := range vc {
			pc[k] = v
		}
		return target, retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				TargetPath: target, VolumeCapability: rwx, VolumeContext: pc, Secrets: secrets})
			return err
		})
	}
	t.Run("failure case - a pod that may not write the target", func(t *testing.T) {
		target, err := publish("intruder", nil)
		wantCode(t, err, codes.PermissionDenied, "outputTarget s3://out/static/intruder/")
		if mounted(t, target) {
			t.Error("the refused copy is mounted")
		}
	})
	target, err := publish("train-0", owner)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"result.json": []byte(`{"acc":0.9}`), "f0": []byte("rewritten")}
	writeOutputs(t, target, want)
	// The pool report (what a VolumeManager waits on) lists the copy under the PV's handle: in
	// use, then uploading and failing while the target refuses, then nothing once uploaded.
	if o := poolOutputs(t, env)[id]; o == nil || o.GetInUse() != 1 || o.GetUploading() != 0 {
		t.Errorf("pool report while published: %v", o)
	}
	gen, _, _, changed := env.driver.poolGeneration()
	proxy.SetFaults(refuseWrites)
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(time.Minute):
		t.Fatal("the hand-off did not move the pool generation")
	}
	waitFor(t, "the pool report to say the upload fails", func() bool {
		o := poolOutputs(t, env)[id]
		return o != nil && o.GetInUse() == 0 && o.GetUploading() == 1 && o.GetFailing() == 1 && o.GetBytesPending() > 0
	})
	if g, _, _, _ := env.driver.poolGeneration(); g <= gen {
		t.Errorf("pool generation %d, was %d", g, gen)
	}
	proxy.SetFaults(nil)
	waitFor(t, "the copy to be uploaded and deleted", func() bool { return len(env.driver.volumes.Store().ListVolumes()) == 0 })
	checkOutputs(t, s, "static/train-0/", want)
	if o := poolOutputs(t, env); len(o) != 0 {
		t.Errorf("pool report once uploaded: %v", o)
	}
	events.want(t, volume.ObjectRef{Kind: "Pod", Namespace: "team", Name: "train-0", UID: "uid-train-0"}, false, volume.ReasonOutputUploadFinished, "2 objects")
	events.want(t, volume.ObjectRef{Kind: "Pod", Namespace: "team", Name: "intruder", UID: "uid-intruder"}, true, volume.ReasonOutputTargetRefused, "s3://out/static/intruder/")
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}

// TestWriteBackCheckpoints publishes a writable inline volume with an output interval: what the
// pod wrote reaches the target while it runs (a checkpoint), also after the node plugin restarts,
// what it changed after reaches it by a later checkpoint or at unpublish, and no file is sent
// twice for the same content. An interval below the node's minimum is refused.
func TestWriteBackCheckpoints(t *testing.T) {
	env, s, proxy, _ := writeBackEnv(t)
	ctx := context.Background()
	var (
		mu   sync.Mutex
		puts = map[string]int{} // PutObject and UploadPart requests, by key
	)
	proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodPut {
			mu.Lock()
			puts[strings.TrimPrefix(r.URL.Path, "/out/ckpt/")]++
			mu.Unlock()
		}
		return testpeers.None
	})
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
		"pathStyle": "true", "size": "64Mi", "outputTarget": "s3://out/ckpt", "outputInterval": "200ms"}
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	publish := func(id string, vc map[string]string) (string, error) {
		target := filepath.Join(env.dir, "target", id)
		return target, retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
				VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: owner})
			return err
		})
	}
	t.Run("failure case - an interval below the node's minimum", func(t *testing.T) {
		short := map[string]string{"outputInterval": "10ms"}
		for k, v := range vc {
			if _, ok := short[k]; !ok {
				short[k] = v
			}
		}
		_, err := publish("wb-short", short)
		wantCode(t, err, codes.InvalidArgument, "--writeback-min-interval")
	})
	id := "wb-ckpt"
	target, err := publish(id, vc)
	if err != nil {
		t.Fatal(err)
	}
	first := map[string][]byte{"model.bin": randomBytes(t, 11<<20), "step.txt": []byte("1")}
	writeOutputs(t, target, first)
	waitFor(t, "a checkpoint to upload the first outputs", func() bool {
		got := objectsAt(t, s, "ckpt/")
		return string(got["step.txt"]) == "1" && len(got["model.bin"]) == 11<<20
	})
	// The node plugin is upgraded while the pod runs: the volume is still in use, not a final
	// upload to resume, and its checkpoints go on.
	env.restart()
	writeOutputs(t, target, map[string][]byte{"step.txt": []byte("2")})
	waitFor(t, "a checkpoint after the restart", func() bool { return string(objectsAt(t, s, "ckpt/")["step.txt"]) == "2" })
	if _, ok := env.driver.volumes.Store().GetVolume(id); !ok {
		t.Fatal("the volume in use was taken for one to upload and delete")
	}
	// The pod goes on: a changed file and a new one, then it ends.
	writeOutputs(t, target, map[string][]byte{"step.txt": []byte("3"), "eval.json": []byte(`{"acc":1}`)})
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the final upload and the volume's deletion", func() bool {
		_, ok := env.driver.volumes.Store().GetVolume(id)
		return !ok
	})
	checkOutputs(t, s, "ckpt/", map[string][]byte{"model.bin": first["model.bin"], "step.txt": []byte("3"), "eval.json": []byte(`{"acc":1}`)})
	mu.Lock()
	defer mu.Unlock()
	// model.bin: three parts of 5 MiB, once; step.txt: once per content; eval.json once.
	if puts["model.bin"] != 3 || puts["step.txt"] != 3 || puts["eval.json"] != 1 {
		t.Errorf("requests by key %v: want model.bin's 3 parts once, step.txt three times, eval.json once", puts)
	}
	if n := writeBackMetric(t, env, "cistern_writeback_checkpoints_total"); n < 1 {
		t.Errorf("cistern_writeback_checkpoints_total = %v", n)
	}
}

// TestCheckpointsUnconfirmed: a volume in use whose target answers PUTs with an ETag that is
// not the body's MD5, and no checksum (an SSE-KMS bucket), stops its checkpoints after the
// first one, as the final upload stops: the same bytes sent again would not be confirmed either.
// The final upload tries once more and keeps the data.
func TestCheckpointsUnconfirmed(t *testing.T) {
	env, s, proxy, events := writeBackEnv(t)
	ctx := context.Background()
	var puts atomic.Int32
	proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/out/") {
			if r.URL.Path == "/out/kms/step.txt" { // not the write probe at publish
				puts.Add(1)
			}
			return testpeers.Fault{ResetAfter: -1, StripChecksums: true, ETag: `"a1b2c3d4e5f60718293a4b5c6d7e8f90"`, Name: "kms-etag"}
		}
		return testpeers.None
	})
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
		"pathStyle": "true", "size": "64Mi", "outputTarget": "s3://out/kms", "outputInterval": "200ms",
		"csi.storage.k8s.io/pod.name": "train-0", "csi.storage.k8s.io/pod.namespace": "team"}
	id, target := "wb-kms", filepath.Join(env.dir, "target", "wb-kms")
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
			VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	writeOutputs(t, target, map[string][]byte{"step.txt": []byte("1")})
	waitFor(t, "the checkpoints to stop", func() bool {
		return events.hasAny(volume.ReasonOutputUploadUnconfirmed, "Checkpoints of volume wb-kms", "stopped")
	})
	taken := writeBackMetric(t, env, "cistern_writeback_checkpoints_total")
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the final upload to stop unconfirmed", func() bool {
		return events.hasAny(volume.ReasonOutputUploadUnconfirmed, "Upload of volume wb-kms", "not retried")
	})
	if n := puts.Load(); n != 2 || proxy.Delivered("kms-etag") < 2 {
		t.Errorf("%d PUTs of step.txt (%d answered with the ETag), want 2: the one checkpoint and the final upload", n, proxy.Delivered("kms-etag"))
	}
	if n := writeBackMetric(t, env, "cistern_writeback_checkpoints_total"); n != taken {
		t.Errorf("cistern_writeback_checkpoints_total went from %v to %v after the checkpoints stopped", taken, n)
	}
	if _, ok := env.driver.volumes.Store().GetVolume(id); !ok {
		t.Error("the volume's data was deleted with its outputs unconfirmed")
	}
}

// objectsAt reads the objects under prefix of "out": key (without prefix) -> bytes.
func objectsAt(t *testing.T, s *testpeers.S3, prefix string) map[string][]byte {
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
	return got
}

// TestWriteBackNeedsLayers: a volume naming an output target is refused where its writable copy
// could not tell what the pod changed: a node that copies writable datasets, or one that cannot
// mount the overlay; never copied and then deleted with its outputs.
func TestWriteBackNeedsLayers(t *testing.T) {
	env, s, proxy, _ := writeBackEnv(t)
	ctx := context.Background()
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
		"pathStyle": "true", "size": "64Mi", "outputTarget": "s3://out/x"}
	publish := func(id string) error {
		return retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(env.dir, "target", id),
				VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}})
			return err
		})
	}
	env.stop()
	env.cfg.Writable.OverlayMount = func(string, string) error { return errors.New("overlayfs: not supported") }
	env.start()
	wantCode(t, publish("wb-nooverlay"), codes.FailedPrecondition, "cannot be layered")
	env.stop()
	env.cfg.Writable.OverlayMount, env.cfg.Writable.Copy = nil, true
	env.start()
	wantCode(t, publish("wb-copy"), codes.InvalidArgument, "--writable-datasets=copy")
}

// TestWriteBackNFS publishes a writable inline volume of an S3 dataset whose output target is a
// directory of an NFS server the administrator allows (go-nfs, and nfs-ganesha, which enforces
// the node's AUTH_SYS identity: uid 1000 here, the exports' owner): what the pod wrote is there,
// file for file, once it lets the volume go, in a directory named after the pod below its
// namespace's directory of the export. A pod of another namespace naming that very directory
// writes below its own namespace's, leaving the first one's files as they were: every tenant
// writes as the node's one NFS identity. A server not allowed is refused before the pod starts,
// and so is a directory the identity may not write (ganesha: a root-owned one).
func TestWriteBackNFS(t *testing.T) {
	env, s, proxy, events := writeBackEnv(t)
	ctx := context.Background()
	const identity = 1000
	id32 := uint32(identity)
	env.cfg.Datasets.NFSUID, env.cfg.Datasets.NFSGID = &id32, &id32
	env.cfg.Writable.WriteBack.Uploader.NFSUID, env.cfg.Writable.WriteBack.Uploader.NFSGID = identity, identity
	// Each export and its team/ are the identity's; team/locked is root's (mode 0755).
	exports := startNFSServers(t, env, func(dir string) {
		if err := os.MkdirAll(filepath.Join(dir, "team", "locked"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{dir, filepath.Join(dir, "team")} {
			if err := os.Chown(d, identity, identity); err != nil {
				t.Fatal(err)
			}
		}
	})
	publish := func(id, target string) (string, error) {
		ns := "team"
		if strings.Contains(id, "intruder") {
			ns = "intruder"
		}
		vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
			"pathStyle": "true", "size": "64Mi", "outputTarget": target,
			"csi.storage.k8s.io/pod.namespace": ns, "csi.storage.k8s.io/pod.name": "train-0", "csi.storage.k8s.io/pod.uid": "uid-1"}
		path := filepath.Join(env.dir, "target", id)
		return path, retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: path,
				VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}})
			return err
		})
	}
	t.Run("failure case - an NFS server not allowed", func(t *testing.T) {
		_, err := publish("wb-nfs-other", "nfs://127.0.0.1:1/export/x")
		wantCode(t, err, codes.PermissionDenied, "--nfs-servers")
	})
	writeBack := func(t *testing.T, id, target string) {
		t.Helper()
		if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the volume to be written back and deleted", func() bool {
			_, ok := env.driver.volumes.Store().GetVolume(id)
			return !ok
		})
	}
	for _, srv := range exports {
		t.Run(srv.name, func(t *testing.T) {
			id := "wb-nfs-" + srv.name
			target, err := publish(id, srv.URL("runs/${pod.name}"))
			if err != nil {
				t.Fatal(err)
			}
			want := map[string][]byte{"ckpt/model.bin": randomBytes(t, 9<<20+1), "f1": []byte("changed")}
			writeOutputs(t, target, want)
			writeBack(t, id, target)
			filesAt(t, filepath.Join(srv.dir, "team", "runs", "train-0"), want)
			events.want(t, volume.ObjectRef{Kind: "Pod", Namespace: "team", Name: "train-0", UID: "uid-1"}, false, volume.ReasonOutputUploadFinished,
				srv.URL("runs/train-0")+"/ (in namespace team's directory of the export)", "2 objects")

			// A pod of another namespace names the first one's directory: its outputs go below its own.
			other, err := publish("wb-nfs-intruder-"+srv.name, srv.URL("team/runs/train-0"))
			if err != nil {
				t.Fatal(err)
			}
			overwrite := map[string][]byte{"f1": []byte("overwritten by another namespace")}
			writeOutputs(t, other, overwrite)
			writeBack(t, "wb-nfs-intruder-"+srv.name, other)
			filesAt(t, filepath.Join(srv.dir, "team", "runs", "train-0"), want)
			filesAt(t, filepath.Join(srv.dir, "intruder", "team", "runs", "train-0"), overwrite)
		})
	}
	// go-nfs lets every identity write everywhere; ganesha refuses uid 1000 a root-owned directory.
	t.Run("failure case - ganesha: a directory the identity may not write", func(t *testing.T) {
		srv := exports[len(exports)-1]
		id := "wb-nfs-denied"
		_, err := publish(id, srv.URL("locked/${pod.name}"))
		wantCode(t, err, codes.PermissionDenied, "access denied to AUTH_SYS uid 1000 gid 1000")
		if _, ok := env.driver.volumes.Store().GetVolume(id); ok {
			t.Error("the refused volume was kept")
		}
		if ents, err := os.ReadDir(filepath.Join(srv.dir, "team", "locked")); err != nil || len(ents) != 0 {
			t.Errorf("the refused probe left %v in the locked directory (%v)", ents, err)
		}
	})
}

// filesAt fails unless dir holds exactly the files of want.
func filesAt(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	got := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		if w, ok := want[filepath.ToSlash(rel)]; !ok || !bytes.Equal(b, w) {
			t.Errorf("%s in %s: %d bytes, not what its pod wrote", rel, dir, len(b))
		}
		got++
		return err
	})
	if err != nil || got != len(want) {
		t.Errorf("%d files in %s (%v), want %d", got, dir, err, len(want))
	}
}
