package volume

import "github.com/prometheus/client_golang/prometheus"

// writeBackCollector exports the node's uploads of volumes' outputs, read at scrape time.
type writeBackCollector struct {
	w                                       *writeBacks
	pending, volumes, refusals, checkpoints *prometheus.Desc
}

// WriteBackCollectors are the write-back's metrics; none when write-back is off.
func (s *Service) WriteBackCollectors() []prometheus.Collector {
	if s.wb == nil {
		return nil
	}
	labels := []string{"node"}
	c := &writeBackCollector{w: s.wb,
		pending:     prometheus.NewDesc("cistern_writeback_pending_bytes", "Bytes of volumes' outputs on the node not at their output target yet (--writeback-max-pending-bytes bounds it).", labels, nil),
		volumes:     prometheus.NewDesc("cistern_writeback_volumes", "Volumes whose outputs are being uploaded, their data kept until done.", labels, nil),
		refusals:    prometheus.NewDesc("cistern_writeback_refusals_total", "Upload passes and checkpoints that failed (the target refused or could not be reached); each is retried with backoff.", labels, nil),
		checkpoints: prometheus.NewDesc("cistern_writeback_checkpoints_total", "Checkpoints taken: uploads of what changed in a volume in use (outputInterval).", labels, nil),
	}
	return []prometheus.Collector{c}
}

func (c *writeBackCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.volumes
	ch <- c.refusals
	ch <- c.checkpoints
}

func (c *writeBackCollector) Collect(ch chan<- prometheus.Metric) {
	w := c.w
	held := w.held()
	w.mu.Lock()
	running, refusals, checkpoints := len(w.running), w.refusals, w.checkpoints
	w.mu.Unlock()
	node := w.node
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(held), node)
	ch <- prometheus.MustNewConstMetric(c.volumes, prometheus.GaugeValue, float64(running), node)
	ch <- prometheus.MustNewConstMetric(c.refusals, prometheus.CounterValue, float64(refusals), node)
	ch <- prometheus.MustNewConstMetric(c.checkpoints, prometheus.CounterValue, float64(checkpoints), node)
}
