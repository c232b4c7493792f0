package poolpublisher

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
)

const gi = int64(1) << 30

func localPool(name, node string, total, avail int64) *spv1.StoragePool {
	return &spv1.StoragePool{
		Name:               name,
		Parameters:         map[string]string{consts.ParamPool: name},
		Labels:             map[string]string{"media": "ssd"},
		AccessibleTopology: []*spv1.Topology{{Segments: map[string]string{consts.TopologyKey: node}}},
		TotalBytes:         total,
		AvailableBytes:     avail,
		Healthy:            true,
	}
}

func TestNewDesiredPool(t *testing.T) {
	shared := localPool("nfs", "node-1", 10*gi, 5*gi)
	shared.Shared = true
	multi := localPool("multi", "node-1", gi, gi)
	multi.AccessibleTopology = append(multi.AccessibleTopology, &spv1.Topology{Segments: map[string]string{consts.TopologyKey: "node-2"}})
	noNode := localPool("lost", "", gi, gi)
	tests := []struct {
		name       string
		pool       *spv1.StoragePool
		node       string
		wantName   string
		wantLabels map[string]string
		wantErr    bool
	}{
		{
			name: "node-local pool", pool: localPool("fast", "node-1", gi, gi), node: "node-1", wantName: "fast.node-1",
			wantLabels: map[string]string{consts.LabelPool: "fast", consts.LabelNode: "node-1", "media": "ssd"},
		},
		{
			name: "shared pool", pool: shared, node: "node-1", wantName: "nfs",
			wantLabels: map[string]string{consts.LabelPool: "nfs", consts.LabelShared: "true", "media": "ssd"},
		},
		{
			name: "several nodes in the topology make a pool shared", pool: multi, wantName: "multi",
			wantLabels: map[string]string{consts.LabelPool: "multi", consts.LabelShared: "true", "media": "ssd"},
		},
		{name: "failure case - pool of another node", pool: localPool("fast", "node-2", gi, gi), node: "node-1", wantErr: true},
		{name: "failure case - no node in the topology", pool: noNode, wantErr: true},
		{name: "failure case - no name", pool: localPool("", "node-1", gi, gi), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := newDesiredPool(tc.pool, consts.DriverName, tc.node)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("want an error, got %+v", d)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.name != tc.wantName {
				t.Errorf("name = %q, want %q", d.name, tc.wantName)
			}
			if fmt.Sprint(d.labels) != fmt.Sprint(tc.wantLabels) {
				t.Errorf("labels = %v, want %v", d.labels, tc.wantLabels)
			}
			if d.spec.Driver != consts.DriverName || d.spec.Parameters[consts.ParamPool] != tc.pool.Name {
				t.Errorf("spec = %+v", d.spec)
			}
		})
	}
}

func TestPoolLabelsSkipsInvalidAndReserved(t *testing.T) {
	got := poolLabels(map[string]string{"media": "ssd", "cistern.csi.dev/node": "evil", "bad key!": "x", "tier": "not valid!"})
	if len(got) != 1 || got["media"] != "ssd" {
		t.Errorf("poolLabels = %v, want only media=ssd", got)
	}
}

