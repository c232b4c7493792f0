package driver

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/pool"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
)

// poolServer serves ControllerListStoragePools and WatchStoragePools from the pool manager.
type poolServer struct {
	spv1.UnimplementedStoragePoolControllerServer
	d *Driver
}

func (s *poolServer) ControllerListStoragePools(ctx context.Context, req *spv1.ControllerListStoragePoolsRequest) (*spv1.ControllerListStoragePoolsResponse, error) {
	pools, gen := s.d.pools.List()
	items, next, err := page(pools, func(p pool.Status) string { return p.Name }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &spv1.ControllerListStoragePoolsResponse{NextToken: next, Generation: gen}
	for _, p := range items {
		resp.Pools = append(resp.Pools, s.d.storagePool(p))
	}
	return resp, nil
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
		changed := s.d.pools.Changed()
		if err := stream.Send(&spv1.WatchStoragePoolsResponse{Generation: s.d.pools.Generation()}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}
