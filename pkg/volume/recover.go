package volume

import (
	"encoding/json"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
)

// Recover finishes what a crash interrupted: a CreateVolume, CreateSnapshot or group snapshot
// that never completed leaves a record that is not Ready; it, its image and its reference on a
// dataset layer are removed so the retried call starts clean. Staged and published marks whose mounts are gone are dropped.
func (s *Service) Recover() {
	logger := klog.Background()
	pools, _ := s.pools.List()
	for _, p := range pools {
		if err := image.RemoveTemporary(p.Path, pool.MetaDir); err != nil {
			logger.Error(err, "Removing temporary images", "pool", p.Name)
		}
	}
	for _, v := range s.store.ListVolumes() {
		if v.Ready {
			continue
		}
		logger.Info("Removing volume whose creation was interrupted", "volumeID", v.ID, "name", v.Name)
		if path, err := s.ImagePath(v); err == nil {
			_ = s.images.Remove(path)
		}
		if err := s.releaseLayer(v.Pool, v.DatasetLayer, v.ID); err != nil {
			logger.Error(err, "Releasing interrupted volume's dataset layer", "volumeID", v.ID)
		}
		if err := s.store.DeleteVolume(v.ID); err != nil {
			logger.Error(err, "Removing interrupted volume record", "volumeID", v.ID)
		}
	}
	s.forgetLostMounts()
	for _, g := range s.store.ListGroupSnapshots() {
		if g.Ready {
			continue
		}
		// Its member snapshots are not Ready either and go below.
		_ = s.store.DeleteGroupSnapshot(g.ID)
	}
	for _, sn := range s.store.ListSnapshots() {
		if sn.Ready {
			continue
		}
		if p, ok := s.pools.Get(sn.Pool); ok {
			_ = s.images.Remove(image.SnapshotPath(p.Path, pool.MetaDir, sn.ID))
		}
		_ = s.releaseLayer(sn.Pool, sn.DatasetLayer, sn.ID)
		_ = s.store.DeleteSnapshot(sn.ID)
	}
	s.resumeWriteBacks()
}

// forgetLostMounts drops staged and published marks whose mounts are gone (a node reboot, or an
// admin's umount): kubelet does not always unstage what no longer exists, and a stale mark would
// keep DeleteVolume refusing forever.
func (s *Service) forgetLostMounts() {
	mounts, err := s.mounter.List()
	if err != nil {
		klog.ErrorS(err, "Cannot list mounts; keeping node state as recorded")
		return
	}
	mounted := make(map[string]bool, len(mounts))
	for _, m := range mounts {
		mounted[m.Path] = true
	}
	for _, v := range s.store.ListVolumes() {
		if (v.StagingPath == "" && len(v.Published) == 0) || !s.forgetLost(&v, mounted) {
			continue
		}
		klog.InfoS("Forgetting mounts that are gone", "volumeID", v.ID)
		if err := s.store.PutVolumeNodeState(v); err != nil {
			klog.ErrorS(err, "Saving volume state", "volumeID", v.ID)
		}
	}
}

// forgetLost drops v's marks that mounted (or, for a staged block volume, its loop device) no
// longer backs, and says whether it dropped any.
func (s *Service) forgetLost(v *state.Volume, mounted map[string]bool) bool {
	changed := false
	for target := range v.Published {
		if !mounted[target] {
			delete(v.Published, target)
			if v.ExclusiveTarget == target {
				v.ExclusiveTarget = ""
			}
			changed = true
		}
	}
	if v.StagingPath != "" {
		lost := !mounted[v.StagingPath] && !v.StagePending // pending: nothing mounted yet
		if v.AccessType == state.Block {
			img, err := s.ImagePath(*v)
			dev := ""
			if err == nil {
				dev, _ = s.images.Find(img)
			}
			lost, v.Device = dev == "", dev
		}
		if lost {
			v.StagingPath, v.Device = "", ""
			changed = true
		}
	}
	return changed
}

// LegacyTreeDir (under the state directory) held one JSON file per cached-tree volume before they moved into pkg/state.
const LegacyTreeDir = "dataset-volumes"

// MigrateTreeRecords moves the cached-tree volume records older versions kept in stateDir into
// the state store, so their volumes can still be unstaged and unpublished.
func (s *Service) MigrateTreeRecords(stateDir string) {
	dir := filepath.Join(stateDir, LegacyTreeDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		var old struct {
			VolumeID  string            `json:"volumeID"`
			Pool      string            `json:"pool"`
			DatasetID string            `json:"datasetID"`
			Params    map[string]string `json:"params"`
			Path      string            `json:"path"`
			Ephemeral bool              `json:"ephemeral"`
		}
		b, err := os.ReadFile(path)
		if err != nil || json.Unmarshal(b, &old) != nil || old.VolumeID == "" {
			klog.InfoS("Removing unreadable dataset volume record", "path", path)
			_ = os.Remove(path)
			continue
		}
		t := state.TreeVolume{ID: old.VolumeID, Pool: old.Pool, DatasetID: old.DatasetID, Parameters: old.Params, Path: old.Path, Inline: old.Ephemeral}
		if err := s.store.PutTreeVolume(t); err != nil {
			klog.ErrorS(err, "Moving dataset volume record", "volumeID", t.ID)
			continue
		}
		_ = os.Remove(path)
	}
	_ = os.Remove(dir)
}
