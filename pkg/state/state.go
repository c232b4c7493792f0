// Package state persists the driver's volumes and snapshots under --state-dir so that a restarted
// driver still serves, unstages and deletes what it created. One small JSON file per object,
// written atomically (temp file, fsync, rename, fsync of the directory): a crash leaves either the
// old or the new record, and the cost of a write does not grow with the number of volumes.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/atomicfile"
)

// AccessType is how a volume is consumed.
type AccessType string

const (
	Mount AccessType = "mount"
	Block AccessType = "block"
)

// Volume is one volume's record.
type Volume struct {
	ID            string     `json:"id"`
	Name          string     `json:"name"`
	Pool          string     `json:"pool"`
	CapacityBytes int64      `json:"capacityBytes"`
	AccessType    AccessType `json:"accessType"`
	FSType        string     `json:"fsType,omitempty"`
	// Parameters are the CreateVolume parameters (never secrets); they come back as volume context.
	Parameters       map[string]string `json:"parameters,omitempty"`
	SourceSnapshotID string            `json:"sourceSnapshotID,omitempty"`
	SourceVolumeID   string            `json:"sourceVolumeID,omitempty"`
	// MutableParameters are the VolumeAttributesClass parameters (see ControllerModifyVolume).
	MutableParameters map[string]string `json:"mutableParameters,omitempty"`
	// Ephemeral marks a CSI inline volume, created by NodePublish and deleted by NodeUnpublish.
	Ephemeral bool `json:"ephemeral,omitempty"`
	// CopyOf names the static dataset PV whose writable per-pod copy this ephemeral volume is:
	// filled from that PV's staged dataset, deleted with its publication. Parameters are then
	// the static PV's attributes.
	CopyOf string `json:"copyOf,omitempty"`
	// Formatted is set once the driver made the volume's filesystem; a volume made from a
	// snapshot or clone has its source's. Unformatted images skip the probe before mkfs.
	Formatted bool `json:"formatted,omitempty"`
	// NeedsGrow is set when the image grew (expansion, or a copy into a larger volume) and the
	// filesystem has not been grown yet.
	NeedsGrow bool `json:"needsGrow,omitempty"`
	// DatasetFilled is set once the volume's filesystem holds the dataset its parameters name,
	// so a later staging neither waits for the dataset nor copies it again.
	DatasetFilled bool `json:"datasetFilled,omitempty"`
	// DatasetLayer is the ID of the cached dataset whose tree is this writable volume's lower
	// layer (an overlay, docs/datasets.md): the volume's filesystem holds only what its pods
	// changed, and the volume holds a reference on that cached version until it is deleted.
	// Empty for a volume that was filled with a copy.
	DatasetLayer string `json:"datasetLayer,omitempty"`
	// DatasetVersion is the digest of the dataset version the volume was filled with or layered
	// on: a later publish of a web-identity claim must prove its pod reads that very version.
	DatasetVersion string `json:"datasetVersion,omitempty"`
	// DatasetStream says the volume's lower layer is its dataset streamed (a FUSE tree served
	// while the dataset stages, recorded as the TreeVolume whose LayerOf is this volume) and
	// holds no reference on a cached version yet: it takes one on DatasetVersion once that is
	// staged (docs/datasets.md, "Writable volumes on a streaming tree").
	DatasetStream bool `json:"datasetStream,omitempty"`
	// Ready is false while CreateVolume is still building the volume; a driver that restarts
	// finds such records and removes their half-made images.
	Ready     bool      `json:"ready"`
	CreatedAt time.Time `json:"createdAt"`

	// Node side.
	StagingPath string `json:"stagingPath,omitempty"`
	Device      string `json:"device,omitempty"`
	// StagePending marks a volume staged at StagingPath with nothing mounted yet: its dataset is
	// still to be filled with a pod's web identity, which only NodePublishVolume brings (kubelet
	// passes no pod token at staging). The first publish mounts and fills it.
	StagePending bool `json:"stagePending,omitempty"`
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
	// GroupSnapshotID is set when the snapshot was taken as part of a volume group snapshot.
	GroupSnapshotID string `json:"groupSnapshotID,omitempty"`
	// DatasetLayer is the source volume's DatasetLayer: the snapshot holds a reference on the
	// same cached version, which a restored volume shares.
	DatasetLayer string `json:"datasetLayer,omitempty"`
}

