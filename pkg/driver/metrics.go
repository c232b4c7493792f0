package driver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cistern-csi/cistern/pkg/pool"
)

// poolCollector exports per-pool capacity and health, read from the pool manager at scrape time.
type poolCollector struct {
	d         *Driver
	total     *prometheus.Desc
	available *prometheus.Desc
	maxVolume *prometheus.Desc
	healthy   *prometheus.Desc
	volumes   *prometheus.Desc
}

func newPoolCollector(d *Driver) *poolCollector {
	labels := []string{"node", "pool"}
	return &poolCollector{
		d:         d,
		total:     prometheus.NewDesc("cistern_pool_capacity_bytes", "Size of the pool's filesystem.", labels, nil),
		available: prometheus.NewDesc("cistern_pool_available_bytes", "Free space in the pool.", labels, nil),
		maxVolume: prometheus.NewDesc("cistern_pool_max_volume_bytes", "Largest volume the pool can still hold.", labels, nil),
		healthy:   prometheus.NewDesc("cistern_pool_healthy", "1 when the pool is healthy, 0 otherwise.", labels, nil),
		volumes:   prometheus.NewDesc("cistern_pool_volumes", "Volumes in the pool.", labels, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.total, c.available, c.maxVolume, c.healthy, c.volumes} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	node := c.d.cfg.NodeID
	counts := c.d.volumes.VolumesPerPool()
	pools, _ := c.d.pools.List()
	for _, p := range pools {
		healthy := 0.0
		if p.Healthy {
			healthy = 1
		}
		ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(p.TotalBytes), node, p.Name)
		ch <- prometheus.MustNewConstMetric(c.available, prometheus.GaugeValue, float64(p.AvailableBytes), node, p.Name)
		ch <- prometheus.MustNewConstMetric(c.maxVolume, prometheus.GaugeValue, float64(pool.MaxVolumeBytes(p)), node, p.Name)
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, healthy, node, p.Name)
		ch <- prometheus.MustNewConstMetric(c.volumes, prometheus.GaugeValue, float64(counts[p.Name]), node, p.Name)
	}
}

// stateCollector exports how many state records were quarantined at start (pkg/state): each is
// a volume or snapshot the driver no longer knows, for an administrator to look at.
type stateCollector struct {
	d           *Driver
	quarantined *prometheus.Desc
}

func newStateCollector(d *Driver) *stateCollector {
	return &stateCollector{d: d, quarantined: prometheus.NewDesc("cistern_state_records_quarantined_total",
		"State records that could not be read at start and were set aside (renamed *.corrupt-*).", []string{"node"}, nil)}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.quarantined }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.quarantined, prometheus.CounterValue,
		float64(c.d.volumes.Quarantined()), c.d.cfg.NodeID)
}
