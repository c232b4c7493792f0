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
// 5s as watchStaging does: nothing in the first interval, then one DatasetStaging per interval
// (however often it is polled, and across kubelet's retries), with the rate of the last interval
// and the time left at it, and DatasetStaged at the end.
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
	step(0, 0)
	for range 3 { // 15s at 100 MiB per 5s: within the first interval
		step(5*time.Second, 100<<20)
	}
	if len(got) != 0 {
		t.Fatalf("Events within the first interval: %+v", got)
	}
	step(5*time.Second, 100<<20) // 20s: 400 MiB in 20s
	for range 3 {
		step(5*time.Second, 50<<20) // 35s: 150 MiB more in 15s
	}
	if len(got) != 1 {
		t.Fatalf("%d Events in 35s, want 1: %+v", len(got), got)
	}
	step(5*time.Second, 50<<20) // 40s: 200 MiB in 20s, 600 MiB done
	if len(got) != 2 {
		t.Fatalf("%d Events in 40s, want 2: %+v", len(got), got)
	}
	for i, want := range []string{
		"Staging dataset s3://bucket/prefix/: 400.0 MiB of 3.0 GiB, 13%, 20.0 MiB/s, about 2m14s left",
		"Staging dataset s3://bucket/prefix/: 600.0 MiB of 3.0 GiB, 19%, 10.0 MiB/s, about 4m7s left",
	} {
		if e := got[i]; e.Object != claim || e.Warning || e.Reason != ReasonDatasetStaging || e.Message != want {
			t.Errorf("Event %d: %+v, want Normal %s %q on %+v", i, e, ReasonDatasetStaging, want, claim)
		}
	}
	// kubelet's retry after a minute's backoff: the staging went on meanwhile; the first poll of
	// the new call posts, with the rate over the whole gap.
	step(time.Minute, 600<<20)
	if len(got) != 3 || !strings.HasSuffix(got[2].Message, ": 1.2 GiB of 3.0 GiB, 39%, 10.0 MiB/s, about 3m7s left") {
		t.Fatalf("after the retry: %+v", got)
	}
	// Stalled: no rate, no time left.
	step(30*time.Second, 0)
	if len(got) != 4 || !strings.HasSuffix(got[3].Message, "1.2 GiB of 3.0 GiB, 39%, nothing fetched in the last 30s") {
		t.Fatalf("stalled: %+v", got)
	}
	clk.SetTime(clk.Now().Add(time.Minute))
	r.staged("v1", datasource.Status{Dataset: "s3://bucket/prefix/", Phase: datasource.PhaseReady, BytesDone: total, BytesTotal: total})
	want := "Dataset s3://bucket/prefix/ is staged on the node: 3.0 GiB in 3m10s"
	if len(got) != 5 || got[4].Reason != ReasonDatasetStaged || got[4].Warning || got[4].Message != want || got[4].Object != claim {
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