// GroupSnapshot is one volume group snapshot's record: the snapshots taken together.
type GroupSnapshot struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	SnapshotIDs []string  `json:"snapshotIDs"`
	CreatedAt   time.Time `json:"createdAt"`
	Ready       bool      `json:"ready"`
}

// TreeVolume is a volume served from a dataset's cached tree on a pool, with no image: a static
// PV staged with a read-only bind mount, or a read-only inline volume published with one.
type TreeVolume struct {
	ID        string `json:"id"`
	Pool      string `json:"pool"`
	DatasetID string `json:"datasetID"`
	// Parameters are the volume attributes it was served with (never secrets).
	Parameters map[string]string `json:"parameters,omitempty"`
	// Path is the staging path (static PV) or the target path (inline volume).
	Path   string `json:"path"`
	Inline bool   `json:"inline,omitempty"`
	// Tree is the cached tree a static PV's publications bind. Its staging path holds no mount:
	// kubelet refuses to unstage a path whose mount another mount shares (GetDeviceMountRefs),
	// which two static PVs of one dataset on a node would. Empty in records of older versions,
	// whose staging path is the tree's bind mount.
	Tree string `json:"tree,omitempty"`
	// LayerOf is the writable volume whose overlay has this streaming tree as its lower layer
	// (Volume.DatasetStream); its dataset and capacity are that volume's.
	LayerOf string `json:"layerOf,omitempty"`
}

// Store holds the records in memory, indexed by ID and name, and on disk.
type Store struct {
	volumes   *table[Volume]
	snapshots *table[Snapshot]
	groups    *table[GroupSnapshot]
	trees     *table[TreeVolume]
}

// Quarantined lists the record files set aside at Open because they could not be read (see
// quarantine).
func (s *Store) Quarantined() []string {
	var out []string
	for _, q := range [][]string{s.volumes.quarantined, s.snapshots.quarantined, s.trees.quarantined, s.groups.quarantined} {
		out = append(out, q...)
	}
	return out
}

// Open loads every record under dir, creating the directories when needed.
func Open(dir string) (*Store, error) {
	var s Store
	var err error
	if s.volumes, err = openTable(filepath.Join(dir, "volumes"),
		func(v *Volume) (string, string) { return v.ID, v.Name }, (*Volume).clone); err != nil {
		return nil, err
	}
	if s.snapshots, err = openTable(filepath.Join(dir, "snapshots"),
		func(sn *Snapshot) (string, string) { return sn.ID, sn.Name }, func(sn *Snapshot) Snapshot { return *sn }); err != nil {
		return nil, err
	}
	if s.trees, err = openTable(filepath.Join(dir, "treevolumes"),
		func(t *TreeVolume) (string, string) { return t.ID, "" }, func(t *TreeVolume) TreeVolume {
			cp := *t
			cp.Parameters = maps.Clone(t.Parameters)
			return cp
		}); err != nil {
		return nil, err
	}
	if s.groups, err = openTable(filepath.Join(dir, "groupsnapshots"),
		func(g *GroupSnapshot) (string, string) { return g.ID, g.Name }, func(g *GroupSnapshot) GroupSnapshot {
			cp := *g
			cp.SnapshotIDs = append([]string(nil), g.SnapshotIDs...)
			return cp
		}); err != nil {
		return nil, err
	}
	return &s, nil
}

// GetVolume returns a copy of the volume with this ID.
func (s *Store) GetVolume(id string) (Volume, bool) { return s.volumes.get(id) }

// GetVolumeByName returns a copy of the volume with this name.
func (s *Store) GetVolumeByName(name string) (Volume, bool) { return s.volumes.getByName(name) }

// ListVolumes returns copies of all volumes sorted by ID.
func (s *Store) ListVolumes() []Volume { return s.volumes.list() }

// PutVolume writes the record to disk durably (fsync), then makes it visible.
func (s *Store) PutVolume(v Volume) error { return s.volumes.put(v, true) }