func TestStatus(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	p := localPool("fast", "node-1", 100*gi, 40*gi)
	p.MaximumVolumeBytes = 40 * gi
	d, err := newDesiredPool(p, consts.DriverName, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	st := d.status(nil, nil, "node-1", 3, now)
	if fmt.Sprint(st.AccessibleNodes) != "[node-1]" {
		t.Errorf("accessibleNodes = %v", st.AccessibleNodes)
	}
	if st.Capacity.Total.Value() != 100*gi || st.Capacity.Available.Value() != 40*gi || st.Capacity.MaximumVolumeSize.Value() != 40*gi {
		t.Errorf("capacity = %+v", st.Capacity)
	}
	if len(st.Conditions) != 1 || st.Conditions[0].Status != metav1.ConditionTrue || st.Conditions[0].Reason != spapi.ReasonPoolHealthy {
		t.Errorf("conditions = %+v", st.Conditions)
	}

	t.Run("unhealthy pool takes the newest error as message", func(t *testing.T) {
		p := localPool("fast", "node-1", gi, 0)
		p.Healthy = false
		p.Errors = []*spv1.StoragePoolError{
			{Time: timestamppb.New(now.Add(-time.Minute)), Message: "old"},
			{Time: timestamppb.New(now), Message: "read-only file system"},
		}
		d, _ := newDesiredPool(p, consts.DriverName, "")
		st := d.status(nil, nil, "", 10, now)
		c := st.Conditions[0]
		if c.Status != metav1.ConditionFalse || c.Reason != spapi.ReasonPoolUnhealthy || c.Message != "read-only file system" {
			t.Errorf("condition = %+v", c)
		}
		if len(st.Errors) != 2 || st.Errors[1].Message != "read-only file system" {
			t.Errorf("errors = %+v", st.Errors)
		}
	})

	t.Run("transition time is kept while the status holds", func(t *testing.T) {
		before := metav1.NewTime(now.Add(-time.Hour))
		current := &spapi.StoragePool{Status: spapi.StoragePoolStatus{Conditions: []metav1.Condition{
			{Type: spapi.ConditionHealthy, Status: metav1.ConditionTrue, LastTransitionTime: before},
		}}}
		current.Generation = 3
		st := d.status(nil, current, "node-1", 10, now)
		if !st.Conditions[0].LastTransitionTime.Equal(&before) || st.Conditions[0].ObservedGeneration != 3 || st.ObservedGeneration != 3 {
			t.Errorf("condition = %+v, observedGeneration %d", st.Conditions[0], st.ObservedGeneration)
		}
	})

	t.Run("shared pool errors name the node", func(t *testing.T) {
		p := localPool("nfs", "node-2", gi, gi)
		p.Shared = true
		p.Errors = []*spv1.StoragePoolError{{Time: timestamppb.New(now), Message: "stale file handle"}}
		d, _ := newDesiredPool(p, consts.DriverName, "node-2")
		st := d.status(nil, nil, "node-2", 10, now)
		if st.Errors[0].Message != "node-2: stale file handle" {
			t.Errorf("errors = %+v", st.Errors)
		}
	})
}

func TestMergeErrorsBounded(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(i int) spapi.StoragePoolError {
		return spapi.StoragePoolError{Time: metav1.NewTime(t0.Add(time.Duration(i) * time.Second)), Message: fmt.Sprintf("e%d", i)}
	}
	var published, reported []spapi.StoragePoolError
	for i := range 8 {
		published = append(published, mk(i))
	}
	for i := 5; i < 15; i++ { // overlaps the published ones
		reported = append(reported, mk(i))
	}
	got := mergeErrors(published, reported, 10)
	if len(got) != 10 {
		t.Fatalf("len = %d, want 10", len(got))
	}
	for i, e := range got {
		if want := fmt.Sprintf("e%d", i+5); e.Message != want {
			t.Errorf("errors[%d] = %q, want %q (newest kept, oldest first, no duplicates)", i, e.Message, want)
		}
	}
	// Sub-second times collapse to what the API stores, so they do not count as new errors.
	withNanos := spapi.StoragePoolError{Time: metav1.NewTime(t0.Add(5*time.Second + 300*time.Millisecond)), Message: "e5"}
	if got := mergeErrors(got, []spapi.StoragePoolError{withNanos}, 10); len(got) != 10 || got[0].Message != "e5" {
		t.Errorf("a sub-second duplicate changed the log: %+v", got)
	}
	long := spapi.StoragePoolError{Time: metav1.NewTime(t0), Message: string(make([]byte, 5000))}
	if got := mergeErrors(nil, []spapi.StoragePoolError{long}, 10); len(got[0].Message) != maxMessageLen {
		t.Errorf("message length %d, want %d", len(got[0].Message), maxMessageLen)
	}
}

func timestamp(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// TestStatusPrinted: the printer columns' sizes are the exact quantities in human units; a
// shared pool prints no cache, as it publishes none.
func TestStatusPrinted(t *testing.T) {
	now := time.Now()
	p := localPool("fast", "node-1", 65795028<<10, 3328599654)
	p.Cache = &spv1.DatasetCache{Bytes: 12800 << 20}
	d, _ := newDesiredPool(p, consts.DriverName, "")
	got := d.status(nil, nil, "", 10, now).Printed
	want := &spapi.PrintedSizes{Total: "62.7 GiB", Available: "3.1 GiB", Cached: "12.5 GiB"}
	if *got != *want {
		t.Errorf("printed = %+v, want %+v", got, want)
	}
	p.Shared = true
	d, _ = newDesiredPool(p, consts.DriverName, "node-1")
	if got := d.status(nil, nil, "node-1", 10, now).Printed; got.Cached != "" || got.Total != "62.7 GiB" {
		t.Errorf("shared pool printed = %+v, want no cache", got)
	}
}
