package volume

import (
	"context"
	"maps"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/ids"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/state"
)

// CreateRequest is a CreateVolume the CSI layer has validated: its capabilities reduced to an
// access type and filesystem, its capacity range to a size, its parameters parsed.
type CreateRequest struct {
	Name string
	// Size is the size to create. RequiredBytes and LimitBytes are the request's range, which a
	// volume that already has the name must fit.
	Size, RequiredBytes, LimitBytes int64
	Access                          state.AccessType
	FSType                          string
	// Params are Parameters, parsed.
	Params                                 params.Volume
	Parameters, MutableParameters, Secrets map[string]string
	// Source is the snapshot to restore or the volume to clone; nil for an empty volume.
	Source *Source
	// InTopology says the request's accessibility requirements admit this node.
	InTopology bool
	// Prestage starts staging the volume's dataset at once: the controller is also the node
	// plugin (--mode all), so the data is usually there before the pod.
	Prestage bool
}

// CreateVolume creates a volume, or returns the ready volume of that name when it is what r
// asks for (AlreadyExists otherwise). A restored or cloned volume stays in its source's pool.
// The claim's placeholders in an output target are replaced first: the volume records, and
// returns as its context, the target its claim writes.
func (s *Service) CreateVolume(ctx context.Context, r CreateRequest) (state.Volume, error) {
	parameters, err := claimParameters(r.Parameters)
	if err != nil {
		return state.Volume{}, err
	}
	r.Parameters = parameters
	if v, ok := s.store.GetVolumeByName(r.Name); ok && v.Ready {
		if err := sameVolume(v, r); err != nil {
			return state.Volume{}, err
		}
		return v, nil
	}
	if !r.InTopology {
		return state.Volume{}, status.Errorf(codes.ResourceExhausted, "node %s is not in the requested topology", s.nodeID)
	}
	v := state.Volume{
		Name:              r.Name,
		CapacityBytes:     r.Size,
		AccessType:        r.Access,
		FSType:            r.FSType,
		Parameters:        r.Parameters,
		CreatedAt:         time.Now().UTC(),
		MutableParameters: r.MutableParameters,
		// A restore or clone of a dataset class takes its data from the snapshot or source
		// volume, which the caller's namespace already holds: the dataset is neither staged
		// nor copied in (that would overwrite, or for a dataset that shrank delete, restored
		// files), so no byte of the dataset cache reaches it and no access proof is skipped
		// (docs/security.md).
		DatasetFilled: r.Source != nil && r.Params.Dataset != nil,
	}
	source, err := s.resolveSource(&v, r)
	if err != nil {
		return state.Volume{}, err
	}
	pl := r.Params
	if v.Pool != "" {
		// Copies stay in their source's pool: the copy is a reflink or a local sparse copy.
		if pl.Pool != "" && pl.Pool != v.Pool {
			return state.Volume{}, status.Errorf(codes.InvalidArgument, "the content source is in pool %q, not in the requested pool %q", v.Pool, pl.Pool)
		}
		pl.Pool = v.Pool
	}
	chosen, err := s.SelectPool(pl, r.Size)
	if err != nil {
		return state.Volume{}, err
	}
	// Before anything is created: a dataset that cannot fit is refused here.
	if r.Prestage && r.Source == nil {
		spec := datasource.SpecOf(pl.Dataset)
		if spec != nil {
			spec.Namespace = callerNamespace(r.Parameters, false)
		}
		if err := s.Prestage(ctx, r.Name, chosen.Name, r.Size, spec, r.Secrets); err != nil {
			return state.Volume{}, err
		}
	}
	if v, err = s.Create(v, chosen, source); err != nil {
		return state.Volume{}, err
	}
	klog.FromContext(ctx).V(4).Info("Created volume", "volumeID", v.ID, "name", r.Name, "pool", v.Pool, "bytes", r.Size)
	return v, nil
}

// Source is a CreateVolume's content source.
type Source struct {
	// Snapshot: ID names a snapshot to restore; otherwise a volume to clone.
	Snapshot bool
	ID       string
}

