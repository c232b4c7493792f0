package volume

import "github.com/prometheus/client_golang/prometheus"

// writeBackCollector exports the node's uploads of volumes' outputs, read at scrape time.
type writeBackCollector struct {
	w                                       *writeBacks
	pending, volumes, refusals, checkpoints *prometheus.Desc
	counted, byNamespace, expired           *prometheus.Desc
	unconfirmed                             *prometheus.Desc
}

// WriteBackCollectors are the write-back's metrics; none when write-back is off.
func (s *Service) WriteBackCollectors() []prometheus.Collector {
	if s.wb == nil {
		return nil
	}
	labels := []string{"node"}
	c := &writeBackCollector{w: s.wb,
		pending:     prometheus.NewDesc("cistern_writeback_pending_bytes", "Bytes of volumes' outputs on the node not at their output target yet.", labels, nil),
		counted:     prometheus.NewDesc("cistern_writeback_counted_bytes", "Bytes of outputs not uploaded yet that count against --writeback-max-pending-bytes: each namespace's up to its share (--writeback-max-pending-bytes-per-namespace).", labels, nil),
		byNamespace: prometheus.NewDesc("cistern_writeback_namespace_pending_bytes", "Bytes of outputs not uploaded yet, by the namespace whose volumes they are (\"\": volumes naming none).", []string{"node", "namespace"}, nil),
		volumes:     prometheus.NewDesc("cistern_writeback_volumes", "Volumes whose outputs are being uploaded, their data kept until done.", labels, nil),
		refusals:    prometheus.NewDesc("cistern_writeback_refusals_total", "Upload passes and checkpoints that failed (the target refused or could not be reached); each is retried with backoff.", labels, nil),
		checkpoints: prometheus.NewDesc("cistern_writeback_checkpoints_total", "Checkpoints taken: uploads of what changed in a volume in use (outputInterval).", labels, nil),
		unconfirmed: prometheus.NewDesc("cistern_writeback_unconfirmed_total", "Uploads stopped, not retried, because the target confirmed neither the checksum nor the MD5 of what it stored (an encrypted bucket's ETags); their data kept until they expire.", labels, nil),
		expired:     prometheus.NewDesc("cistern_writeback_expired_total", "Uploads that expired, pending longer than --writeback-max-age: their credentials deleted, an inline volume's outputs deleted with it, a claim's kept in it.", labels, nil),
	}
	return []prometheus.Collector{c}
}

func (c *writeBackCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.counted, c.byNamespace, c.volumes, c.refusals, c.checkpoints, c.expired, c.unconfirmed} {
		ch <- d
	}
}

func (c *writeBackCollector) Collect(ch chan<- prometheus.Metric) {
	w := c.w
	u := w.usage()
	w.mu.Lock()
	running, refusals, checkpoints, expired, unconfirmed := len(w.running), w.refusals, w.checkpoints, w.expired, w.unconfirmed
	w.mu.Unlock()
	node := w.node
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(u.total), node)
	ch <- prometheus.MustNewConstMetric(c.counted, prometheus.GaugeValue, float64(u.counted), node)
	for ns, n := range u.byNamespace {
		ch <- prometheus.MustNewConstMetric(c.byNamespace, prometheus.GaugeValue, float64(n), node, ns)
	}
	ch <- prometheus.MustNewConstMetric(c.volumes, prometheus.GaugeValue, float64(running), node)
	ch <- prometheus.MustNewConstMetric(c.refusals, prometheus.CounterValue, float64(refusals), node)
	ch <- prometheus.MustNewConstMetric(c.checkpoints, prometheus.CounterValue, float64(checkpoints), node)
	ch <- prometheus.MustNewConstMetric(c.expired, prometheus.CounterValue, float64(expired), node)
	ch <- prometheus.MustNewConstMetric(c.unconfirmed, prometheus.CounterValue, float64(unconfirmed), node)
}
