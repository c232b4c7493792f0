package driver

// Dataset volumes: volumes pre-filled from S3, NFS or node-local sources. The volume service
// (pkg/volume) does the node's side through pkg/datasource; the driver's part is small:
//
//   - CreateVolume validates the dataset parameters (pkg/params) and, when the driver runs on
//     the node (--mode all), asks the volume service to start staging at once, so the data is
//     usually there before the pod.
//   - Volume health reports a dataset still staging, or failed.

import (
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
)

// initDatasets creates the node's dataset manager over the configured pools.
func (d *Driver) initDatasets(reg *prometheus.Registry) (*datasource.Manager, error) {
	cfg := d.cfg.Datasets
	pools, _ := d.pools.List()
	for _, p := range pools {
		cfg.Pools = append(cfg.Pools, datasetRoot(p.Spec, d.cfg.NodeID))
	}
	m, err := datasource.NewManager(cfg)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(m.Collector())
	return m, nil
}

// datasetHealth reports a dataset still staging, or failed, as the volume's condition.
func (d *Driver) datasetHealth(v state.Volume) []*csi.VolumeHealth_VolumeHealthEntry {
	reason, msg := d.volumes.DatasetProblem(v)
	if reason == "" {
		return nil
	}
	return []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: reason, Message: msg}}
}

// sharedCacheDir holds, in a shared pool, one dataset cache per node.
const sharedCacheDir = ".cistern-nodes"

// datasetRoot is where the node keeps its dataset cache in pool p: the pool itself, or for a
// shared pool a directory of the node's own. Nodes that share the storage then never stage into,
// evict, or serve each other's datasets, which no lock across nodes could make safe on every
// shared filesystem.
func datasetRoot(p pool.Spec, node string) string {
	if p.Shared {
		return filepath.Join(p.Path, sharedCacheDir, node)
	}
	return p.Path
}

// datasetPools resolves pool names to the node's dataset roots, for datasource.Datasets.
type datasetPools struct {
	pools *pool.Manager
	node  string
}

func (r datasetPools) PoolPath(name string) (string, bool) {
	p, ok := r.pools.Get(name)
	if !ok {
		return "", false
	}
	return datasetRoot(p.Spec, r.node), true
}
