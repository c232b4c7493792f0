package volume

// Progress Events of the stagings volumes wait for (docs/datasets.md, "What happens when").
// NodeStageVolume answers Unavailable while a dataset stages and kubelet retries it, so without
// these a claim's owner sees only kubelet's FailedMount Warnings. A volume gets a DatasetStaging
// Event once its staging has run for an interval, the next after twice that, and so on up to a
// longest interval (kubelet's retries add none: the schedule is the volume's, not the call's),
// and DatasetStaged when the data is on the node; a staging done within the first interval posts
// nothing. The doubling is what keeps a long staging to a handful of Events: client-go's
// recorder lets an object have 25 Events of a type, then one per 5 minutes, and drops the rest
// silently (its spam filter), which a fixed 20 s would run dry in 8 minutes, DatasetStaged
// included.

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/units"
)

// The reasons of the staging's Events (Normal), on the claim or the inline volume's pod.
const (
	ReasonDatasetStaging = "DatasetStaging"
	ReasonDatasetStaged  = "DatasetStaged"
)

// The defaults of StagingEvents.Interval and MaxInterval: Events after 20 s, 1 min, 2 min 20 s,
// 5 min, then every 5 min (the recorder's refill rate): a one-minute staging makes 2 Events and
// DatasetStaged, a ten-minute one 5, an hour's 15.
const (
	DefaultStagingEventInterval    = 20 * time.Second
	DefaultStagingEventMaxInterval = 5 * time.Minute
)

// StagingEvents configures the progress Events of the stagings volumes wait for.
type StagingEvents struct {
	// OnEvent, when set, records them (the write-back's recorder, pkg/outputevents).
	OnEvent func(Event)
	// Interval is how long a staging runs before its first Event, and the least time between
	// two Events of one volume, which doubles after each up to MaxInterval (0:
	// DefaultStagingEventInterval, DefaultStagingEventMaxInterval).
	Interval, MaxInterval time.Duration
	// Clock tells the time (nil: the real clock); tests step a fake one.
	Clock clock.PassiveClock
}

// stagingReports are the reports of the volumes waiting for a staging, by volume ID.
type stagingReports struct {
	cfg      StagingEvents
	mu       sync.Mutex
	byVolume map[string]*stagingReport
}

// stagingReport is one volume's wait for its dataset as its Events have told it.
type stagingReport struct {
	obj     ObjectRef
	dataset string
	started time.Time     // when the volume was first seen waiting
	at      time.Time     // the last Event's time (started before the first)
	bytesAt int64         // BytesDone then
	wait    time.Duration // from at to the next Event
	posted  bool          // a DatasetStaging Event went out
}

// newStagingReports returns the reports of cfg, or nil when Events are off.
func newStagingReports(cfg StagingEvents) *stagingReports {
	if cfg.OnEvent == nil {
		return nil
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultStagingEventInterval
	}
	if cfg.MaxInterval <= 0 {
		cfg.MaxInterval = DefaultStagingEventMaxInterval
	}
	cfg.MaxInterval = max(cfg.MaxInterval, cfg.Interval)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &stagingReports{cfg: cfg, byVolume: map[string]*stagingReport{}}
}

// progress takes the status st of the staging volume id waits for: the first call starts the
// volume's report; a DatasetStaging Event about obj is posted once the volume's wait has passed
// since the last one (or since the start), and the wait doubles.
func (r *stagingReports) progress(id string, obj ObjectRef, dataset string, st datasource.Status) {
	if r == nil || st.Ready() {
		return
	}
	now := r.cfg.Clock.Now()
	r.mu.Lock()
	rep := r.byVolume[id]
	if rep == nil {
		r.byVolume[id] = &stagingReport{obj: obj, dataset: dataset, started: now, at: now, bytesAt: st.BytesDone, wait: r.cfg.Interval}
		r.mu.Unlock()
		return
	}
	since := now.Sub(rep.at)
	if since < rep.wait {
		r.mu.Unlock()
		return
	}
	msg := stagingMessage(rep.dataset, st, st.BytesDone-rep.bytesAt, since)
	rep.at, rep.bytesAt, rep.posted = now, st.BytesDone, true
	rep.wait = min(2*rep.wait, r.cfg.MaxInterval)
	r.mu.Unlock()
	// Outside the lock: the recorder may read the claim's UID from the API server.
	r.cfg.OnEvent(Event{Object: rep.obj, Reason: ReasonDatasetStaging, Message: msg})
}

// staged posts DatasetStaged for volume id once its dataset is staged (st), when its report
// posted progress, and forgets the report.
func (r *stagingReports) staged(id string, st datasource.Status) {
	if r == nil {
		return
	}
	now := r.cfg.Clock.Now()
	r.mu.Lock()
	rep := r.byVolume[id]
	delete(r.byVolume, id)
	r.mu.Unlock()
	if rep == nil || !rep.posted {
		return
	}
	r.cfg.OnEvent(Event{Object: rep.obj, Reason: ReasonDatasetStaged,
		Message: fmt.Sprintf("Dataset %s is staged on the node: %s in %s", rep.dataset, units.HumanBytes(st.BytesTotal), roundDuration(now.Sub(rep.started)))})
}

