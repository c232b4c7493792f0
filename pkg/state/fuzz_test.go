package state

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzRecord: whatever a record file holds after a crash, a disk error or a hand edit, Open
// neither fails nor panics: the record is loaded (and then kept by a reopen) or quarantined and
// reported, and the other records of the table are loaded. The record is written as <id>.json
// into one of the four tables.
func FuzzRecord(f *testing.F) {
	f.Add(uint8(0), "fast-1", []byte(`{"id":"fast-1","name":"pvc-1","pool":"fast","capacityBytes":1048576,"accessType":"mount","ready":true}`))
	f.Add(uint8(1), "snap-1", []byte(`{"id":"snap-1","name":"s","sourceVolumeID":"fast-1","pool":"fast","ready":true}`))
	f.Add(uint8(2), "tree-1", []byte(`{"id":"tree-1","pool":"fast","datasetID":"abc","path":"/var/lib/kubelet/x"}`))
	f.Add(uint8(3), "group-1", []byte(`{"id":"group-1","name":"g","snapshotIDs":["snap-1"],"ready":true}`))
	f.Add(uint8(0), "fast-2", []byte(`{"id":"fast-2","name":"pvc-1"`))
	f.Add(uint8(0), "fast-3", []byte(`{"id":"other"}`))
	f.Add(uint8(2), "tree-2", []byte{0xff, 0x00})
	f.Add(uint8(0), "fast-4", []byte(`null`))
	f.Fuzz(func(t *testing.T, table uint8, id string, data []byte) {
		if id == "" || strings.ContainsAny(id, "/\x00") || id == "." || id == ".." || strings.HasPrefix(id, ".tmp-") || len(id) > 200 {
			return
		}
		tables := []string{"volumes", "snapshots", "treevolumes", "groupsnapshots"}
		dir := t.TempDir()
		// A good record of every table next to the fuzzed one (written directly: Put fsyncs,
		// which would make each run take a disk's latency).
		for table, rec := range map[string]string{
			"volumes":        `{"id":"good-volume","name":"good","ready":true}`,
			"snapshots":      `{"id":"good-snapshot","name":"good"}`,
			"treevolumes":    `{"id":"good-tree"}`,
			"groupsnapshots": `{"id":"good-group","name":"good"}`,
		} {
			id := rec[strings.Index(rec, "good-"):]
			id = id[:strings.Index(id, `"`)]
			if err := os.MkdirAll(filepath.Join(dir, table), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, table, id+".json"), []byte(rec), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		name := tables[int(table)%len(tables)]
		if strings.HasPrefix(id, "good-") {
			return
		}
		if err := os.WriteFile(filepath.Join(dir, name, id+".json"), data, 0o600); err != nil {
			return // a name the file system refuses
		}
		s, err := Open(dir)
		if err != nil {
			t.Fatalf("Open with record %s/%s.json %q: %v", name, id, data, err)
		}
		_, v := s.GetVolume("good-volume")
		_, sn := s.GetSnapshot("good-snapshot")
		_, tr := s.GetTreeVolume("good-tree")
		_, g := s.GetGroupSnapshot("good-group")
		if !v || !sn || !tr || !g {
			t.Fatalf("a record %q in %s lost the good records: volume %v snapshot %v tree %v group %v", data, name, v, sn, tr, g)
		}
		var loaded bool
		switch name {
		case "volumes":
			_, loaded = s.GetVolume(id)
		case "snapshots":
			_, loaded = s.GetSnapshot(id)
		case "treevolumes":
			_, loaded = s.GetTreeVolume(id)
		case "groupsnapshots":
			_, loaded = s.GetGroupSnapshot(id)
		}
		quarantined := len(s.Quarantined()) == 1
		if loaded == quarantined {
			t.Fatalf("record %s/%s.json %q: loaded %v, quarantined %v (%v)", name, id, data, loaded, quarantined, s.Quarantined())
		}
		if loaded {
			// What loaded loads again.
			s, err = Open(dir)
			if err != nil || len(s.Quarantined()) != 0 {
				t.Fatalf("reopening after loading %q: %v, quarantined %v", data, err, s.Quarantined())
			}
		}
	})
}
