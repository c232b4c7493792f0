package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

// TestVolumesNodevNosuid: a pod that makes a device node in its volume (a plain volume, staged
// and published; a writable dataset volume, its overlay) cannot open it as a device (EACCES),
// and set-user-ID bits do not count there: every mount of the volume, its staging path, a
// read-only publication, is nodev,nosuid. A raw block volume is still a device. With
// --volume-dev-suid the device node opens.
func TestVolumesNodevNosuid(t *testing.T) {
	env, s, proxy, _ := writeBackEnv(t)
	ctx := context.Background()
	nullDev := int(unix.Mkdev(1, 3)) // /dev/null's numbers
	mknodOpen := func(t *testing.T, dir string) error {
		t.Helper()
		p := filepath.Join(dir, "null")
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, nullDev); err != nil {
			t.Fatalf("mknod in the volume: %v", err) // nodev forbids opening, not making
		}
		f, err := os.Open(p)
		if err == nil {
			f.Close()
		}
		return err
	}
	secure := func(t *testing.T, p string, extra ...string) {
		t.Helper()
		opts := mountOptions(t, p)
		if len(opts) == 0 {
			t.Fatalf("%s is not mounted", p)
		}
		for _, o := range opts {
			if !hasOptions(o, append([]string{"nodev", "nosuid"}, extra...)...) {
				t.Errorf("%s is mounted with %q, want nodev,nosuid %v", p, o, extra)
			}
		}
	}

	t.Run("plain volume", func(t *testing.T) {
		id := env.create("plain", 32*mb, nil).GetVolumeId()
		target := env.stageAndPublish(id, mountCap(""))
		if err := mknodOpen(t, target); !errors.Is(err, unix.EACCES) {
			t.Errorf("opening a device node in the volume: %v, want EACCES", err)
		}
		secure(t, target)
		secure(t, filepath.Join(env.dir, "staging", id))
		ro := filepath.Join(env.dir, "ro-target")
		if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(env.dir, "staging", id),
			TargetPath: ro, VolumeCapability: mountCap(""), Readonly: true}); err != nil {
			t.Fatal(err)
		}
		secure(t, ro, "ro")
	})

	t.Run("writable dataset volume", func(t *testing.T) {
		target := filepath.Join(env.dir, "target", "layered")
		vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": proxy.URL,
			"pathStyle": "true", "size": "64Mi"}
		if err := retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "layered", TargetPath: target,
				VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if !isOverlayMount(t, target) {
			t.Fatal("the writable dataset volume is not layered")
		}
		if err := mknodOpen(t, target); !errors.Is(err, unix.EACCES) {
			t.Errorf("opening a device node in the overlay: %v, want EACCES", err)
		}
		secure(t, target)
	})

	t.Run("block volume", func(t *testing.T) {
		resp, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "blk",
			CapacityRange: &csi.CapacityRange{RequiredBytes: 8 * mb}, VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
		if err != nil {
			t.Fatal(err)
		}
		target := env.stageAndPublish(resp.GetVolume().GetVolumeId(), blockCap())
		f, err := os.Open(target)
		if err != nil {
			t.Fatalf("opening the raw block volume: %v", err)
		}
		f.Close()
	})

	t.Run("--volume-dev-suid", func(t *testing.T) {
		env.stop()
		env.cfg.VolumeDevSuid = true
		env.start()
		id := env.create("devsuid", 32*mb, nil).GetVolumeId()
		target := env.stageAndPublish(id, mountCap(""))
		if err := mknodOpen(t, target); err != nil {
			t.Errorf("opening a device node in a volume of a node with --volume-dev-suid: %v", err)
		}
		if opts := mountOptions(t, target); len(opts) != 1 || hasOptions(opts[0], "nodev") || hasOptions(opts[0], "nosuid") {
			t.Errorf("the volume is mounted with %q, want neither nodev nor nosuid", opts)
		}
	})
}
