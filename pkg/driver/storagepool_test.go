package driver

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
)

func TestControllerListStoragePools(t *testing.T) {
	env := startDriver(t, testPool{name: "a", labels: map[string]string{"media": "ssd"}}, testPool{name: "b"}, testPool{name: "c"})
	ctx := context.Background()
	first, err := env.poolsRPC.ControllerListStoragePools(ctx, &spv1.ControllerListStoragePoolsRequest{MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.GetPools()) != 2 || first.GetNextToken() == "" {
		t.Fatalf("first page: %v", first)
	}
	p := first.GetPools()[0]
	if p.GetName() != "a" || p.GetParameters()[consts.ParamPool] != "a" || p.GetLabels()["media"] != "ssd" ||
		p.GetAccessibleTopology()[0].GetSegments()[consts.TopologyKey] != "node-1" || !p.GetHealthy() ||
		p.GetTotalBytes() == 0 || p.GetAvailableBytes() == 0 || p.GetMaximumVolumeBytes() > p.GetAvailableBytes() {
		t.Fatalf("pool a: %v", p)
	}
	second, err := env.poolsRPC.ControllerListStoragePools(ctx, &spv1.ControllerListStoragePoolsRequest{StartingToken: first.GetNextToken()})
	if err != nil || len(second.GetPools()) != 1 || second.GetPools()[0].GetName() != "c" || second.GetNextToken() != "" {
		t.Fatalf("second page: %v %v", second, err)
	}
	_, err = env.poolsRPC.ControllerListStoragePools(ctx, &spv1.ControllerListStoragePoolsRequest{StartingToken: "bogus"})
	wantCode(t, err, codes.Aborted, "")
}

func TestWatchStoragePools(t *testing.T) {
	env := startDriver(t, testPool{name: "a"}, testPool{name: "b"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := env.poolsRPC.WatchStoragePools(ctx, &spv1.WatchStoragePoolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	// Removing a pool from the config is a change watchers hear about.
	writePoolsConfig(t, env.cfg.PoolsConfig, env.pools[:1])
	env.driver.reloadPoolsConfig()
	next, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if next.GetGeneration() <= first.GetGeneration() {
		t.Fatalf("generation went from %d to %d", first.GetGeneration(), next.GetGeneration())
	}
	list, err := env.poolsRPC.ControllerListStoragePools(ctx, &spv1.ControllerListStoragePoolsRequest{})
	if err != nil || len(list.GetPools()) != 1 || list.GetGeneration() != next.GetGeneration() {
		t.Fatalf("list after removal: %v %v", list, err)
	}
}

// TestStoragePoolCache: a dataset staged for a static PV shows in its pool's cache, with the
// volume's reference, and watchers hear of it.
func TestStoragePoolCache(t *testing.T) {
	env, src := datasetEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := env.poolsRPC.WatchStoragePools(ctx, &spv1.WatchStoragePoolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	list, err := env.poolsRPC.ControllerListStoragePools(ctx, &spv1.ControllerListStoragePoolsRequest{})
	if err != nil || list.GetPools()[0].GetCache().GetTotal() != 0 || list.GetGeneration() != first.GetGeneration() {
		t.Fatalf("before staging: %v %v", list, err)
	}

	source := "file://" + src + "/set"
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "set-static",
			StagingTargetPath: filepath.Join(env.dir, "staging", "set-static"),
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
			},
			VolumeContext: map[string]string{"source": source}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	next, err := stream.Recv()
	if err != nil || next.GetGeneration() <= first.GetGeneration() {
		t.Fatalf("watch after staging: %v %v", next, err)
	}
	list, err = env.poolsRPC.ControllerListStoragePools(ctx, &spv1.ControllerListStoragePoolsRequest{MaxCachedDatasets: 1})
	if err != nil {
		t.Fatal(err)
	}
	dirs, _ := filepath.Glob(filepath.Join(env.pools[0].path, datasource.CacheDirName, "*", "tree"))
	if len(dirs) != 1 {
		t.Fatalf("cached trees on disk: %v", dirs)
	}
	id := filepath.Base(filepath.Dir(dirs[0]))
	size := int64(len("alpha") + len("beta") + len("gamma")) // the files of datasetEnv's "set"
	c := list.GetPools()[0].GetCache()
	if c.GetTotal() != 1 || c.GetReady() != 1 || c.GetBytes() != size || len(c.GetDatasets()) != 1 {
		t.Fatalf("cache: %v", c)
	}
	ds := c.GetDatasets()[0]
	if ds.GetId() != id || ds.GetState() != spv1.DatasetState_DATASET_STATE_READY || ds.GetSource() != source ||
		ds.GetBytesDone() != size || ds.GetReferences() != 1 || ds.GetLastUsed() == nil {
		t.Fatalf("dataset: %v", ds)
	}
}
