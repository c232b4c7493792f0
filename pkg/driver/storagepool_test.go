package driver

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/consts"
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
