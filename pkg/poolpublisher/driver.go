package poolpublisher

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
)

// PoolSource is the driver side: the pools it reports, and a stream of changes.
type PoolSource interface {
	// List returns every pool and the generation of the pool set they were taken from.
	List(ctx context.Context) ([]*spv1.StoragePool, uint64, error)
	// Watch calls onChange with the driver's generation at once and after each change, until
	// the stream ends; it returns the error that ended it.
	Watch(ctx context.Context, onChange func(generation uint64)) error
}

// listAttempts bounds how often a list restarts because the pool set changed between pages.
const listAttempts = 3

var errGenerationChanged = errors.New("pool set changed while listing")

// DriverPools reads pools from a driver's StoragePoolController service.
type DriverPools struct {
	client      spv1.StoragePoolControllerClient
	pageSize    int32
	maxDatasets int32
}

// NewDriverPools returns a PoolSource on conn that lists pageSize pools per call (0: all).
func NewDriverPools(conn grpc.ClientConnInterface, pageSize int32) *DriverPools {
	return &DriverPools{client: spv1.NewStoragePoolControllerClient(conn), pageSize: pageSize}
}

// WithMaxCachedDatasets asks the driver for at most n datasets of each pool's cache (0: the
// driver's default).
func (d *DriverPools) WithMaxCachedDatasets(n int32) *DriverPools {
	d.maxDatasets = n
	return d
}

// CheckSupported returns a clear error when the driver does not serve StoragePoolController.
func (d *DriverPools) CheckSupported(ctx context.Context) error {
	_, err := d.client.ControllerListStoragePools(ctx, &spv1.ControllerListStoragePoolsRequest{MaxEntries: 1})
	if status.Code(err) == codes.Unimplemented {
		return fmt.Errorf("the CSI driver does not serve the %s service, so there are no pools to publish: %w",
			spv1.StoragePoolController_ServiceDesc.ServiceName, err)
	}
	if err != nil {
		return fmt.Errorf("ControllerListStoragePools: %w", err)
	}
	return nil
}

// List implements PoolSource. A list whose pages come from different generations, or whose
// token the driver no longer knows (Aborted), is restarted from the first page.
func (d *DriverPools) List(ctx context.Context) ([]*spv1.StoragePool, uint64, error) {
	var err error
	for range listAttempts {
		var pools []*spv1.StoragePool
		var generation uint64
		pools, generation, err = d.listOnce(ctx)
		if errors.Is(err, errGenerationChanged) || status.Code(err) == codes.Aborted {
			continue
		}
		return pools, generation, err
	}
	return nil, 0, err
}

func (d *DriverPools) listOnce(ctx context.Context) ([]*spv1.StoragePool, uint64, error) {
	var (
		pools      []*spv1.StoragePool
		generation uint64
		token      string
	)
	for page := 0; ; page++ {
		resp, err := d.client.ControllerListStoragePools(ctx, &spv1.ControllerListStoragePoolsRequest{
			MaxEntries:        d.pageSize,
			StartingToken:     token,
			MaxCachedDatasets: d.maxDatasets,
		})
		if err != nil {
			return nil, 0, fmt.Errorf("ControllerListStoragePools: %w", err)
		}
		if page > 0 && resp.GetGeneration() != generation {
			return nil, 0, errGenerationChanged
		}
		generation = resp.GetGeneration()
		pools = append(pools, resp.GetPools()...)
		token = resp.GetNextToken()
		if token == "" {
			return pools, generation, nil
		}
	}
}

// Watch implements PoolSource.
func (d *DriverPools) Watch(ctx context.Context, onChange func(generation uint64)) error {
	stream, err := d.client.WatchStoragePools(ctx, &spv1.WatchStoragePoolsRequest{})
	if err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		onChange(msg.GetGeneration())
	}
}
