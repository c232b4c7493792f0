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
// here, and as many for the volumes of one namespace, TestStreamingNamespaceShare): one more is
// refused with ResourceExhausted, at publish and at stage, until one goes. The
// keeper holds of each only what the proof reads: a secret's other keys (a MiB of them here)
// are not kept, and a volume whose credentials alone are more than the keeper holds for one is
// refused (InvalidArgument), not kept.
func TestStreamingNodeBounds(t *testing.T) {
	env, params, secrets, keeper := streamingEnv(t)
	env.stop()
	env.cfg.Streaming.MaxVolumes, env.cfg.Streaming.MaxVolumesPerNamespace = 2, 2
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

// TestStreamingNamespaceShare: one namespace serves at most --streaming-max-volumes-per-namespace
// streaming volumes of a node (2 here, of 5): one more is refused with ResourceExhausted, at
// publish and at stage (a PV, and a provisioned writable volume on a streaming tree, count
// under their claim's namespace), while another namespace still gets its own. The count holds across a restart (the volumes taken over count again) and goes
// down when a volume is unpublished. An inline volume's own claim namespace is the pod author's,
// not read: with no pod namespace it counts with the volumes that name none.
func TestStreamingNamespaceShare(t *testing.T) {
	env, params, secrets, keeper := streamingEnv(t)
	env.stop()
	env.cfg.Streaming.MaxVolumes, env.cfg.Streaming.MaxVolumesPerNamespace = 5, 2
	env.cfg.Datasets.BandwidthBytesPerSec = 128 << 10 // staged in 2 minutes: the volumes stream meanwhile
	env.start()
	ctx := context.Background()
	target := func(id string) string { return filepath.Join(env.dir, "target", id) }
	publish := func(id string, pod map[string]string) error {
		vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true"}
		maps.Copy(vc, params)
		delete(vc, "pool")
		maps.Copy(vc, pod)
		return retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target(id),
				VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: true, Secrets: secrets})
			return err
		})
	}
	inNamespace := func(ns string) map[string]string {
		return map[string]string{"csi.storage.k8s.io/pod.namespace": ns, "csi.storage.k8s.io/pod.name": "p"}
	}
	var published []string
	t.Cleanup(func() {
		for _, id := range published {
			_, _ = env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target(id)})
		}
	})
	streams := func(id string, pod map[string]string) {
		t.Helper()
		if err := publish(id, pod); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
		published = append(published, id)
		if typ := mountType(t, target(id)); typ != "fuse."+streamfs.Subtype {
			t.Fatalf("%s is mounted as %q, not streamed (the dataset was staged too soon?)", id, typ)
		}
	}
	const share = "--streaming-max-volumes-per-namespace"

	streams("a1", inNamespace("a"))
	streams("a2", inNamespace("a"))
	wantCode(t, publish("a3", inNamespace("a")), codes.ResourceExhausted, `namespace "a"`)
	wantCode(t, publish("a3", inNamespace("a")), codes.ResourceExhausted, share)
	// A PV of the claim's namespace a (external-provisioner's --extra-create-metadata).
	pv := maps.Clone(params)
	delete(pv, "pool")
	pv["csi.storage.k8s.io/pvc/namespace"] = "a"
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	wantCode(t, retryUnavailable(t, func() error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "pv-a", StagingTargetPath: filepath.Join(env.dir, "staging", "pv-a"),
			VolumeCapability: roMany, VolumeContext: pv, Secrets: secrets})
		return err
	}), codes.ResourceExhausted, `namespace "a"`)
	streams("b1", inNamespace("b"))

	// Taken over after a restart, a's two count again.
	env.restart()
	if ids, err := fusekeeper.List(keeper.Path()); err != nil || len(ids) != 3 {
		t.Fatalf("the keeper holds %v, %v; want a1, a2, b1", ids, err)
	}
	wantCode(t, publish("a3", inNamespace("a")), codes.ResourceExhausted, share)
	streams("b2", inNamespace("b"))
	wantCode(t, publish("b3", inNamespace("b")), codes.ResourceExhausted, `namespace "b"`)
	// A writable volume of b's claim (CreateVolume's parameters), layered on a streaming tree.
	wp := maps.Clone(params)
	wp["csi.storage.k8s.io/pvc/namespace"] = "b"
	vol := env.create("wb", 64<<20, wp)
	wantCode(t, retryUnavailable(t, func() error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: filepath.Join(env.dir, "staging", "wb"),
			VolumeCapability: mountCap("ext4"), VolumeContext: vol.VolumeContext, Secrets: secrets})
		return err
	}), codes.ResourceExhausted, `namespace "b"`)
	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
		t.Fatal(err)
	}
	// An inline volume naming a claim's namespace but no pod's (no podInfoOnMount): not b's.
	streams("x", map[string]string{"csi.storage.k8s.io/pvc/namespace": "b"})
	// The node's bound (5) before c's share.
	wantCode(t, publish("c1", inNamespace("c")), codes.ResourceExhausted, "its most (--streaming-max-volumes)")

	// One of a's goes: a gets one again.
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "a1", TargetPath: target("a1")}); err != nil {
		t.Fatal(err)
	}
	streams("a3", inNamespace("a"))
	if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "x", TargetPath: target("x")}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, publish("a4", inNamespace("a")), codes.ResourceExhausted, share)
}
