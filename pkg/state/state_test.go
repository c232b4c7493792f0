package state

import (
	"os"
	"path/filepath"
	"testing"
)

func TestStoreSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	v := Volume{ID: "fast-1", Name: "pvc-1", Pool: "fast", CapacityBytes: 1 << 20, AccessType: Mount,
		Parameters: map[string]string{"pool": "fast"}, Ready: true, Published: map[string]bool{"/t": true}}
	if err := s.PutVolume(v); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSnapshot(Snapshot{ID: "fast-snap-1", Name: "snap", SourceVolumeID: "fast-1", Pool: "fast", Ready: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutGroupSnapshot(GroupSnapshot{ID: "group-1", Name: "g", SnapshotIDs: []string{"fast-snap-1"}, Ready: true}); err != nil {
		t.Fatal(err)
	}
	// A write interrupted by a crash leaves a temporary file; reopening removes it.
	if err := os.WriteFile(filepath.Join(dir, "volumes", ".tmp-123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := s2.GetVolumeByName("pvc-1")
	if !ok || got.ID != "fast-1" || got.Parameters["pool"] != "fast" || !got.Published["/t"] {
		t.Fatalf("volume after reopen: %+v", got)
	}
	if _, ok := s2.GetSnapshotByName("snap"); !ok {
		t.Fatal("snapshot lost")
	}
	if g, ok := s2.GetGroupSnapshot("group-1"); !ok || len(g.SnapshotIDs) != 1 {
		t.Fatal("group snapshot lost")
	}
	if _, err := os.Stat(filepath.Join(dir, "volumes", ".tmp-123")); !os.IsNotExist(err) {
		t.Fatal("temporary file not cleaned")
	}

	// Copies are independent of the store.
	got.Parameters["pool"] = "changed"
	if again, _ := s2.GetVolume("fast-1"); again.Parameters["pool"] != "fast" {
		t.Fatal("GetVolume returned shared state")
	}

	// Renaming keeps the name index right; deleting twice is fine.
	v.Name = "pvc-renamed"
	if err := s2.PutVolume(v); err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.GetVolumeByName("pvc-1"); ok {
		t.Fatal("old name still indexed")
	}
	for i := 0; i < 2; i++ {
		if err := s2.DeleteVolume("fast-1"); err != nil {
			t.Fatal(err)
		}
	}
	if len(s2.ListVolumes()) != 0 {
		t.Fatal("volume not deleted")
	}
}

func TestCorruptRecordIsQuarantined(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutVolume(Volume{ID: "fast-1", Name: "pvc-1", Ready: true}); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		"fast-2.json": `{"id": "fast-2", "na`, // truncated by a power loss
		"fast-3.json": `{"id": "other"}`,      // not the record its name says
		"fast-4.json": ``,
	} {
		if err := os.WriteFile(filepath.Join(dir, "volumes", name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err = Open(dir)
	if err != nil {
		t.Fatalf("Open with corrupt records: %v", err)
	}
	if _, ok := s.GetVolume("fast-1"); !ok || len(s.ListVolumes()) != 1 {
		t.Fatalf("volumes %+v, want only fast-1", s.ListVolumes())
	}
	if q := s.Quarantined(); len(q) != 3 {
		t.Fatalf("quarantined %v, want 3", q)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "volumes", "*.corrupt-*"))
	if len(left) != 3 {
		t.Fatalf("quarantined files %v, want 3 kept for inspection", left)
	}
	if s, err = Open(dir); err != nil || len(s.Quarantined()) != 0 {
		t.Fatalf("reopen: %v, quarantined again %v", err, s.Quarantined())
	}
}

func TestTreeVolumesSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	tv := TreeVolume{ID: "imagenet-static", Pool: "fast", DatasetID: "abc", Path: "/staging/x", Parameters: map[string]string{"source": "s3://b"}}
	if err := s.PutTreeVolume(tv); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTreeVolume(TreeVolume{ID: "inline-1", Pool: "fast", Inline: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTreeVolume("inline-1"); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := s.GetTreeVolume("imagenet-static")
	if !ok || got.DatasetID != "abc" || got.Parameters["source"] != "s3://b" {
		t.Fatalf("reopened record %+v %v", got, ok)
	}
	got.Parameters["source"] = "changed"
	if again, _ := s.GetTreeVolume("imagenet-static"); again.Parameters["source"] != "s3://b" {
		t.Fatal("a returned record shares its map with the store")
	}
	if l := s.ListTreeVolumes(); len(l) != 1 {
		t.Fatalf("records %+v, want one", l)
	}
}
