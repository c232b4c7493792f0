// Package state persists the driver's volumes and snapshots under --state-dir so that a restarted
// driver still serves, unstages and deletes what it created. One small JSON file per object,
// written atomically (temp file, fsync, rename, fsync of the directory): a crash leaves either the
// old or the new record, and the cost of a write does not grow with the number of volumes.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// AccessType is how a volume is consumed.
type AccessType string

const (
	Mount AccessType = "mount"
	Block AccessType = "block"
)

// Volume is one volume's record.
type Volume struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	Pool          string            `json:"pool"`
	CapacityBytes int64             `json:"capacityBytes"`
	AccessType    AccessType        `json:"accessType"`
	FSType        string            `json:"fsType,omitempty"`
	// Parameters are the CreateVolume parameters (never secrets); they come back as volume context.
	Parameters       map[string]string `json:"parameters,omitempty"`
	SourceSnapshotID string            `json:"sourceSnapshotID,omitempty"`
	SourceVolumeID   string            `json:"sourceVolumeID,omitempty"`
	// Ephemeral marks a CSI inline volume, created by NodePublish and deleted by NodeUnpublish.
	Ephemeral bool `json:"ephemeral,omitempty"`
	// Ready is false while CreateVolume is still building the volume; a driver that restarts
	// finds such records and removes their half-made images.
	Ready     bool      `json:"ready"`
	CreatedAt time.Time `json:"createdAt"`

	// Node side.
	StagingPath string `json:"stagingPath,omitempty"`
	Device      string `json:"device,omitempty"`
	// Published maps target paths to whether they were published read-only.
	Published map[string]bool `json:"published,omitempty"`
	// ExclusiveTarget is the one target of a SINGLE_NODE_SINGLE_WRITER publication.
	ExclusiveTarget string `json:"exclusiveTarget,omitempty"`
}

// Snapshot is one snapshot's record.
type Snapshot struct {
	ID             string    `json:"id"`
	Name           string    `json:"name"`
	SourceVolumeID string    `json:"sourceVolumeID"`
	Pool           string    `json:"pool"`
	SizeBytes      int64     `json:"sizeBytes"`
	CreatedAt      time.Time `json:"createdAt"`
	Ready          bool      `json:"ready"`
}

// Store holds the records in memory, indexed by ID and name, and on disk.
type Store struct {
	dir string

	mu            sync.RWMutex
	volumes       map[string]*Volume
	volumeNames   map[string]string
	snapshots     map[string]*Snapshot
	snapshotNames map[string]string
}

// Open loads every record under dir, creating the directories when needed.
func Open(dir string) (*Store, error) {
	s := &Store{
		dir:           dir,
		volumes:       map[string]*Volume{},
		volumeNames:   map[string]string{},
		snapshots:     map[string]*Snapshot{},
		snapshotNames: map[string]string{},
	}
	for _, sub := range []string{"volumes", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("creating state directory: %w", err)
		}
	}
	if err := loadAll(filepath.Join(dir, "volumes"), func(data []byte) error {
		var v Volume
		if err := json.Unmarshal(data, &v); err != nil {
			return err
		}
		s.volumes[v.ID] = &v
		if v.Name != "" {
			s.volumeNames[v.Name] = v.ID
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := loadAll(filepath.Join(dir, "snapshots"), func(data []byte) error {
		var sn Snapshot
		if err := json.Unmarshal(data, &sn); err != nil {
			return err
		}
		s.snapshots[sn.ID] = &sn
		s.snapshotNames[sn.Name] = sn.ID
		return nil
	}); err != nil {
		return nil, err
	}
	return s, nil
}

func loadAll(dir string, load func([]byte) error) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") {
			_ = os.Remove(filepath.Join(dir, name)) // an interrupted write
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if err := load(data); err != nil {
			return fmt.Errorf("loading %s: %w", filepath.Join(dir, name), err)
		}
	}
	return nil
}

