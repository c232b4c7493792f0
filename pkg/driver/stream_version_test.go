package driver

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestStreamingTakeoverKeepsItsVersion (issue 37, item 2): a static PV streamed (through the
// CSI socket, a real FUSE mount, the FUSE keeper) whose dataset is then staged; the node plugin
// restarts and takes the volume over. Then every object is rewritten in S3 with other bytes of
// the same size, and a second volume of the dataset gets that new version, staged in the
// dataset's directory (the first version moved aside). The first volume's files read after all
// that, which it never opened before, are the version its caller proved: the new process serves
// the directory the volume references, held by descriptor, checked against the manifest the
// kernel was shown. Before, it served the files at the dataset's path, the new version's.
func TestStreamingTakeoverKeepsItsVersion(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.Unavailable(t, "streaming volumes need root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testutil.Unavailable(t, "streaming volumes need /dev/fuse: %v", err)
	}
	env := startDriver(t, testPool{name: "fast"})
	k, err := fusekeeper.Listen(filepath.Join(env.dir, "keeper.sock"))
	if err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Serve(kctx) }()
	t.Cleanup(func() { cancel(); <-done })
	env.stop()
	env.cfg.Datasets.BandwidthBytesPerSec = 1 << 20 // the 3 MiB set takes 3 s: the first volume streams
	env.cfg.Streaming.Keeper = k.Path()
	env.start()

	s := testpeers.StartS3(t, "")
	s.Bucket(t, "models")
	edition := func(n uint64) map[string][]byte {
		files := map[string][]byte{"weights.bin": seeded(n, 3<<20)}
		for i := range 8 {
			files[fmt.Sprintf("shard-%d.txt", i)] = seeded(n*100+uint64(i), 1000+i)
		}
		return files
	}
	first, second := edition(1), edition(2)
	for key, v := range first {
		s.Put(t, "models", key, v)
	}
	secrets := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	vc := map[string]string{"source": "s3://models", "endpoint": s.Endpoint, "pathStyle": "true", "dataMode": "streaming"}
	parsed, err := volume.ParseParams(vc, cparams.StaticPV)
	if err != nil {
		t.Fatal(err)
	}
	spec := datasource.SpecOf(parsed.Dataset)
	ctx := context.Background()
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	stageAndPublish := func(id string) string {
		t.Helper()
		staging, target := filepath.Join(env.dir, "staging", id), filepath.Join(env.dir, "target", id)
		if err := retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, VolumeCapability: roMany,
				StagingTargetPath: staging, VolumeContext: vc, Secrets: secrets})
			return err
		}); err != nil {
			t.Fatalf("NodeStageVolume %s: %v", id, err)
		}
		if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: roMany, VolumeContext: vc, Readonly: true}); err != nil {
			t.Fatalf("NodePublishVolume %s: %v", id, err)
		}
		return target
	}
	staged := func() {
		t.Helper()
		waitFor(t, "the dataset staged", func() bool { st, _, _ := env.driver.cache.Status("fast", spec); return st.Ready() })
	}
	read := func(target, key string, want map[string][]byte) bool {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(target, key))
		if err != nil || !bytes.Equal(got, want[key]) {
			t.Errorf("%s in %s: %d bytes, err %v; want the %d bytes of its version (the other's: %v)",
				key, filepath.Base(target), len(got), err, len(want[key]), bytes.Equal(got, second[key]))
			return false
		}
		return true
	}

	a := stageAndPublish("pv-a")
	if typ := mountType(t, filepath.Join(env.dir, "staging", "pv-a")); typ != "fuse.cistern-stream" {
		t.Fatalf("the first volume is a %q mount, want the streaming tree (the staging ended first?)", typ)
	}
	read(a, "shard-0.txt", first)
	staged()
	env.restart()
	if held, err := fusekeeper.List(k.Path()); err != nil || len(held) != 1 {
		t.Fatalf("the keeper holds %v (%v), want the first volume", held, err)
	}

	for key, v := range second {
		s.Put(t, "models", key, v)
	}
	b := stageAndPublish("pv-b")
	staged()
	trees, _ := filepath.Glob(filepath.Join(cache.Dir(env.pools[0].path), "*", cache.TreeDir))
	t.Logf("cached trees after the second volume: %v", trees)
	ok := 0
	for key := range first {
		if key != "shard-0.txt" && read(a, key, first) {
			ok++
		}
	}
	t.Logf("the volume taken over read %d of %d files it had not opened before as its own version", ok, len(first)-1)
	for key := range second {
		read(b, key, second)
	}
	env.unpublishAndUnstage("pv-b")
	env.unpublishAndUnstage("pv-a")
	if left, _ := filepath.Glob(filepath.Join(cache.Dir(env.pools[0].path), "*"+cache.RetiredSep+"*")); len(left) != 0 {
		t.Errorf("retired versions left once no volume uses them: %v", left)
	}
}

// seeded is n pseudo-random bytes of seed.
func seeded(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}
