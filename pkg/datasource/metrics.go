package datasource

import (
	"github.com/cistern-csi/cistern/pkg/datasource/cache"
	"github.com/cistern-csi/cistern/pkg/datasource/stage"
	"github.com/prometheus/client_golang/prometheus"
	"slices"
)

// metrics exports staging progress, cache contents and evictions.
type metrics struct {
	m            *Manager
	stagings     *prometheus.CounterVec
	stagedBytes  prometheus.Counter
	retries      prometheus.Counter
	cacheHits    prometheus.Counter
	evictions    *prometheus.CounterVec
	evictedBytes *prometheus.CounterVec
	// fetchedBytes counts what staging read, by dataset and origin (source or peer); never by
	// peer or source URL: the series stay two per dataset.
	fetchedBytes *prometheus.CounterVec
	wrongPieces  prometheus.Counter
	// verified counts files staged from a source, by what their bytes were checked against.
	verified *prometheus.CounterVec
	// unverifiable counts objects nothing could check, by action (refused, served).
	unverifiable *prometheus.CounterVec
	// streamFetches counts what streaming volumes fetched on demand, by result.
	streamFetches *prometheus.CounterVec
	// streamJoins counts streaming reads that waited for the staging's own download, by result.
	streamJoins *prometheus.CounterVec

	progressDone, progressTotal, cachedBytes, cachedDatasets *prometheus.Desc
}

func newMetrics(m *Manager) *metrics {
	const ns = "cistern_dataset"
	return &metrics{
		m: m,
		stagings: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "stagings_total",
			Help: "Dataset stagings finished, by result (ready, failed)."}, []string{"result"}),
		stagedBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "staged_bytes_total",
			Help: "Bytes of datasets staged to completion."}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "read_retries_total",
			Help: "Source reads retried after a transient failure."}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "cache_hits_total",
			Help: "Volumes served from a dataset already on the node."}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "evictions_total",
			Help: "Cached datasets evicted to keep pool free space above the watermark."}, []string{"pool"}),
		evictedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "evicted_bytes_total",
			Help: "Bytes freed by evictions."}, []string{"pool"}),
		fetchedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "fetched_bytes_total",
			Help: "Bytes staging read, by dataset ID and origin: source (S3, NFS, local), peer (another node), or stream (fetched on demand by a streaming volume)."}, []string{"dataset", "origin"}),
		streamFetches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "stream_fetches_total",
			Help: "Parts or objects streaming volumes fetched on demand, by result: ok, or refused (failed its check, changed since the listing, or unreadable: the read got EIO)."}, []string{"result"}),
		streamJoins: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "stream_joins_total",
			Help: "Streaming reads of files not yet staged that waited for the staging to fetch them first, by result: joined (read from the cache), or fetched (the staging ended without the file: fetched on demand)."}, []string{"result"}),
		unverifiable: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "unverifiable_objects_total",
			Help: "Objects staged or streamed that nothing could check (no checksum, no part size, no likely part size matching the multipart ETag), by action: refused (the default), or served (--unverifiable-objects=serve)."}, []string{"action"}),
		wrongPieces: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "peer_wrong_pieces_total",
			Help: "Pieces from peers that failed verification (the peer is dropped and the piece read again)."}),
		verified: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "verified_files_total",
			Help: "Files staged from a source, by what their bytes were checked against: the source's full-object checksum (crc32, crc32c, crc64nvme, sha256), md5 (a single-part ETag), multipart-md5 (the part MD5s of a multipart ETag), or none (the source gave nothing to check)."}, []string{"checksum"}),
		// Datasets are named by ID only: a source URL names a tenant's bucket or server, and
		// metrics are read by people who may not read the tenant's data.
		progressDone: prometheus.NewDesc(ns+"_staging_bytes_done", "Bytes staged so far by a staging in progress.",
			[]string{"pool", "dataset"}, nil),
		progressTotal: prometheus.NewDesc(ns+"_staging_bytes", "Size of a dataset being staged (a gauge: with _staging_bytes_done, its progress).",
			[]string{"pool", "dataset"}, nil),
		cachedBytes: prometheus.NewDesc(ns+"_cache_bytes", "Bytes of ready datasets cached on a pool.",
			[]string{"pool"}, nil),
		cachedDatasets: prometheus.NewDesc(ns+"_cache_datasets", "Ready datasets cached on a pool.",
			[]string{"pool"}, nil),
	}
}

// staging is the counters the staging engine moves.
func (c *metrics) staging() stage.Metrics {
	return stage.Metrics{Retries: c.retries, Fetched: c.fetchedBytes, WrongPieces: c.wrongPieces, Verified: c.verified}
}

// Collector returns the Prometheus collector of the manager's metrics.
func (m *Manager) Collector() prometheus.Collector { return m.metrics }

func (c *metrics) counters() []prometheus.Collector {
	return []prometheus.Collector{c.stagings, c.stagedBytes, c.retries, c.cacheHits, c.evictions, c.evictedBytes, c.fetchedBytes, c.wrongPieces, c.verified, c.streamFetches, c.streamJoins, c.unverifiable}
}

func (c *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, x := range c.counters() {
		x.Describe(ch)
	}
	ch <- c.progressDone
	ch <- c.progressTotal
	ch <- c.cachedBytes
	ch <- c.cachedDatasets
}

func (c *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, x := range c.counters() {
		x.Collect(ch)
	}
	c.m.mu.Lock()
	datasets := make([][]*staging, 0, len(c.m.jobs))
	for _, js := range c.m.jobs {
		datasets = append(datasets, slices.Clone(js))
	}
	c.m.mu.Unlock()
	for _, js := range datasets {
		// One series per dataset: the versions being staged of it, summed.
		st := stagingProgress(js)
		ch <- prometheus.MustNewConstMetric(c.progressDone, prometheus.GaugeValue, float64(st.BytesDone), js[0].Pool(), js[0].ID())
		ch <- prometheus.MustNewConstMetric(c.progressTotal, prometheus.GaugeValue, float64(st.BytesTotal), js[0].Pool(), js[0].ID())
	}
	for _, pool := range c.m.cache.Pools() {
		bytes, n := cache.ReadyTotals(pool)
		ch <- prometheus.MustNewConstMetric(c.cachedBytes, prometheus.GaugeValue, float64(bytes), pool)
		ch <- prometheus.MustNewConstMetric(c.cachedDatasets, prometheus.GaugeValue, float64(n), pool)
	}
}
