package poolpublisher

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
)

var cacheT0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func cachedDataset(id string, state spv1.DatasetState, done, total int64, refs int32, used time.Duration) *spv1.CachedDataset {
	return &spv1.CachedDataset{Id: id, Source: "s3://models/" + id, Scheme: "s3", State: state, BytesDone: done,
		BytesTotal: total, References: refs, LastUsed: timestamppb.New(cacheT0.Add(used).Add(300 * time.Millisecond))}
}

func poolWithCache(datasets ...*spv1.CachedDataset) *spv1.StoragePool {
	p := localPool("fast", "node-1", 100*gi, 60*gi)
	c := &spv1.DatasetCache{Total: int32(len(datasets))}
	for _, d := range datasets {
		c.Bytes += d.BytesDone
		switch d.State {
		case spv1.DatasetState_DATASET_STATE_READY:
			c.Ready++
		case spv1.DatasetState_DATASET_STATE_STAGING:
			c.Staging++
		case spv1.DatasetState_DATASET_STATE_FAILED:
			c.Failed++
		}
	}
	c.Datasets = datasets
	p.Cache = c
	return p
}

const (
	ready   = spv1.DatasetState_DATASET_STATE_READY
	staging = spv1.DatasetState_DATASET_STATE_STAGING
)

// TestSyncPublishesCacheOnlyOnChange follows a node's cache through staging, readiness and
// eviction: each change is one status apply (plus a labels apply when the Ready set changes),
// and an unchanged cache writes nothing.
func TestSyncPublishesCacheOnlyOnChange(t *testing.T) {
	e := newEnv(t)
	r := e.reconciler(t, "node-1")
	label := func(id string) string { return consts.LabelDatasetPrefix + id }

	e.driver.set(poolWithCache(
		cachedDataset("aaaa", ready, gi, gi, 1, -time.Hour),
		cachedDataset("bbbb", staging, gi/4, gi, 0, 0),
	))
	if writes := e.sync(t, r); len(writes) != 2 {
		t.Fatalf("first sync wrote %v", writes)
	}
	obj := e.api.Get("fast.node-1")
	c := obj.Status.Cache
	if c == nil || c.Bytes.Value() != gi+gi/4 || c.Total != 2 || c.Ready != 1 || c.Staging != 1 || len(c.Datasets) != 2 {
		t.Fatalf("cache = %+v", c)
	}
	a := c.Datasets[0]
	if a.ID != "aaaa" || a.State != spapi.DatasetReady || a.Source != "s3://models/aaaa" || a.References != 1 ||
		!a.LastUsed.Time.Equal(cacheT0.Add(-time.Hour)) {
		t.Errorf("dataset a = %+v", a)
	}
	if obj.Labels[label("aaaa")] != "true" || obj.Labels[label("bbbb")] != "" {
		t.Errorf("labels = %v, want only the Ready dataset", obj.Labels)
	}

	t.Run("unchanged, nothing written", func(t *testing.T) {
		for range 3 {
			if writes := e.sync(t, r); len(writes) != 0 {
				t.Fatalf("writes = %v, want none", writes)
			}
		}
	})
	t.Run("progress is one status apply", func(t *testing.T) {
		e.driver.set(poolWithCache(
			cachedDataset("aaaa", ready, gi, gi, 1, -time.Hour),
			cachedDataset("bbbb", staging, gi/2, gi, 0, 0),
		))
		if writes := e.sync(t, r); !slices.Equal(writes, []string{"apply_status fast.node-1"}) {
			t.Errorf("writes = %v", writes)
		}
	})
	t.Run("ready adds its label", func(t *testing.T) {
		e.driver.set(poolWithCache(
			cachedDataset("bbbb", ready, gi, gi, 1, time.Minute),
			cachedDataset("aaaa", ready, gi, gi, 1, -time.Hour),
		))
		if writes := e.sync(t, r); !slices.Equal(writes, []string{"apply fast.node-1", "apply_status fast.node-1"}) {
			t.Errorf("writes = %v", writes)
		}
		if obj := e.api.Get("fast.node-1"); obj.Labels[label("bbbb")] != "true" || obj.Labels[label("aaaa")] != "true" {
			t.Errorf("labels = %v", obj.Labels)
		}
	})
	t.Run("evicted, its entry and label go", func(t *testing.T) {
		e.driver.set(poolWithCache(cachedDataset("bbbb", ready, gi, gi, 1, time.Minute)))
		if writes := e.sync(t, r); !slices.Equal(writes, []string{"apply fast.node-1", "apply_status fast.node-1"}) {
			t.Errorf("writes = %v", writes)
		}
		obj := e.api.Get("fast.node-1")
		if _, ok := obj.Labels[label("aaaa")]; ok || len(obj.Status.Cache.Datasets) != 1 || obj.Status.Cache.Total != 1 {
			t.Errorf("after eviction: labels %v, cache %+v", obj.Labels, obj.Status.Cache)
		}
		if writes := e.sync(t, r); len(writes) != 0 {
			t.Errorf("writes = %v, want none", writes)
		}
	})
	t.Run("a restarted sidecar writes nothing", func(t *testing.T) {
		if writes := e.sync(t, e.reconciler(t, "node-1")); len(writes) != 0 {
			t.Errorf("writes = %v, want none", writes)
		}
	})
}

// TestSyncCapsCachedDatasets keeps at most MaxCachedDatasets entries, whatever the driver sends;
// the counts still cover every dataset.
func TestSyncCapsCachedDatasets(t *testing.T) {
	e := newEnv(t)
	r, err := NewReconciler(Config{DriverName: consts.DriverName, NodeName: "node-1", ResyncPeriod: time.Hour, MaxCachedDatasets: 2},
		startFakeDriver(t, e.driver, 1), e.api, e.api, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.driver.set(poolWithCache(
		cachedDataset("a1", ready, 1, 1, 0, 3*time.Second),
		cachedDataset("a2", ready, 1, 1, 0, 2*time.Second),
		cachedDataset("a3", ready, 1, 1, 0, time.Second),
	))
	e.sync(t, r)
	obj := e.api.Get("fast.node-1")
	if c := obj.Status.Cache; len(c.Datasets) != 2 || c.Total != 3 || c.Ready != 3 || c.Datasets[0].ID != "a1" {
		t.Errorf("cache = %+v", c)
	}
	if _, ok := obj.Labels[consts.LabelDatasetPrefix+"a3"]; ok {
		t.Errorf("labels = %v: a dataset not listed is labelled", obj.Labels)
	}
}

// TestSharedPoolHasNoCache: a shared pool's cache is the same files on every node, so no node
// publishes it.
func TestSharedPoolHasNoCache(t *testing.T) {
	p := poolWithCache(cachedDataset("aaaa", ready, gi, gi, 0, 0))
	p.Shared = true
	d, err := newDesiredPool(p, consts.DriverName, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if st := d.status(nil, nil, "node-1", 10, cacheT0); st.Cache != nil {
		t.Errorf("cache = %+v", st.Cache)
	}
	if _, ok := d.labels[consts.LabelDatasetPrefix+"aaaa"]; ok {
		t.Errorf("labels = %v", d.labels)
	}
}