// GetVolume returns a copy of the volume with this ID.
func (s *Store) GetVolume(id string) (Volume, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.volumes[id]
	if !ok {
		return Volume{}, false
	}
	return v.clone(), true
}

// GetVolumeByName returns a copy of the volume with this name.
func (s *Store) GetVolumeByName(name string) (Volume, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	id, ok := s.volumeNames[name]
	if !ok {
		return Volume{}, false
	}
	return s.volumes[id].clone(), true
}

// ListVolumes returns copies of all volumes sorted by ID.
func (s *Store) ListVolumes() []Volume {
	s.mu.RLock()
	out := make([]Volume, 0, len(s.volumes))
	for _, v := range s.volumes {
		out = append(out, v.clone())
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// PutVolume writes the record to disk, then makes it visible.
func (s *Store) PutVolume(v Volume) error {
	if v.ID == "" {
		return errors.New("volume without ID")
	}
	if err := writeJSON(filepath.Join(s.dir, "volumes"), v.ID, v); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.volumes[v.ID]; ok && old.Name != v.Name && s.volumeNames[old.Name] == v.ID {
		delete(s.volumeNames, old.Name)
	}
	cp := v.clone()
	s.volumes[v.ID] = &cp
	if v.Name != "" {
		s.volumeNames[v.Name] = v.ID
	}
	return nil
}

// DeleteVolume removes the record; deleting a missing record is not an error.
func (s *Store) DeleteVolume(id string) error {
	if err := removeJSON(filepath.Join(s.dir, "volumes"), id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.volumes[id]; ok {
		if s.volumeNames[v.Name] == id {
			delete(s.volumeNames, v.Name)
		}
		delete(s.volumes, id)
	}
	return nil
}

// GetSnapshot returns a copy of the snapshot with this ID.
func (s *Store) GetSnapshot(id string) (Snapshot, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sn, ok := s.snapshots[id]
	if !ok {
		return Snapshot{}, false
	}
	return *sn, true
}

// GetSnapshotByName returns a copy of the snapshot with this name.
func (s *Store) GetSnapshotByName(name string) (Snapshot, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	id, ok := s.snapshotNames[name]
	if !ok {
		return Snapshot{}, false
	}
	return *s.snapshots[id], true
}

// ListSnapshots returns copies of all snapshots sorted by ID.
func (s *Store) ListSnapshots() []Snapshot {
	s.mu.RLock()
	out := make([]Snapshot, 0, len(s.snapshots))
	for _, sn := range s.snapshots {
		out = append(out, *sn)
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// PutSnapshot writes the record to disk, then makes it visible.
func (s *Store) PutSnapshot(sn Snapshot) error {
	if sn.ID == "" {
		return errors.New("snapshot without ID")
	}
	if err := writeJSON(filepath.Join(s.dir, "snapshots"), sn.ID, sn); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := sn
	s.snapshots[sn.ID] = &cp
	s.snapshotNames[sn.Name] = sn.ID
	return nil
}

// DeleteSnapshot removes the record; deleting a missing record is not an error.
func (s *Store) DeleteSnapshot(id string) error {
	if err := removeJSON(filepath.Join(s.dir, "snapshots"), id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sn, ok := s.snapshots[id]; ok {
		if s.snapshotNames[sn.Name] == id {
			delete(s.snapshotNames, sn.Name)
		}
		delete(s.snapshots, id)
	}
	return nil
}

func (v *Volume) clone() Volume {
	cp := *v
	if v.Parameters != nil {
		cp.Parameters = make(map[string]string, len(v.Parameters))
		for k, val := range v.Parameters {
			cp.Parameters[k] = val
		}
	}
	if v.Published != nil {
		cp.Published = make(map[string]bool, len(v.Published))
		for k, val := range v.Published {
			cp.Published[k] = val
		}
	}
	return cp
}

func writeJSON(dir, id string, obj any) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, id+".json"))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing state for %s: %w", id, err)
	}
	return syncDir(dir)
}

func removeJSON(dir, id string) error {
	if err := os.Remove(filepath.Join(dir, id+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing state for %s: %w", id, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
