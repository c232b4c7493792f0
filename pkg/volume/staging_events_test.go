package volume

import (
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/state"
)

const gib = int64(1) << 30

// fetching is a staging's status: done of total bytes fetched.
func fetching(done, total int64) datasource.Status {
	return datasource.Status{Dataset: "s3://bucket/prefix/", Phase: datasource.PhaseFetching, BytesDone: done, BytesTotal: total}
}

// TestStagingEventsRateLimited steps a fake clock through one volume's staging, polled every
// 5s as watchStaging does: nothing in the first interval, then one DatasetStaging after 20s, 40s
// more, 80s more (however often it is polled, and across kubelet's retries), up to one per 5
// minutes, with the rate since the last one and the time left at it, and DatasetStaged at the
// end.
func TestStagingEventsRateLimited(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC))
	var got []Event
	r := newStagingReports(StagingEvents{OnEvent: func(e Event) { got = append(got, e) }, Clock: clk})
	claim := ObjectRef{Kind: "PersistentVolumeClaim", Namespace: "team", Name: "data"}
	const total = 3 * gib
	done := int64(0)
	step := func(d time.Duration, fetched int64) {
		clk.SetTime(clk.Now().Add(d))
		done += fetched
		r.progress("v1", claim, "s3://bucket/prefix/", fetching(done, total))
	}
	wantEvents := func(when string, n int, suffix string) {
		t.Helper()
		if len(got) != n {
			t.Fatalf("%s: %d Events, want %d: %+v", when, len(got), n, got)
		}
		if n == 0 {
			return
		}
		if e := got[n-1]; e.Object != claim || e.Warning || e.Reason != ReasonDatasetStaging || !strings.HasSuffix(e.Message, suffix) {
			t.Fatalf("%s: Event %+v, want Normal %s on %+v ending %q", when, e, ReasonDatasetStaging, claim, suffix)
		}
	}
	step(0, 0)
	for range 3 { // 15s at 100 MiB per 5s: within the first interval
		step(5*time.Second, 100<<20)
	}
	wantEvents("15s", 0, "")
	step(5*time.Second, 100<<20) // 20s: 400 MiB in 20s
	if want := "Staging dataset s3://bucket/prefix/: 400.0 MiB of 3.0 GiB, 13%, 20.0 MiB/s, about 2m14s left"; len(got) != 1 || got[0].Message != want {
		t.Fatalf("20s: %+v, want %q", got, want)
	}
	for range 7 {
		step(5*time.Second, 50<<20) // 55s: 350 MiB more in 35s
	}
	wantEvents("55s", 1, "")
	step(5*time.Second, 50<<20) // 60s: 400 MiB in the 40s since
	wantEvents("60s", 2, ": 800.0 MiB of 3.0 GiB, 26%, 10.0 MiB/s, about 3m47s left")
	// kubelet's retry after two minutes' backoff: the staging went on meanwhile; the first poll
	// of the new call posts (80s have passed), with the rate over the whole gap.
	step(2*time.Minute, 1200<<20)
	wantEvents("180s", 3, ": 2.0 GiB of 3.0 GiB, 65%, 10.0 MiB/s, about 1m47s left")
	// Stalled: no rate, no time left; the wait was 160s, the next is 5 minutes, not 320s.
	step(160*time.Second, 0)
	wantEvents("340s", 4, ": 2.0 GiB of 3.0 GiB, 65%, nothing fetched in the last 2m40s")
	step(299*time.Second, 0)
	wantEvents("639s", 4, "")
	step(time.Second, 0)
	wantEvents("640s", 5, "nothing fetched in the last 5m0s")
	clk.SetTime(clk.Now().Add(time.Minute))
	r.staged("v1", datasource.Status{Dataset: "s3://bucket/prefix/", Phase: datasource.PhaseReady, BytesDone: total, BytesTotal: total})
	want := "Dataset s3://bucket/prefix/ is staged on the node: 3.0 GiB in 11m40s"
	if len(got) != 6 || got[5].Reason != ReasonDatasetStaged || got[5].Warning || got[5].Message != want || got[5].Object != claim {
		t.Fatalf("staged: %+v, want Normal %s %q", got, ReasonDatasetStaged, want)
	}
	if len(r.byVolume) != 0 {
		t.Errorf("reports kept after DatasetStaged: %+v", r.byVolume)
	}
}

