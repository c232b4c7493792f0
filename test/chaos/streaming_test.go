package chaos

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestChaosWritableStreamingKilled: a claim's writable volume with dataMode streaming (an
// overlay on its streaming tree, pkg/volume/streamlayer.go) outlives a SIGKILL of the driver
// process: the FUSE keeper (here in the test's process) hands the tree's connection to the next
// process, which proves the caller again and serves it. The file read after the kill, never read
// before and not staged yet (the staging throttled to 1 MiB/s), comes byte-identical through the
// overlay from the new process; what was written before reads back, and new writes work.
func TestChaosWritableStreamingKilled(t *testing.T) {
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		testutil.Unavailable(t, "streaming volumes need /dev/fuse: %v", err)
	} else {
		f.Close()
	}
	k, err := fusekeeper.Listen(filepath.Join(t.TempDir(), "keeper.sock"))
	if err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	kdone := make(chan error, 1)
	go func() { kdone <- k.Serve(kctx) }()
	t.Cleanup(func() { cancel(); <-kdone })
	s3 := testpeers.StartS3(t, "")
	s3.Bucket(t, "models")
	files := map[string][]byte{
		"weights.bin":     bytes.Repeat([]byte("0123456789abcdef"), 6<<16), // 6 MiB: staged in about 6 s
		"cfg/config.json": []byte(`{"layers": 32}`),
	}
	for key, b := range files {
		s3.Put(t, "models", key, b)
	}
	n := startNode(t, 1<<30, "--fuse-keeper="+k.Path(), "--staging-bandwidth=1048576")
	ctx := context.Background()
	secrets := map[string]string{"accessKeyID": s3.AccessKey, "secretAccessKey": s3.SecretKey}
	vol, err := n.ctrlC().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "stream-killed", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap()},
		Parameters:         map[string]string{"source": "s3://models", "endpoint": s3.Endpoint, "pathStyle": "true", "dataMode": "streaming"}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	staging, target := filepath.Join(n.dir, "staging", id), filepath.Join(n.dir, "target", id)
	if err := retry(time.Minute, func(ctx context.Context) error {
		_, err := n.nodeC().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: mountCap(), VolumeContext: vol.GetVolume().GetVolumeContext(), Secrets: secrets})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.nodeC().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap(), VolumeContext: vol.GetVolume().GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(target, "cfg", "config.json")); err != nil || !bytes.Equal(got, files["cfg/config.json"]) {
		t.Fatalf("config.json: %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(target, "before"), []byte("written before the kill"), 0o644); err != nil {
		t.Fatal(err)
	}

	n.restart() // SIGKILL, then a new process, which answers once it took the tree over
	killed := time.Now()
	if trees, _ := filepath.Glob(filepath.Join(n.pool, ".cistern-cache", "*", "tree")); len(trees) != 0 {
		t.Fatalf("the dataset was staged before the read after the kill (%v): the test needs it streaming", trees)
	}
	got, err := os.ReadFile(filepath.Join(target, "weights.bin"))
	if err != nil || !bytes.Equal(got, files["weights.bin"]) {
		t.Errorf("weights.bin after the kill: %d bytes, %v; want the %d bytes in S3", len(got), err, len(files["weights.bin"]))
	}
	t.Logf("weights.bin read through the new process in %v", time.Since(killed))
	if b, err := os.ReadFile(filepath.Join(target, "before")); err != nil || string(b) != "written before the kill" {
		t.Errorf("the file written before the kill: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(target, "after"), []byte("x"), 0o644); err != nil {
		t.Errorf("a write after the kill: %v", err)
	}
	if log, _ := os.ReadFile(n.logPath); !strings.Contains(string(log), "Took over a streaming volume") {
		t.Error("the new process did not say it took the streaming tree over")
	}

	if _, err := n.nodeC().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.nodeC().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.ctrlC().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	if held, _ := fusekeeper.List(k.Path()); len(held) != 0 {
		t.Errorf("the keeper still holds %v", held)
	}
	if l := n.leaks(); len(l) > 0 {
		t.Errorf("left behind: %v", l)
	}
}