// forget drops volume id's report: its staging failed (the caller's error says so, and the
// next attempt is a staging of its own), or the volume was let go before its data was ready.
func (r *stagingReports) forget(id string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byVolume, id)
}

// stagingMessage is a DatasetStaging Event's message: the progress of st, and the rate of the
// bytes fetched over the last since and the time left at that rate, when both are known.
func stagingMessage(dataset string, st datasource.Status, fetched int64, since time.Duration) string {
	switch {
	case st.Phase == datasource.PhaseListing:
		return fmt.Sprintf("Staging dataset %s: listing its objects", dataset)
	case st.BytesTotal <= 0:
		return fmt.Sprintf("Staging dataset %s: %s", dataset, strings.ToLower(string(st.Phase)))
	}
	progress := units.Progress(st.BytesDone, st.BytesTotal)
	switch {
	case st.Phase == datasource.PhaseSyncing:
		return fmt.Sprintf("Staging dataset %s: %s, writing it to disk", dataset, progress)
	case fetched <= 0 || since <= 0:
		return fmt.Sprintf("Staging dataset %s: %s, nothing fetched in the last %s", dataset, progress, roundDuration(since))
	}
	rate := float64(fetched) / since.Seconds()
	left := time.Duration(float64(max(st.BytesTotal-st.BytesDone, 0)) / rate * float64(time.Second))
	return fmt.Sprintf("Staging dataset %s: %s, %s/s, about %s left", dataset, progress, units.HumanBytes(int64(rate)), roundDuration(left))
}

// roundDuration is d for people: whole seconds ("9s", "3m10s"), "0s" under half a second.
func roundDuration(d time.Duration) string { return d.Round(time.Second).String() }

// stagingWatch is a volume waiting for its dataset, and whom its Events are about.
type stagingWatch struct {
	volumeID string
	obj      ObjectRef
}

// claimWatch is the watch of a volume of a claim, or of an inline volume or a per-pod copy: the
// claim external-provisioner named in the volume's CreateVolume parameters
// (--extra-create-metadata), which its record keeps and no pod author writes; the pod kubelet
// names in a NodePublishVolume's volumeContext (podInfoOnMount: kubelet sets those keys over
// the pod author's attributes). nil when neither names one: then no Events.
func claimWatch(v state.Volume, volumeContext map[string]string) *stagingWatch {
	if v.Ephemeral || v.CopyOf != "" {
		return podWatch(v.ID, volumeContext)
	}
	name, ns := v.Parameters[consts.ParamPVCName], v.Parameters[consts.ParamPVCNamespace]
	if name == "" || ns == "" {
		return nil
	}
	return &stagingWatch{volumeID: v.ID, obj: ObjectRef{Kind: "PersistentVolumeClaim", Namespace: ns, Name: name}}
}

// podWatch is the watch of volume id published to the pod kubelet names in volumeContext; nil
// without one (a NodeStageVolume: a static PV, whose claim no trusted record names).
func podWatch(id string, volumeContext map[string]string) *stagingWatch {
	name, ns, uid := volumeContext[consts.VolumeContextPodName], volumeContext[consts.VolumeContextPodNamespace], volumeContext[consts.VolumeContextPodUID]
	if name == "" || ns == "" || uid == "" {
		return nil
	}
	return &stagingWatch{volumeID: id, obj: ObjectRef{Kind: "Pod", Namespace: ns, Name: name, UID: uid}}
}

// watchStaging reports, every quarter of the first interval until stop is called, the progress of the
// staging of spec on pool that w waits for. stop returns once no report is under way, so that
// DatasetStaged follows the last DatasetStaging.
func (s *Service) watchStaging(w *stagingWatch, pool string, spec *datasource.Spec) (stop func()) {
	r := s.staging
	if r == nil || w == nil {
		return func() {}
	}
	report := func() {
		if st, known, err := s.datasets.Status(pool, spec); err == nil && known {
			r.progress(w.volumeID, w.obj, spec.Source, st)
		}
	}
	report()
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(r.cfg.Interval/4, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				report()
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// endWatch closes w's report after its wait: DatasetStaged once the dataset is staged (st), a
// staging that failed forgotten, one still under way kept for kubelet's retry.
func (s *Service) endWatch(w *stagingWatch, st datasource.Status, err error) {
	switch {
	case w == nil:
	case err != nil:
		s.staging.forget(w.volumeID)
	case st.Ready():
		s.staging.staged(w.volumeID, st)
	}
}
