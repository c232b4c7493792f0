package pool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cistern-csi/cistern/test/testutil"
)

func TestManagerHealth(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := os.Mkdir(good, 0o755); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	m := NewManager(&Config{Pools: []Spec{{Name: "good", Path: good}, {Name: "gone", Path: missing}}})
	gen0 := m.Generation()
	changed := m.Changed()
	m.Refresh()
	select {
	case <-changed:
	default:
		t.Fatal("first refresh did not signal a change")
	}
	if m.Generation() == gen0 {
		t.Fatal("generation did not move")
	}
	p, _ := m.Get("good")
	if !p.Healthy || p.TotalBytes == 0 || p.AvailableBytes == 0 {
		t.Fatalf("good pool: %+v", p)
	}
	g, _ := m.Get("gone")
	if g.Healthy || !strings.Contains(g.Message, "does not exist") || len(g.Errors) != 1 {
		t.Fatalf("missing pool: %+v", g)
	}

	// Nothing changed: no new generation, no new error.
	gen1 := m.Generation()
	m.Refresh()
	if m.Generation() != gen1 {
		t.Fatal("refresh without changes moved the generation")
	}
	g, _ = m.Get("gone")
	if len(g.Errors) != 1 {
		t.Fatalf("repeated problem recorded again: %v", g.Errors)
	}

	// The path appears: healthy again.
	if err := os.Mkdir(missing, 0o755); err != nil {
		t.Fatal(err)
	}
	m.Refresh()
	g, _ = m.Get("gone")
	if !g.Healthy || g.Message != "" {
		t.Fatalf("pool did not recover: %+v", g)
	}

	// A pool removed from the config disappears.
	m.SetConfig(&Config{Pools: []Spec{{Name: "good", Path: good}}})
	if _, ok := m.Get("gone"); ok {
		t.Fatal("removed pool still listed")
	}
}

func TestErrorsAreBounded(t *testing.T) {
	m := NewManager(&Config{Pools: []Spec{{Name: "a", Path: t.TempDir()}}})
	for i := 0; i < 3*DefaultMaxErrors; i++ {
		m.RecordError("a", "boom")
	}
	p, _ := m.Get("a")
	if len(p.Errors) != DefaultMaxErrors {
		t.Fatalf("want %d errors, got %d", DefaultMaxErrors, len(p.Errors))
	}
}

// TestReadOnlyAndFullPool uses a real filesystem: remounted read-only, then filled up.
func TestReadOnlyAndFullPool(t *testing.T) {
	mnt := testutil.LoopFS(t, "ext4", 64<<20)
	m := NewManager(&Config{Pools: []Spec{{Name: "p", Path: mnt}}})
	m.Refresh()
	if p, _ := m.Get("p"); !p.Healthy {
		t.Fatalf("fresh pool unhealthy: %s", p.Message)
	}

	testutil.Run(t, "mount", "-o", "remount,ro", mnt)
	m.Refresh()
	p, _ := m.Get("p")
	if p.Healthy || !strings.Contains(p.Message, "read-only") {
		t.Fatalf("read-only pool: healthy=%v message=%q", p.Healthy, p.Message)
	}
	testutil.Run(t, "mount", "-o", "remount,rw", mnt)
	m.Refresh()
	if p, _ := m.Get("p"); !p.Healthy {
		t.Fatalf("pool did not recover after remount rw: %s", p.Message)
	}

	// Fill it: dd stops at ENOSPC.
	_, _ = testutil.RunAllowFail("dd", "if=/dev/zero", "of="+filepath.Join(mnt, "fill"), "bs=1M")
	m.Refresh()
	p, _ = m.Get("p")
	if p.Healthy || !strings.Contains(p.Message, "full") {
		t.Fatalf("full pool: healthy=%v message=%q", p.Healthy, p.Message)
	}
	if len(p.Errors) < 2 {
		t.Fatalf("want the read-only and full errors recorded, got %v", p.Errors)
	}
}

// TestUnmountedPoolIsDetected: the mount goes away but the directory stays.
func TestUnmountedPoolIsDetected(t *testing.T) {
	mnt := testutil.LoopFS(t, "ext4", 32<<20)
	m := NewManager(&Config{Pools: []Spec{{Name: "p", Path: mnt}}})
	m.Refresh()
	testutil.Run(t, "umount", mnt)
	m.Refresh()
	p, _ := m.Get("p")
	if p.Healthy || !strings.Contains(p.Message, "still mounted") {
		t.Fatalf("unmounted pool: healthy=%v message=%q", p.Healthy, p.Message)
	}
}
