package driver

import (
	"context"
	"encoding/json"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	"github.com/cistern-csi/cistern/pkg/streamfs"
)

// TestStreamingNodeBounds: a node serves at most --streaming-max-volumes streaming volumes (2
// here): one more is refused with ResourceExhausted, at publish and at stage, until one goes. The
// keeper holds of each only what the proof reads: a secret's other keys (a MiB of them here)
// are not kept, and a volume whose credentials alone are more than the keeper holds for one is
// refused (InvalidArgument), not kept.
func TestStreamingNodeBounds(t *testing.T) {
	env, params, secrets, keeper := streamingEnv(t)
	env.stop()
	env.cfg.Streaming.MaxVolumes = 2
	env.start()
	ctx := context.Background()
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true"}
	maps.Copy(vc, params)
	delete(vc, "pool")
	publish := func(id string, secrets map[string]string) error {
		return retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(env.dir, "target", id),
				VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: true, Secrets: secrets})
			return err
		})
	}
	unpublish := func(id string) {
		t.Helper()
		if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(env.dir, "target", id)}); err != nil {
			t.Fatal(err)
		}
	}
	streams := func(id string) {
		t.Helper()
		if typ := mountType(t, filepath.Join(env.dir, "target", id)); typ != "fuse."+streamfs.Subtype {
			t.Fatalf("%s is mounted as %q, not streamed (the dataset was staged too soon?)", id, typ)
		}
	}

	// A MiB of keys the proof does not read: published, and not kept.
	padded := maps.Clone(secrets)
	padded["notes"] = strings.Repeat("x", 1<<20)
	for _, id := range []string{"a", "b"} {
		if err := publish(id, padded); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
		streams(id)
	}
	t.Cleanup(func() { unpublish("b") })
	held, err := fusekeeper.Take(keeper.Path())
	if err != nil || len(held) != 2 {
		t.Fatalf("the keeper holds %d, %v; want 2", len(held), err)
	}
	for _, h := range held {
		h.Dev.Close()
		var kept struct{ Secrets map[string]string }
		if err := json.Unmarshal(h.Meta, &kept); err != nil || len(h.Meta) > 2<<10 || len(kept.Secrets) != 2 {
			t.Errorf("the keeper holds %d bytes for %s (%v), secrets %v; want the two keys the proof reads", len(h.Meta), h.ID, err, slices.Sorted(maps.Keys(kept.Secrets)))
		}
	}

	// One more is refused, at publish and at stage, until one goes.
	wantCode(t, publish("c", secrets), codes.ResourceExhausted, "streaming volumes")
	staging := filepath.Join(env.dir, "staging", "pv")
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	pvc := maps.Clone(params)
	delete(pvc, "pool")
	wantCode(t, retryUnavailable(t, func() error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "pv", StagingTargetPath: staging,
			VolumeCapability: roMany, VolumeContext: pvc, Secrets: secrets})
		return err
	}), codes.ResourceExhausted, "streaming volumes")
	unpublish("a")
	if err := publish("c", secrets); err != nil {
		t.Fatalf("publish c after a went: %v", err)
	}
	streams("c")
	unpublish("c")

	// Credentials the keeper cannot hold: refused, and nothing kept.
	huge := maps.Clone(secrets)
	huge["sessionToken"] = strings.Repeat("t", fusekeeper.MaxMeta)
	wantCode(t, publish("d", huge), codes.InvalidArgument, "FUSE keeper")
	if ids, err := fusekeeper.List(keeper.Path()); err != nil || len(ids) != 1 || ids[0] != "b" {
		t.Errorf("the keeper holds %v, %v; want [b]", ids, err)
	}
}
