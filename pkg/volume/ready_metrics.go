package volume

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cistern-csi/cistern/pkg/state"
)

// How a dataset volume's data became ready: the mode label of cistern_volume_ready_seconds.
const (
	readyTree   = "tree"   // read-only: the dataset's cached tree, bind-mounted
	readyStream = "stream" // dataMode streaming: served before it is staged (read-only, or under an overlay)
	readyLayer  = "layer"  // writable: an overlay on the cached tree
	readyCopy   = "copy"   // writable: the dataset copied into the volume's own filesystem
)

// filledMode is how a writable volume was given its dataset (fillOrLayer).
func filledMode(v state.Volume) string {
	if v.DatasetLayer != "" {
		return readyLayer
	}
	return readyCopy
}

// readyClock times dataset volumes from the first NodeStageVolume or NodePublishVolume that
// waited for their data to the call that found it ready: kubelet retries while a dataset stages
// (Unavailable), so one volume's time spans many calls. It is in memory only: a volume whose
// first attempt was made by an earlier process is timed from this process's first attempt.
type readyClock struct {
	mu      sync.Mutex
	started map[string]time.Time
	seconds *prometheus.HistogramVec
}

func newReadyClock() *readyClock {
	return &readyClock{started: map[string]time.Time{},
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cistern_volume_ready_seconds",
			Help: "Seconds from a dataset volume's first NodeStageVolume or NodePublishVolume to its data being ready, by how it was made ready (mode: tree, stream, layer, copy).",
			// 0.1 s (a cached tree) to about 7 hours (a large dataset over a slow link).
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 19)}, []string{"mode"})}
}

// start notes the first attempt of volume id; later attempts keep it.
func (c *readyClock) start(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.started[id]; !ok {
		c.started[id] = time.Now()
	}
}

// ready observes volume id's time to ready, made ready by mode, once.
func (c *readyClock) ready(id, mode string) {
	c.mu.Lock()
	t, ok := c.started[id]
	delete(c.started, id)
	c.mu.Unlock()
	if ok {
		c.seconds.WithLabelValues(mode).Observe(time.Since(t).Seconds())
	}
}

// forget drops volume id's attempt (unstaged, unpublished or deleted before it was ready).
func (c *readyClock) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.started, id)
}

// ReadyCollectors are the collectors of the volumes' time to ready.
func (s *Service) ReadyCollectors() []prometheus.Collector {
	return []prometheus.Collector{s.ready.seconds}
}
