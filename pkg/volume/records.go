package volume

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/state"
)

// The controller's reads and writes of volume records: what DeleteVolume, ListVolumes, the
// Get/Validate/Expand/Modify RPCs and the metrics see.

// ReadyVolume returns a ready volume, or NotFound for one that does not exist (yet).
func (s *Service) ReadyVolume(id string) (state.Volume, error) {
	v, ok := s.store.GetVolume(id)
	if !ok || !v.Ready {
		return state.Volume{}, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	return v, nil
}

// ReadyVolumes lists the ready volumes by ID, inline ones too.
func (s *Service) ReadyVolumes() []state.Volume {
	all := s.store.ListVolumes()
	ready := all[:0]
	for _, v := range all {
		if v.Ready {
			ready = append(ready, v)
		}
	}
	return ready
}

// VolumesPerPool counts the volumes of each pool, ready or not.
func (s *Service) VolumesPerPool() map[string]int {
	counts := map[string]int{}
	for _, v := range s.store.ListVolumes() {
		counts[v.Pool]++
	}
	return counts
}

// Quarantined counts the records set aside at start as unreadable (pkg/state).
func (s *Service) Quarantined() int { return len(s.store.Quarantined()) }

// DeleteVolume removes a volume's image and record; one already gone is no error, one still
// staged or published on this node is FailedPrecondition.
func (s *Service) DeleteVolume(ctx context.Context, id string) error {
	v, ok := s.store.GetVolume(id)
	if !ok {
		return nil
	}
	if v.StagingPath != "" || len(v.Published) > 0 {
		return status.Errorf(codes.FailedPrecondition, "volume %s is still staged or published on node %s", id, s.nodeID)
	}
	if msg := s.WriteBackHolds(id); msg != "" {
		return status.Error(codes.FailedPrecondition, msg)
	}
	if err := s.Delete(v); err != nil {
		return err
	}
	klog.FromContext(ctx).V(4).Info("Deleted volume", "volumeID", id, "pool", v.Pool)
	return nil
}

// ModifyVolume merges mutable parameters (validated by the caller) into a ready volume's. They
// take effect at once when the volume is staged on this node, otherwise at its next staging.
func (s *Service) ModifyVolume(ctx context.Context, id string, mutable map[string]string) error {
	v, err := s.ReadyVolume(id)
	if err != nil {
		return err
	}
	if v.MutableParameters == nil {
		v.MutableParameters = map[string]string{}
	}
	for k, val := range mutable {
		v.MutableParameters[k] = val
	}
	if err := ApplyMutable(v.Device, v.MutableParameters); err != nil {
		return Internal("applying mutable parameters", err)
	}
	if err := s.store.PutVolume(v); err != nil {
		return Internal("saving volume state", err)
	}
	klog.FromContext(ctx).V(4).Info("Modified volume", "volumeID", id, "mutableParameters", v.MutableParameters)
	return nil
}
