package driver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/volume"
)

// TestInlineLimits: an inline volume (any pod author writes one) takes no more than the
// administrator's largest inline size and only the pools allowed for inline volumes; a read-only
// inline dataset (NFS, from go-nfs and from nfs-ganesha) is held to its size like a writable one.
func TestInlineLimits(t *testing.T) {
	env := startDriver(t, testPool{name: "fast"}, testPool{name: "scratch"})
	ctx := context.Background()
	env.cfg.Inline = volume.InlineLimits{MaxBytes: 64 << 20, Pools: []string{"scratch"}}
	exports := startNFSServers(t, env, func(dir string) { writeTree(t, filepath.Join(dir, "data"), want) })
	publish := func(id string, readOnly bool, attrs map[string]string) error {
		vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true"}
		for k, v := range attrs {
			vc[k] = v
		}
		return retryUnavailable(t, func() error {
			_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id,
				TargetPath: filepath.Join(env.dir, "target", id), VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: readOnly})
			return err
		})
	}
	wantCode(t, publish("too-big", false, map[string]string{"size": "128Mi"}), codes.OutOfRange, "--max-inline-volume-bytes")
	wantCode(t, publish("wrong-pool", false, map[string]string{"size": "32Mi", "pool": "fast"}), codes.PermissionDenied, "--inline-pools")
	if err := publish("scratch-vol", false, map[string]string{"size": "32Mi"}); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(env.pools[1].path, ".cistern", "volumes", "scratch-vol*")); len(m) != 1 {
		t.Fatalf("the inline volume is not in the scratch pool: %v", m)
	}
	for i, srv := range exports {
		t.Run(srv.name, func(t *testing.T) {
			nfs := srv.URL("data")
			// Read-only: the dataset's files take more than the 4 KiB the volume names.
			wantCode(t, publish("ro-small-"+srv.name, true, map[string]string{"source": nfs, "size": "4Ki"}), codes.OutOfRange, "room for")
			if err := publish("ro-default-"+srv.name, true, map[string]string{"source": nfs}); err != nil {
				t.Fatal(err)
			}
			checkFiles(t, filepath.Join(env.dir, "target", "ro-default-"+srv.name), want)
			if m, _ := filepath.Glob(filepath.Join(env.pools[1].path, datasource.CacheDirName, "*", "tree")); len(m) != i+1 {
				t.Fatalf("the read-only inline dataset is not cached in the scratch pool: %v", m)
			}
		})
	}
}

// TestSharedPoolCachePerNode: nodes sharing a pool keep their dataset caches apart, so none
// stages into, evicts or serves another's.
func TestSharedPoolCachePerNode(t *testing.T) {
	env1, src := datasetEnv(t)
	env1.stop()
	env1.pools[0].shared = true
	writePoolsConfig(t, env1.cfg.PoolsConfig, env1.pools)
	env1.start()
	env2 := &testEnv{t: t, dir: t.TempDir(), pools: env1.pools, cfg: env1.cfg}
	env2.cfg.NodeID = "node-2"
	env2.cfg.Endpoint = socketEndpoint(t)
	env2.cfg.StateDir = filepath.Join(env2.dir, "state")
	env2.cfg.KubeletRoot = env2.dir
	env2.start()
	ctx := context.Background()
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	vc := map[string]string{"source": "file://" + src + "/set"}
	for _, env := range []*testEnv{env1, env2} {
		staging := filepath.Join(env.dir, "staging", "shared-static")
		if err := retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "shared-static", StagingTargetPath: staging,
				VolumeCapability: roMany, VolumeContext: vc})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(env.dir, "target", "shared-static")
		if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "shared-static", StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: roMany, VolumeContext: vc, Readonly: true}); err != nil {
			t.Fatal(err)
		}
		checkFiles(t, target, want)
		t.Cleanup(func() {
			_, _ = env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "shared-static", TargetPath: target})
			_, _ = env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "shared-static", StagingTargetPath: staging})
		})
	}
	pool := env1.pools[0].path
	for _, node := range []string{"node-1", "node-2"} {
		if m, _ := filepath.Glob(filepath.Join(pool, ".cistern-nodes", node, datasource.CacheDirName, "*", "tree")); len(m) != 1 {
			t.Errorf("%s's cache holds %v, want its own copy", node, m)
		}
	}
	if _, err := os.Stat(filepath.Join(pool, datasource.CacheDirName)); !os.IsNotExist(err) {
		t.Errorf("a cache both nodes would share: %v", err)
	}
}