// ids returns the snapshot and the volume a source names ("" for none).
func (src *Source) ids() (snapshotID, volumeID string) {
	switch {
	case src == nil:
		return "", ""
	case src.Snapshot:
		return src.ID, ""
	default:
		return "", src.ID
	}
}

// resolveSource fills in v's content source (its ID, pool, and whether it is formatted and must
// grow) and returns the image to copy, or "" for an empty volume.
func (s *Service) resolveSource(v *state.Volume, r CreateRequest) (string, error) {
	switch {
	case r.Source == nil:
		return "", nil
	case r.Source.Snapshot:
		v.SourceSnapshotID = r.Source.ID
		sn, ok := s.store.GetSnapshot(v.SourceSnapshotID)
		if !ok {
			return "", snapshotElsewhere(v.SourceSnapshotID, s.nodeID)
		}
		if sn.SizeBytes > r.Size {
			return "", status.Errorf(codes.OutOfRange, "snapshot %s holds %d bytes, more than the requested %d", sn.ID, sn.SizeBytes, r.Size)
		}
		v.Pool, v.DatasetLayer = sn.Pool, sn.DatasetLayer
		v.Formatted, v.NeedsGrow = true, sn.SizeBytes < r.Size
		return s.SnapshotPath(sn)
	default:
		v.SourceVolumeID = r.Source.ID
		src, ok := s.store.GetVolume(v.SourceVolumeID)
		if !ok || !src.Ready {
			return "", status.Errorf(codes.NotFound, "source volume %s does not exist", v.SourceVolumeID)
		}
		if src.CapacityBytes > r.Size {
			return "", status.Errorf(codes.OutOfRange, "source volume %s is %d bytes, larger than the requested %d", src.ID, src.CapacityBytes, r.Size)
		}
		if src.AccessType != r.Access {
			return "", status.Errorf(codes.InvalidArgument, "source volume %s is a %s volume", src.ID, src.AccessType)
		}
		if err := s.settledLayer(&src); err != nil {
			return "", err
		}
		v.Pool, v.DatasetLayer = src.Pool, src.DatasetLayer
		v.Formatted, v.NeedsGrow = src.Formatted || src.AccessType == state.Block, src.CapacityBytes < r.Size
		return s.ImagePath(src)
	}
}

// sameVolume checks that a repeated CreateVolume asks for what exists; otherwise AlreadyExists.
func sameVolume(v state.Volume, r CreateRequest) error {
	if r.RequiredBytes > v.CapacityBytes || (r.LimitBytes > 0 && r.LimitBytes < v.CapacityBytes) {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with %d bytes, outside the requested range", v.Name, v.CapacityBytes)
	}
	if r.Access != v.AccessType || (r.FSType != "" && v.FSType != "" && r.FSType != v.FSType) {
		return status.Errorf(codes.AlreadyExists, "volume %q exists as a %s volume", v.Name, Describe(v.AccessType, v.FSType))
	}
	if snap, vol := r.Source.ids(); snap != v.SourceSnapshotID || vol != v.SourceVolumeID {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with a different content source", v.Name)
	}
	if !maps.Equal(r.Parameters, v.Parameters) {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with different parameters", v.Name)
	}
	return nil
}

// Describe names a volume's shape in messages: "block", or its filesystem.
func Describe(access state.AccessType, fsType string) string {
	if access == state.Block {
		return "block"
	}
	return fsType
}

// snapshotElsewhere is the error for a snapshot this node does not hold. A snapshot another node
// holds can only be restored there: ResourceExhausted is CSI's "unable to provision in
// accessible_topology", on which external-provisioner gives the claim back to the scheduler
// instead of retrying this node. Anything else does not exist.
func snapshotElsewhere(id, node string) error {
	if holder := ids.NodeOfSnapshotID(id); holder != "" && holder != node {
		return status.Errorf(codes.ResourceExhausted,
			"snapshot %s is on node %s, not on node %s: a volume restored from it can only be made on node %s", id, holder, node, holder)
	}
	return status.Errorf(codes.NotFound, "snapshot %s does not exist", id)
}
