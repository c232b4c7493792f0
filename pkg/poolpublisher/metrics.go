package poolpublisher

import (
	"k8s.io/component-base/metrics"
)

const metricsSubsystem = "storagepool_sidecar"

// Metrics are the sidecar's Prometheus metrics.
type Metrics struct {
	writes       *metrics.CounterVec
	syncs        *metrics.CounterVec
	syncDuration *metrics.Histogram
	pools        *metrics.Gauge
}

// NewMetrics creates the metrics and registers them in reg (nil: not registered, for tests).
func NewMetrics(reg metrics.KubeRegistry) *Metrics {
	m := &Metrics{
		writes: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      metricsSubsystem,
			Name:           "api_writes_total",
			Help:           "StoragePool writes sent to the API server, by operation (apply, apply_status, delete).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"operation"}),
		syncs: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      metricsSubsystem,
			Name:           "syncs_total",
			Help:           "Reconciliations of the driver's pools with the API server, by result (success, error).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"result"}),
		syncDuration: metrics.NewHistogram(&metrics.HistogramOpts{
			Subsystem:      metricsSubsystem,
			Name:           "sync_duration_seconds",
			Help:           "Duration of one reconciliation.",
			Buckets:        metrics.ExponentialBuckets(0.001, 4, 10),
			StabilityLevel: metrics.ALPHA,
		}),
		pools: metrics.NewGauge(&metrics.GaugeOpts{
			Subsystem:      metricsSubsystem,
			Name:           "pools",
			Help:           "Pools the driver reported in the last successful reconciliation.",
			StabilityLevel: metrics.ALPHA,
		}),
	}
	if reg != nil {
		reg.MustRegister(m.writes, m.syncs, m.syncDuration, m.pools)
		// Every label value is exported from the start, at 0: a reader tells "no writes" from
		// "no such metric".
		for _, op := range []string{"apply", "apply_status", "delete"} {
			m.writes.WithLabelValues(op)
		}
		for _, result := range []string{"success", "error"} {
			m.syncs.WithLabelValues(result)
		}
	}
	return m
}