// PutVolumeNodeState writes a record whose change is only node-side (staged, published). The
// file is synced before it replaces the old one, so a power loss leaves the old record or the
// new one, never a truncated one; the directory is not synced: mounts do not outlive a power
// loss either, so a record that lags the mounts after one is no worse than the mounts
// themselves.
func (s *Store) PutVolumeNodeState(v Volume) error { return s.volumes.put(v, false) }

// DeleteVolume removes the record; deleting a missing record is not an error.
func (s *Store) DeleteVolume(id string) error { return s.volumes.delete(id) }

// GetSnapshot returns a copy of the snapshot with this ID.
func (s *Store) GetSnapshot(id string) (Snapshot, bool) { return s.snapshots.get(id) }

// GetSnapshotByName returns a copy of the snapshot with this name.
func (s *Store) GetSnapshotByName(name string) (Snapshot, bool) { return s.snapshots.getByName(name) }

// ListSnapshots returns copies of all snapshots sorted by ID.
func (s *Store) ListSnapshots() []Snapshot { return s.snapshots.list() }

// PutSnapshot writes the record to disk, then makes it visible.
func (s *Store) PutSnapshot(sn Snapshot) error { return s.snapshots.put(sn, true) }

// DeleteSnapshot removes the record; deleting a missing record is not an error.
func (s *Store) DeleteSnapshot(id string) error { return s.snapshots.delete(id) }

// GetGroupSnapshot returns a copy of the group snapshot with this ID.
func (s *Store) GetGroupSnapshot(id string) (GroupSnapshot, bool) { return s.groups.get(id) }

// GetGroupSnapshotByName returns a copy of the group snapshot with this name.
func (s *Store) GetGroupSnapshotByName(name string) (GroupSnapshot, bool) {
	return s.groups.getByName(name)
}

// ListGroupSnapshots returns copies of all group snapshots sorted by ID.
func (s *Store) ListGroupSnapshots() []GroupSnapshot { return s.groups.list() }

// PutGroupSnapshot writes the record to disk, then makes it visible.
func (s *Store) PutGroupSnapshot(g GroupSnapshot) error { return s.groups.put(g, true) }

// DeleteGroupSnapshot removes the record; deleting a missing record is not an error.
func (s *Store) DeleteGroupSnapshot(id string) error { return s.groups.delete(id) }

// GetTreeVolume returns a tree volume's record.
func (s *Store) GetTreeVolume(id string) (TreeVolume, bool) { return s.trees.get(id) }

// ListTreeVolumes returns every tree volume record, sorted by ID.
func (s *Store) ListTreeVolumes() []TreeVolume { return s.trees.list() }

// PutTreeVolume writes a tree volume's record durably: it is the reference that keeps eviction
// away from the dataset, and what NodeUnstage and NodeUnpublish find the volume by.
func (s *Store) PutTreeVolume(t TreeVolume) error { return s.trees.put(t, true) }

// DeleteTreeVolume removes the record; deleting a missing record is not an error.
func (s *Store) DeleteTreeVolume(id string) error { return s.trees.delete(id) }

// table is one kind of record: a directory of JSON files and two in-memory indexes.
type table[T any] struct {
	dir   string
	keys  func(*T) (id, name string)
	clone func(*T) T

	mu     sync.RWMutex
	byID   map[string]*T
	byName map[string]string
	// quarantined are the files set aside at open.
	quarantined []string
}

func openTable[T any](dir string, keys func(*T) (string, string), clone func(*T) T) (*table[T], error) {
	t := &table[T]{dir: dir, keys: keys, clone: clone, byID: map[string]*T{}, byName: map[string]string{}}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	q, err := loadAll(dir, func(file string, data []byte) error {
		var rec T
		if err := json.Unmarshal(data, &rec); err != nil {
			return err
		}
		id, name := keys(&rec)
		if id == "" || id+".json" != file {
			return fmt.Errorf("record ID %q does not match its file name", id)
		}
		t.byID[id] = &rec
		if name != "" {
			t.byName[name] = id
		}
		return nil
	})
	t.quarantined = q
	return t, err
}

