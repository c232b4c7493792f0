package driver

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestStreamingStaticPV: a static PV with dataMode=streaming is staged as soon as its dataset
// is listed and the caller proved it reads it; its files read byte-identical to S3 while the
// staging still runs (throttled here to 1 MiB/s; reads join the staging's download); a caller without access gets nothing; unstage
// unmounts the FUSE filesystem and drops what it fetched. A read-only inline volume streams too.
func TestStreamingStaticPV(t *testing.T) {
	testutil.RequireFUSE(t)
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	env.cfg.Datasets.BandwidthBytesPerSec = 1 << 20 // staging the 16 MiB set takes 16 s
	env.start()
	ctx := context.Background()
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "models")
	files := map[string][]byte{
		"weights.bin":      bytes.Repeat([]byte("0123456789abcdef"), 1<<20),
		"cfg/config.json":  []byte(`{"layers": 32}`),
		"cfg/tokenizer.md": []byte(strings.Repeat("token ", 1000)),
	}
	for k, v := range files {
		s.Put(t, "models", k, v)
	}
	secrets := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	vc := map[string]string{"source": "s3://models", "endpoint": s.Endpoint, "pathStyle": "true", "dataMode": "streaming"}
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	stage := func(id string, secrets map[string]string) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, VolumeCapability: roMany,
			StagingTargetPath: filepath.Join(env.dir, "staging", id), VolumeContext: vc, Secrets: secrets})
		return err
	}

	start := time.Now()
	if err := retryUnavailable(t, func() error { return stage("llm", secrets) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("staged in %v", time.Since(start))
	wantReady(t, env.driver, map[string]uint64{"stream": 1}) // served before the dataset is staged
	parsed, err := volume.ParseParams(vc, cparams.StaticPV)
	if err != nil {
		t.Fatal(err)
	}
	spec := datasource.SpecOf(parsed.Dataset)
	if st, _, _ := env.driver.cache.Status("fast", spec); st.Ready() {
		t.Fatalf("the dataset was staged before the volume: %v (the test needs a staging under way)", st)
	}
	staging := filepath.Join(env.dir, "staging", "llm")
	target := filepath.Join(env.dir, "target", "llm")
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "llm", StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: roMany, VolumeContext: vc, Readonly: true}); err != nil {
		t.Fatal(err)
	}
	// The small files first: the staging fetches each next (it joins the staging's download),
	// while weights.bin, which takes it 16 s, is not staged yet. A read of weights.bin then
	// waits for the staging's verified copy.
	for _, k := range []string{"cfg/config.json", "cfg/tokenizer.md", "weights.bin"} {
		if k == "weights.bin" {
			if st, _, _ := env.driver.cache.Status("fast", spec); st.Ready() {
				t.Errorf("the staging ended before the reads: %v (they did not overlap it)", st)
			}
		}
		if got, err := os.ReadFile(filepath.Join(target, k)); err != nil || !bytes.Equal(got, files[k]) {
			t.Errorf("%s: %d bytes, err %v; want the %d bytes in S3", k, len(got), err, len(files[k]))
		}
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write to a streaming volume: %v, want EROFS", err)
	}

	// Another caller without credentials proves nothing and gets no mount.
	wantCode(t, retryUnavailable(t, func() error { return stage("intruder", nil) }), codes.PermissionDenied, "")
	if ents, _ := os.ReadDir(filepath.Join(env.dir, "staging", "intruder")); len(ents) != 0 {
		t.Errorf("a caller without access sees %v", ents)
	}

	// A read-only inline volume streams the same way, published straight at its target.
	inline := filepath.Join(env.dir, "target", "inline-llm")
	ivc := map[string]string{"csi.storage.k8s.io/ephemeral": "true"}
	for k, v := range vc {
		ivc[k] = v
	}
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "inline-llm", TargetPath: inline,
			VolumeCapability: mountCap(""), VolumeContext: ivc, Readonly: true, Secrets: secrets})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(inline, "weights.bin")); err != nil || !bytes.Equal(got, files["weights.bin"]) {
		t.Errorf("inline weights.bin: %d bytes, err %v", len(got), err)
	}
	// Staged by now: the inline volume is served the cached tree; the refused intruder is not
	// timed.
	wantReady(t, env.driver, map[string]uint64{"stream": 1, "tree": 1})
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "inline-llm", TargetPath: inline}); err != nil {
		t.Fatal(err)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), " "+inline+" ") {
		t.Errorf("%s is still mounted after unpublish", inline)
	}

	scratch, _ := filepath.Glob(filepath.Join(env.pools[0].path, datasource.CacheDirName, "*", "stream", "*"))
	if len(scratch) != 1 {
		t.Errorf("scratch directories %v, want the volume's", scratch)
	}
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "llm", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "llm", StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), " "+staging+" ") {
		t.Errorf("%s is still mounted after unstage", staging)
	}
	if left, _ := filepath.Glob(filepath.Join(env.pools[0].path, datasource.CacheDirName, "*", "stream", "*")); len(left) != 0 {
		t.Errorf("scratch left after unstage: %v", left)
	}
}

// TestStreamingFallsBackWithoutFUSE: on a node without FUSE a streaming volume is staged
// instead, and the node is told why (an Event in the deployed driver).
func TestStreamingFallsBackWithoutFUSE(t *testing.T) {
	env, src := datasetEnv(t)
	var reasons []string
	env.stop()
	env.cfg.Streaming.FUSEDevice = filepath.Join(env.dir, "no-fuse")
	env.cfg.Streaming.OnFallback = func(id, dataset, reason string) { reasons = append(reasons, id+": "+reason) }
	env.start()
	ctx := context.Background()
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	vc := map[string]string{"source": "file://" + src + "/set", "dataMode": "streaming"}
	staging := filepath.Join(env.dir, "staging", "set")
	target := filepath.Join(env.dir, "target", "set")
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "set", StagingTargetPath: staging,
			VolumeCapability: roMany, VolumeContext: vc})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "set", StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: roMany, VolumeContext: vc, Readonly: true}); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, target, want)
	wantReady(t, env.driver, map[string]uint64{"tree": 1}) // staged, not streamed
	if len(reasons) == 0 || !strings.Contains(reasons[0], "no-fuse") {
		t.Errorf("fallbacks reported: %q, want one naming the missing device", reasons)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, " "+target+" ") && strings.Contains(line, "fuse") {
			t.Errorf("the staged volume is a FUSE mount: %s", line)
		}
	}
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "set", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "set", StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}
