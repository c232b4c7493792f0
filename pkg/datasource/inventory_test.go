package datasource_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource"
)

func findDataset(inv datasource.Inventory, id string) *datasource.CachedDataset {
	for i := range inv.Datasets {
		if inv.Datasets[i].ID == id {
			return &inv.Datasets[i]
		}
	}
	return nil
}

func inventory(t *testing.T, m *datasource.Manager, pool string, max int) datasource.Inventory {
	t.Helper()
	inv, err := m.Inventory(pool, max)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestInventory follows datasets through a pool's cache: staged, used by a volume, failed, a
// tenant's, and the list capped to the most recently used; every change moves the generation.
func TestInventory(t *testing.T) {
	ctx := testCtx(t)
	src := t.TempDir()
	for i, name := range []string{"a", "b", "c"} {
		smallTree(uint64(i), 5, 1000).writeDir(t, filepath.Join(src, name))
	}
	pool := t.TempDir()
	m := newManager(t, datasource.Config{LocalSourceRoots: []string{src}})
	spec := func(name string) *datasource.Spec {
		return mustSpec(t, map[string]string{"source": "file://" + filepath.Join(src, name)})
	}

	if inv := inventory(t, m, pool, 0); inv.Total != 0 || len(inv.Datasets) != 0 || inv.Bytes != 0 {
		t.Fatalf("empty pool: %+v", inv)
	}
	gen0, changed := m.InventoryGeneration()

	st, err := stage(ctx, t, m, datasource.Request{Spec: spec("a"), Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("staging did not signal a change")
	}
	inv := inventory(t, m, pool, 0)
	a := findDataset(inv, spec("a").ID())
	if a == nil || a.State != datasource.DatasetReady || a.BytesDone != st.BytesTotal || a.BytesTotal != st.BytesTotal ||
		a.Source != "file://"+filepath.Join(src, "a") || a.Scheme != datasource.SchemeLocal || a.References != 0 || a.LastUsed.IsZero() {
		t.Fatalf("after staging: %+v (status %+v)", a, st)
	}
	if inv.Total != 1 || inv.Ready != 1 || inv.Bytes != st.BytesTotal {
		t.Fatalf("counts: %+v", inv)
	}

	// A volume bind-mounts it: one reference, until released.
	gen1, _ := m.InventoryGeneration()
	if _, err := m.Acquire(pool, spec("a"), "", "vol-1"); err != nil {
		t.Fatal(err)
	}
	if gen, _ := m.InventoryGeneration(); gen == gen1 || gen1 == gen0 {
		t.Fatalf("generation did not move: %d %d %d", gen0, gen1, gen)
	}
	if a := findDataset(inventory(t, m, pool, 0), spec("a").ID()); a.References != 1 {
		t.Fatalf("after acquire: %+v", a)
	}
	if err := m.ReleaseID(pool, spec("a").ID(), "vol-1"); err != nil {
		t.Fatal(err)
	}
	if a := findDataset(inventory(t, m, pool, 0), spec("a").ID()); a.References != 0 {
		t.Fatalf("after release: %+v", a)
	}

	// A failed attempt shows its kind only, after its caller heard of it, until the next one.
	dataset{"x.bin": []byte("x")}.writeDir(t, filepath.Join(src, "unsafe"))
	if err := os.Symlink("/etc/passwd", filepath.Join(src, "unsafe", "passwd")); err != nil {
		t.Fatal(err)
	}
	unsafe := spec("unsafe")
	if _, err := stage(ctx, t, m, datasource.Request{Spec: unsafe, Pool: pool}); err == nil {
		t.Fatal("a dataset with a symlink out of it staged")
	}
	inv = inventory(t, m, pool, 0)
	if f := findDataset(inv, unsafe.ID()); f == nil || f.State != datasource.DatasetFailed || f.Reason != "Unsafe" || inv.Failed != 1 {
		t.Fatalf("failed: %+v in %+v", f, inv)
	}

	// A tenant's dataset: its source is not shown.
	tenant := spec("b")
	tenant.Tenant = true
	if _, err := stage(ctx, t, m, datasource.Request{Spec: tenant, Pool: pool}); err != nil {
		t.Fatal(err)
	}
	if b := findDataset(inventory(t, m, pool, 0), tenant.ID()); b == nil || b.Source != "" || !b.Tenant || b.Scheme != datasource.SchemeLocal {
		t.Fatalf("tenant dataset: %+v", b)
	}

	// Capped: the most recently used first, the counts still over all.
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec("c"), Pool: pool}); err != nil {
		t.Fatal(err)
	}
	inv = inventory(t, m, pool, 2)
	if len(inv.Datasets) != 2 || inv.Total != 4 || inv.Ready != 3 || inv.Failed != 1 || inv.Datasets[0].ID != spec("c").ID() {
		t.Fatalf("capped: %+v", inv)
	}
	if inv.Datasets[0].LastUsed.Before(inv.Datasets[1].LastUsed) {
		t.Fatalf("not most recent first: %+v", inv.Datasets)
	}
}

// TestInventoryStaging shows a dataset being staged with its progress, and the generation moving
// every ProgressInterval while it is, so that published progress follows.
func TestInventoryStaging(t *testing.T) {
	ctx := testCtx(t)
	src := t.TempDir()
	dataset{"a.bin": randBytes(1, 3<<20), "b.bin": randBytes(2, 3<<20)}.writeDir(t, src)
	pool := t.TempDir()
	m := newManager(t, datasource.Config{LocalSourceRoots: []string{src}, BandwidthBytesPerSec: 2 << 20,
		ProgressInterval: 50 * time.Millisecond})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go m.Run(runCtx)
	spec := mustSpec(t, map[string]string{"source": "file://" + src})
	if _, err := m.Ensure(ctx, datasource.Request{Spec: spec, Pool: pool}); err != nil {
		t.Fatal(err)
	}
	var seen datasource.CachedDataset
	moves := 0
	for seen.BytesTotal == 0 || moves < 2 {
		gen, changed := m.InventoryGeneration()
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("no progress while staging; last %+v", seen)
		}
		if g, _ := m.InventoryGeneration(); g > gen {
			moves++
		}
		d := findDataset(inventory(t, m, pool, 0), spec.ID())
		if d == nil {
			t.Fatal("the dataset being staged is not listed")
		}
		if d.State == datasource.DatasetReady {
			t.Fatalf("staged before its progress was seen twice: %+v", d)
		}
		seen = *d
	}
	if seen.State != datasource.DatasetStaging || seen.BytesTotal != 6<<20 || seen.BytesDone > seen.BytesTotal ||
		seen.Source != spec.Source || seen.LastUsed.IsZero() {
		t.Fatalf("staging: %+v", seen)
	}
	if inv := inventory(t, m, pool, 0); inv.Staging != 1 || inv.Total != 1 {
		t.Fatalf("counts: %+v", inv)
	}
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: pool}); err != nil {
		t.Fatal(err)
	}
	if d := findDataset(inventory(t, m, pool, 0), spec.ID()); d.State != datasource.DatasetReady || d.BytesDone != 6<<20 {
		t.Fatalf("ready: %+v", d)
	}
}
