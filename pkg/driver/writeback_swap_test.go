package driver

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestWriteBackCheckpointSwaps: a pod whose volume names an output interval swaps two of its
// files, once a checkpoint listed them, for a symlink to a root-only file of the node and for a
// device node of another volume's loop device. The node plugin (root, through the CSI socket)
// sends neither: not by that checkpoint, not by later ones, not by the final upload at
// unpublish, which sends only the pod's regular file, through a mount aside that is
// nodev,nosuid,noexec.
func TestWriteBackCheckpointSwaps(t *testing.T) {
	env, s, proxy, _ := writeBackEnv(t)
	ctx := context.Background()
	const size = 64 << 10
	key := secretBytes(t, size)
	nodeKey := filepath.Join(env.dir, "node-key")
	if err := os.WriteFile(nodeKey, key, 0o600); err != nil {
		t.Fatal(err)
	}
	other, otherDev := loopDeviceOf(t, env.dir, size)

	id := "wb-swap"
	target := filepath.Join(env.dir, "target", id)
	var (
		step    atomic.Int32 // 0: before the first checkpoint; 1: files written; 2: swapped
		held    = make(chan struct{})
		release = make(chan struct{})
		once    sync.Once
	)
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	env.stop()
	env.cfg.Writable.WriteBack.OnProgress = func(p writeback.Progress) {
		switch {
		case p.Volume != id:
		case step.CompareAndSwap(0, 1):
			// The first checkpoint (of an empty volume) waits while the pod writes its files:
			// the next one lists the three of them at once.
			close(held)
			<-release
		case p.Files == 3 && p.FilesDone == 0 && p.Err == nil && step.CompareAndSwap(1, 2):
			for _, err := range []error{
				os.Remove(filepath.Join(target, "a.txt")), os.Symlink(nodeKey, filepath.Join(target, "a.txt")),
				os.Remove(filepath.Join(target, "dev.bin")),
				unix.Mknod(filepath.Join(target, "dev.bin"), unix.S_IFBLK|0o600, int(otherDev)),
			} {
				if err != nil {
					t.Errorf("the pod's swap: %v", err)
				}
			}
		}
	}
	env.start()
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
		"pathStyle": "true", "size": "64Mi", "outputTarget": "s3://out/swap", "outputInterval": "200ms"}
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
			VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("no checkpoint started")
	}
	kept := randomBytes(t, size)
	writeOutputs(t, target, map[string][]byte{"a.txt": randomBytes(t, size), "dev.bin": randomBytes(t, size), "keep.txt": kept})
	ago := time.Now().Add(-time.Minute)
	for _, p := range []string{"a.txt", "dev.bin", "keep.txt"} {
		if err := os.Chtimes(filepath.Join(target, p), ago, ago); err != nil {
			t.Fatal(err)
		}
	}
	once.Do(func() { close(release) })
	waitFor(t, "a checkpoint to upload keep.txt", func() bool { return bytes.Equal(objectsAt(t, s, "swap/")["keep.txt"], kept) })
	if step.Load() != 2 {
		t.Fatal("no checkpoint listed the three files before it sent any")
	}
	before := writeBackMetric(t, env, "cistern_writeback_checkpoints_total")
	waitFor(t, "two more checkpoints", func() bool { return writeBackMetric(t, env, "cistern_writeback_checkpoints_total") >= before+2 })
	noNodeBytes(t, objectsAt(t, s, "swap/"), key, other)

	proxy.SetFaults(refuseWrites) // the final upload waits: its mount aside is looked at
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	aside := filepath.Join(env.cfg.Writable.WriteBack.Dir, "mnt", id)
	if opts := mountOptions(t, aside); len(opts) != 1 || !hasOptions(opts[0], "ro", "nodev", "nosuid", "noexec") {
		t.Errorf("the volume's filesystem is mounted aside with %q, want ro,nodev,nosuid,noexec", opts)
	}
	proxy.SetFaults(nil)
	waitFor(t, "the final upload and the volume's deletion", func() bool {
		_, ok := env.driver.volumes.Store().GetVolume(id)
		return !ok
	})
	got := objectsAt(t, s, "swap/")
	noNodeBytes(t, got, key, other)
	checkOutputs(t, s, "swap/", map[string][]byte{"keep.txt": kept})
}

// loopDeviceOf attaches a file of size bytes (another volume's image, as the pod would find one)
// to a loop device until the test ends; it returns the file's bytes and the device's number.
func loopDeviceOf(t *testing.T, dir string, size int) ([]byte, uint64) {
	t.Helper()
	data := secretBytes(t, size)
	img := filepath.Join(dir, "other-volume.img")
	if err := os.WriteFile(img, data, 0o600); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(testutil.Run(t, "losetup", "--find", "--show", img))
	t.Cleanup(func() { _, _ = testutil.RunAllowFail("losetup", "-d", dev) })
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	return data, st.Rdev
}

// secretBytes are n random bytes, found nowhere else.
func secretBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// noNodeBytes fails if an object holds the node's key or the other volume's bytes.
func noNodeBytes(t *testing.T, got map[string][]byte, key, other []byte) {
	t.Helper()
	for k, b := range got {
		if bytes.Contains(b, key[:4096]) {
			t.Errorf("%s: the target holds the node's root-only key", k)
		}
		if bytes.Contains(b, other[:4096]) {
			t.Errorf("%s: the target holds another volume's loop device bytes", k)
		}
	}
}

// hasOptions reports whether a mount's comma-separated options hold every one of want.
func hasOptions(opts string, want ...string) bool {
	have := map[string]bool{}
	for _, o := range strings.Split(opts, ",") {
		have[o] = true
	}
	for _, w := range want {
		if !have[w] {
			return false
		}
	}
	return true
}
