package datasource

import (
	"context"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// PoolPaths resolves pool names to their directories; pkg/pool's Manager implements it.
type PoolPaths interface {
	PoolPath(name string) (string, bool)
}

// Datasets is the Manager as the volume service sees it: pools by name, datasets by their
// parsed spec, and a few verbs (and the pools' inventory, for the StoragePool publisher).
// Prepare stages a dataset on a pool (or joins the staging under way), Fill copies a staged
// dataset into a volume, Serve hands out the cached tree for a read-only bind mount or as a
// writable volume's lower layer, Layer finds that layer again, and Unserve gives it back.
type Datasets struct {
	m     *Manager
	pools PoolPaths
}

// NewDatasets wraps m; pool names are resolved through pools.
func NewDatasets(m *Manager, pools PoolPaths) *Datasets {
	return &Datasets{m: m, pools: pools}
}

func (d *Datasets) path(pool string) (string, error) {
	p, ok := d.pools.PoolPath(pool)
	if !ok {
		// FailedPrecondition: the volume's pool must come back first.
		return "", source.Errorf(source.NotFound, "pool %q is not configured on this node", pool)
	}
	return p, nil
}

// Prepare waits, until ctx ends, for the dataset to be staged on pool and for the caller to prove
// with creds that it may read it; see Manager.Wait. The ready Status names the Version proved.
// With wholeList it waits only until its listing is taken (Manager.Listed): the size is then
// known, and a dataset larger than capacity is refused before any object is read.
func (d *Datasets) Prepare(ctx context.Context, pool string, spec *Spec, creds Credentials, capacity int64, wholeList bool) (Status, error) {
	p, err := d.path(pool)
	if err != nil {
		return Status{}, err
	}
	req := Request{Spec: spec, Creds: creds, Pool: p, Capacity: capacity}
	if wholeList {
		return d.m.Listed(ctx, req)
	}
	return d.m.Wait(ctx, req)
}

// CheckEndpoint refuses an S3 endpoint the caller may not name; see Manager.CheckEndpoint.
func (d *Datasets) CheckEndpoint(spec *Spec) error { return d.m.CheckEndpoint(spec) }

// Fill copies the dataset version staged on pool, which the caller proved it may read (the
// Status.Version Prepare returned), into target, once; see Manager.Populate.
func (d *Datasets) Fill(ctx context.Context, pool string, spec *Spec, version, target string) error {
	p, err := d.path(pool)
	if err != nil {
		return err
	}
	return d.m.Populate(ctx, p, spec, version, target)
}

// Serve references the dataset version staged on pool, which the caller proved it may read, for
// volumeID and returns its tree, for a read-only bind mount; eviction leaves it alone until
// Unserve. See Manager.Acquire.
func (d *Datasets) Serve(pool string, spec *Spec, version, volumeID string) (string, error) {
	p, err := d.path(pool)
	if err != nil {
		return "", err
	}
	return d.m.Acquire(p, spec, version, volumeID)
}

// Layer returns the tree of the dataset version volumeID references on pool (Serve took the
// reference when the volume was first layered on it): the lower layer of a writable volume,
// found again at each mount, even when a newer version was staged since. See
// Manager.Referenced.
func (d *Datasets) Layer(pool, datasetID, volumeID string) (string, error) {
	p, err := d.path(pool)
	if err != nil {
		return "", err
	}
	return d.m.Referenced(p, datasetID, volumeID)
}

// Served returns the tree of the dataset version Serve handed volumeID, wherever it is now: the
// path Serve returned names whatever version is current, and another may have been staged in
// its place since. It is the version Layer finds.
func (d *Datasets) Served(pool, datasetID, volumeID string) (string, error) {
	return d.Layer(pool, datasetID, volumeID)
}

// ShareLayer references, for to (a snapshot, or a volume restored or cloned), the dataset
// version that from references on pool, and returns its tree. See Manager.Share.
func (d *Datasets) ShareLayer(pool, datasetID, from, to string) (string, error) {
	p, err := d.path(pool)
	if err != nil {
		return "", err
	}
	return d.m.Share(p, datasetID, from, to)
}

// Unserve drops volumeID's reference to the dataset datasetID on pool. A pool no longer
// configured, or no dataset (""), holds nothing of ours to release.
func (d *Datasets) Unserve(pool, datasetID, volumeID string) error {
	p, ok := d.pools.PoolPath(pool)
	if !ok || datasetID == "" {
		return nil
	}
	return d.m.ReleaseID(p, datasetID, volumeID)
}

// Status reports the dataset's state on pool without starting anything; see Manager.Status.
func (d *Datasets) Status(pool string, spec *Spec) (Status, bool, error) {
	p, ok := d.pools.PoolPath(pool)
	if !ok {
		return Status{}, false, nil
	}
	return d.m.Status(p, spec)
}

// Inventory reads what the cache of pool holds, listing at most limit datasets; see
// Manager.Inventory. A pool no longer configured holds nothing.
func (d *Datasets) Inventory(pool string, limit int) (Inventory, error) {
	p, ok := d.pools.PoolPath(pool)
	if !ok {
		return Inventory{}, nil
	}
	return d.m.Inventory(p, limit)
}

// InventoryGeneration returns the generation of every pool's inventory and a channel closed when
// it next moves; see Manager.InventoryGeneration.
func (d *Datasets) InventoryGeneration() (uint64, <-chan struct{}) { return d.m.InventoryGeneration() }