// TestStagingEventsQuickStaging: a staging done within the first interval posts nothing, not
// even DatasetStaged; one that failed is forgotten, and its next attempt starts a new interval.
func TestStagingEventsQuickStaging(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC))
	var got []Event
	r := newStagingReports(StagingEvents{OnEvent: func(e Event) { got = append(got, e) }, Clock: clk, Interval: 30 * time.Second})
	claim := ObjectRef{Kind: "PersistentVolumeClaim", Namespace: "team", Name: "data"}
	r.progress("v1", claim, "s3://b/p/", fetching(0, gib))
	clk.SetTime(clk.Now().Add(29 * time.Second))
	r.progress("v1", claim, "s3://b/p/", fetching(gib/2, gib))
	r.staged("v1", fetching(gib, gib))
	if len(got) != 0 {
		t.Fatalf("a staging of 29s posted %+v", got)
	}
	r.progress("v2", claim, "s3://b/p/", datasource.Status{Phase: datasource.PhaseListing})
	clk.SetTime(clk.Now().Add(20 * time.Second))
	r.forget("v2") // failed
	r.progress("v2", claim, "s3://b/p/", datasource.Status{Phase: datasource.PhaseListing})
	clk.SetTime(clk.Now().Add(20 * time.Second))
	r.progress("v2", claim, "s3://b/p/", datasource.Status{Phase: datasource.PhaseListing})
	if len(got) != 0 {
		t.Fatalf("the failed attempt's interval carried over: %+v", got)
	}
	clk.SetTime(clk.Now().Add(10 * time.Second))
	r.progress("v2", claim, "s3://b/p/", datasource.Status{Phase: datasource.PhaseListing})
	if len(got) != 1 || got[0].Message != "Staging dataset s3://b/p/: listing its objects" {
		t.Fatalf("listing: %+v", got)
	}
	// Events off: no reports at all.
	if off := newStagingReports(StagingEvents{}); off != nil {
		t.Errorf("reports without OnEvent: %+v", off)
	}
}

// TestStagingEventObject: only what the driver trusts names the object of a staging's Events:
// a provisioned volume's record (external-provisioner's claim), kubelet's pod info for an
// inline volume or a per-pod copy; never the volume context of a stage, which for a static PV
// (or an inline volume's attributes) its author writes.
func TestStagingEventObject(t *testing.T) {
	claimParams := map[string]string{consts.ParamPVCName: "data", consts.ParamPVCNamespace: "team"}
	pod := map[string]string{consts.VolumeContextPodName: "p", consts.VolumeContextPodNamespace: "team", consts.VolumeContextPodUID: "uid-1"}
	forged := map[string]string{consts.ParamPVCName: "theirs", consts.ParamPVCNamespace: "other-team"}
	for _, tc := range []struct {
		name string
		v    state.Volume
		ctx  map[string]string
		want *ObjectRef
	}{
		{"claim from the record", state.Volume{ID: "v", Parameters: claimParams}, forged,
			&ObjectRef{Kind: "PersistentVolumeClaim", Namespace: "team", Name: "data"}},
		{"record without the claim", state.Volume{ID: "v", Parameters: map[string]string{}}, forged, nil},
		{"inline volume: the pod", state.Volume{ID: "v", Ephemeral: true, Parameters: forged}, pod,
			&ObjectRef{Kind: "Pod", Namespace: "team", Name: "p", UID: "uid-1"}},
		{"inline volume naming a claim", state.Volume{ID: "v", Ephemeral: true, Parameters: forged}, forged, nil},
		{"per-pod copy: the pod", state.Volume{ID: "v", CopyOf: "cistern-vm-x", Parameters: forged}, pod,
			&ObjectRef{Kind: "Pod", Namespace: "team", Name: "p", UID: "uid-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := claimWatch(tc.v, tc.ctx)
			switch {
			case tc.want == nil && w != nil:
				t.Errorf("Events on %+v, want none", w.obj)
			case tc.want != nil && (w == nil || w.obj != *tc.want || w.volumeID != "v"):
				t.Errorf("watch %+v, want Events on %+v", w, *tc.want)
			}
		})
	}
}
