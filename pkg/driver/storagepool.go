package driver

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/pool"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
)

// poolServer serves ControllerListStoragePools and WatchStoragePools from the pool manager.
type poolServer struct {
	spv1.UnimplementedStoragePoolControllerServer
	d *Driver
}

// DefaultMaxCachedDatasets is how many datasets a pool's cache inventory lists when the caller
// does not say.
const DefaultMaxCachedDatasets = 32

func (s *poolServer) ControllerListStoragePools(ctx context.Context, req *spv1.ControllerListStoragePoolsRequest) (*spv1.ControllerListStoragePoolsResponse, error) {
	// The generation is read before the pools and the inventories: a change while they are read
	// moves it again, and the caller lists again.
	gen, _, _, _ := s.d.poolGeneration()
	pools, _ := s.d.pools.List()
	items, next, err := page(pools, func(p pool.Status) string { return p.Name }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	maxDatasets := int(req.GetMaxCachedDatasets())
	if maxDatasets <= 0 {
		maxDatasets = DefaultMaxCachedDatasets
	}
	resp := &spv1.ControllerListStoragePoolsResponse{NextToken: next, Generation: gen}
	for _, p := range items {
		sp := s.d.storagePool(p)
		sp.Cache = s.d.datasetCache(ctx, p, maxDatasets)
		resp.Pools = append(resp.Pools, sp)
	}
	return resp, nil
}

// poolGeneration is what WatchStoragePools and ControllerListStoragePools report: it moves when
// the pools, any pool's dataset cache or the volumes' outputs change (each generation only grows,
// so their sum does too). The channels are closed at the next change of each.
func (d *Driver) poolGeneration() (gen uint64, pools, caches, outputs <-chan struct{}) {
	pools = d.pools.Changed()
	gen = d.pools.Generation()
	if d.cache != nil {
		var invGen uint64
		invGen, caches = d.cache.InventoryGeneration()
		gen += invGen
	}
	outGen, outputs := d.volumes.OutputsGeneration()
	return gen + outGen, pools, caches, outputs
}

// datasetCache reports what the node's dataset cache in pool p holds. A shared pool's cache is
// the same files seen from every node: no node reports it for the others.
func (d *Driver) datasetCache(ctx context.Context, p pool.Status, max int) *spv1.DatasetCache {
	if d.cache == nil || p.Shared {
		return nil
	}
	inv, err := d.cache.Inventory(p.Name, max)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reading the pool's dataset cache", "pool", p.Name)
		return nil
	}
	out := &spv1.DatasetCache{
		Bytes: inv.Bytes, Total: int32(inv.Total), Ready: int32(inv.Ready),
		Staging: int32(inv.Staging), Failed: int32(inv.Failed),
	}
	for _, ds := range inv.Datasets {
		c := &spv1.CachedDataset{
			Id: ds.ID, Source: ds.Source, Scheme: string(ds.Scheme), Tenant: ds.Tenant,
			State: datasetStates[ds.State], Reason: ds.Reason,
			BytesDone: ds.BytesDone, BytesTotal: ds.BytesTotal, References: int32(ds.References),
		}
		if !ds.LastUsed.IsZero() {
			c.LastUsed = timestamppb.New(ds.LastUsed)
		}
		out.Datasets = append(out.Datasets, c)
	}
	outputs := d.volumes.Outputs(p.Name)
	out.OutputsTotal = int32(len(outputs))
	for _, o := range outputs[:min(len(outputs), max)] {
		out.Outputs = append(out.Outputs, &spv1.VolumeOutputs{Volume: o.Volume, InUse: int32(o.InUse),
			Uploading: int32(o.Uploading), Failing: int32(o.Failing), BytesPending: o.BytesPending})
	}
	return out
}

var datasetStates = map[datasource.DatasetState]spv1.DatasetState{
	datasource.DatasetStaging:    spv1.DatasetState_DATASET_STATE_STAGING,
	datasource.DatasetReady:      spv1.DatasetState_DATASET_STATE_READY,
	datasource.DatasetFailed:     spv1.DatasetState_DATASET_STATE_FAILED,
	datasource.DatasetIncomplete: spv1.DatasetState_DATASET_STATE_INCOMPLETE,
}

func (d *Driver) storagePool(p pool.Status) *spv1.StoragePool {
	out := &spv1.StoragePool{
		Name:               p.Name,
		Parameters:         map[string]string{consts.ParamPool: p.Name},
		Labels:             p.Labels,
		AccessibleTopology: []*spv1.Topology{{Segments: map[string]string{consts.TopologyKey: d.cfg.NodeID}}},
		TotalBytes:         p.TotalBytes,
		AvailableBytes:     p.AvailableBytes,
		MaximumVolumeBytes: pool.MaxVolumeBytes(p),
		Healthy:            p.Healthy,
		Shared:             p.Shared,
	}
	for _, e := range p.Errors {
		out.Errors = append(out.Errors, &spv1.StoragePoolError{Time: timestamppb.New(e.Time), Message: e.Message})
	}
	return out
}

// WatchStoragePools sends the current generation, then each new one, until the caller leaves.
func (s *poolServer) WatchStoragePools(_ *spv1.WatchStoragePoolsRequest, stream spv1.StoragePoolController_WatchStoragePoolsServer) error {
	for {
		gen, pools, caches, outputs := s.d.poolGeneration()
		if err := stream.Send(&spv1.WatchStoragePoolsResponse{Generation: gen}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-pools:
		case <-caches: // nil without datasets: never ready
		case <-outputs: // nil without write-back: never ready
		}
	}
}