func (t *table[T]) get(id string) (T, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	rec, ok := t.byID[id]
	if !ok {
		var zero T
		return zero, false
	}
	return t.clone(rec), true
}

func (t *table[T]) getByName(name string) (T, bool) {
	t.mu.RLock()
	id, ok := t.byName[name]
	t.mu.RUnlock()
	if !ok {
		var zero T
		return zero, false
	}
	return t.get(id)
}

func (t *table[T]) list() []T {
	t.mu.RLock()
	ids := make([]string, 0, len(t.byID))
	for id := range t.byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := make([]T, 0, len(ids))
	for _, id := range ids {
		out = append(out, t.clone(t.byID[id]))
	}
	t.mu.RUnlock()
	return out
}

func (t *table[T]) put(rec T, durable bool) error {
	id, name := t.keys(&rec)
	if id == "" {
		return errors.New("record without ID")
	}
	if err := writeJSON(t.dir, id, rec, durable); err != nil {
		return err
	}
	cp := t.clone(&rec)
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.byID[id]; ok {
		if _, oldName := t.keys(old); oldName != name && t.byName[oldName] == id {
			delete(t.byName, oldName)
		}
	}
	t.byID[id] = &cp
	if name != "" {
		t.byName[name] = id
	}
	return nil
}

func (t *table[T]) delete(id string) error {
	if err := removeJSON(t.dir, id); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if rec, ok := t.byID[id]; ok {
		if _, name := t.keys(rec); t.byName[name] == id {
			delete(t.byName, name)
		}
		delete(t.byID, id)
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
	if v.MutableParameters != nil {
		cp.MutableParameters = make(map[string]string, len(v.MutableParameters))
		for k, val := range v.MutableParameters {
			cp.MutableParameters[k] = val
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

func writeJSON(dir, id string, obj any, durable bool) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, id+".json"), data, durable); err != nil {
		return fmt.Errorf("writing state for %s: %w", id, err)
	}
	return nil
}

// WriteFile replaces path with data durably, as the store writes its records: temporary file,
// fsync, rename, fsync of the directory. For node-side records kept outside the Store.
func WriteFile(path string, data []byte) error { return writeFile(path, data, true) }

// writeFile writes through a synced temporary file, so a crash leaves the old content or the
// new, never a truncated file; durable also syncs the directory, so the new content survives.
func writeFile(path string, data []byte, durable bool) error {
	err := atomicfile.Write(path, ".tmp-", func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
	if err != nil {
		return err
	}
	if !durable {
		return nil
	}
	return syncDir(filepath.Dir(path))
}

func removeJSON(dir, id string) error {
	if err := os.Remove(filepath.Join(dir, id+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing state for %s: %w", id, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error { return atomicfile.SyncDir(dir) }

// loadAll calls load for every record file of dir. A record that cannot be parsed (a disk
// error, a hand edit) is quarantined rather than failing the whole load: one bad record must
// not keep the node plugin, and every other volume of the node, from starting. It returns the
// quarantined files.
func loadAll(dir string, load func(file string, data []byte) error) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var quarantined []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") {
			_ = os.Remove(filepath.Join(dir, name)) // an interrupted write
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		path := filepath.Join(dir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			return quarantined, err
		}
		if lerr := load(name, data); lerr != nil {
			q, err := quarantine(path)
			if err != nil {
				return quarantined, fmt.Errorf("loading %s: %w; setting it aside: %w", path, lerr, err)
			}
			klog.ErrorS(lerr, "Quarantined a state record that cannot be read; the object it described is unknown to the driver until an administrator restores it",
				"record", path, "quarantinedAs", q)
			quarantined = append(quarantined, q)
		}
	}
	return quarantined, nil
}

// quarantine renames a bad record so it is kept for inspection but no longer loaded.
func quarantine(path string) (string, error) {
	q := fmt.Sprintf("%s.corrupt-%s", path, time.Now().UTC().Format("20060102T150405.000000000Z"))
	if err := os.Rename(path, q); err != nil {
		return "", err
	}
	return q, syncDir(filepath.Dir(path))
}
