package driver

import (
	"context"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/volume"
)

type controllerServer struct {
	csi.UnimplementedControllerServer
	d *Driver
}

var controllerCapabilities = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	csi.ControllerServiceCapability_RPC_GET_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
}

func (s *controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	caps := make([]*csi.ControllerServiceCapability, 0, len(controllerCapabilities))
	for _, c := range controllerCapabilities {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (s *controllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	d := s.d
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume name is required")
	}
	shape, err := checkCapabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	pl, err := volume.ParseParams(req.GetParameters(), params.StorageClass)
	if err != nil {
		return nil, err
	}
	source := contentSource(req.GetVolumeContentSource())
	if pl.Dataset != nil && shape.access == state.Block {
		return nil, status.Error(codes.InvalidArgument, "a dataset source needs a mount volume, not a block volume")
	}
	size, err := volumeSize(req.GetCapacityRange(), shape, d.cfg.DefaultVolumeSize)
	if err != nil {
		return nil, err
	}
	if err := parseMutable(req.GetMutableParameters()); err != nil {
		return nil, err
	}
	v, err := d.volumes.CreateVolume(ctx, volume.CreateRequest{
		Name: req.GetName(), Size: size, RequiredBytes: req.GetCapacityRange().GetRequiredBytes(), LimitBytes: req.GetCapacityRange().GetLimitBytes(),
		Access: shape.access, FSType: shape.fsType, Params: pl, Source: source,
		Parameters: req.GetParameters(), MutableParameters: req.GetMutableParameters(), Secrets: req.GetSecrets(),
		InTopology: d.topologyAllows(req.GetAccessibilityRequirements()), Prestage: d.cfg.Mode == ModeAll,
	})
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
}

// contentSource is the snapshot or volume a CreateVolume copies, or nil.
func contentSource(src *csi.VolumeContentSource) *volume.Source {
	switch {
	case src.GetSnapshot() != nil:
		return &volume.Source{Snapshot: true, ID: src.GetSnapshot().GetSnapshotId()}
	case src.GetVolume() != nil:
		return &volume.Source{ID: src.GetVolume().GetVolumeId()}
	}
	return nil
}

func (d *Driver) csiVolume(v state.Volume) *csi.Volume {
	out := &csi.Volume{
		VolumeId:           v.ID,
		CapacityBytes:      v.CapacityBytes,
		VolumeContext:      v.Parameters,
		AccessibleTopology: []*csi.Topology{d.nodeTopology()},
	}
	switch {
	case v.SourceSnapshotID != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.SourceSnapshotID}}}
	case v.SourceVolumeID != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.SourceVolumeID}}}
	}
	return out
}

func (s *controllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if err := s.d.volumes.DeleteVolume(ctx, id); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *controllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	v, err := s.d.volumes.ReadyVolume(id)
	if err != nil {
		return nil, err
	}
	if _, err := volume.ParseParams(req.GetParameters(), params.StorageClass); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	if err := capabilitiesFit(v, req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

const tokenPrefix = "after:"

// page returns the items after a starting token, at most max of them (0 = all), and the next
// token. Tokens name the last ID returned, so deleting that volume between pages is harmless.
func page[T any](items []T, id func(T) string, token string, max int32) ([]T, string, error) {
	if max < 0 {
		return nil, "", status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	start := 0
	if token != "" {
		if !strings.HasPrefix(token, tokenPrefix) {
			return nil, "", status.Errorf(codes.Aborted, "invalid starting token %q", token)
		}
		after := strings.TrimPrefix(token, tokenPrefix)
		start = sort.Search(len(items), func(i int) bool { return id(items[i]) > after })
	}
	items = items[start:]
	if max == 0 || int(max) >= len(items) {
		return items, "", nil
	}
	items = items[:max]
	return items, tokenPrefix + id(items[len(items)-1]), nil
}

func (s *controllerServer) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	var persistent []state.Volume
	for _, v := range s.d.volumes.ReadyVolumes() {
		if !v.Ephemeral {
			persistent = append(persistent, v)
		}
	}
	vols, next, err := page(persistent, func(v state.Volume) string { return v.ID }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range vols {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: s.d.csiVolume(v)})
	}
	return resp, nil
}

func (s *controllerServer) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	id := req.GetVolumeId()
	v, err := s.d.readyVolume(id)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: s.d.csiVolume(v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: s.d.publishedNodes(v)},
	}, nil
}

// readyVolume returns the ready volume id names: InvalidArgument without an ID, NotFound for a
// volume that does not exist (yet).
func (d *Driver) readyVolume(id string) (state.Volume, error) {
	if id == "" {
		return state.Volume{}, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	return d.volumes.ReadyVolume(id)
}

// publishedNodes is this node when the volume is published here.
func (d *Driver) publishedNodes(v state.Volume) []string {
	if len(v.Published) > 0 {
		return []string{d.cfg.NodeID}
	}
	return nil
}

func (s *controllerServer) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	v, err := s.d.readyVolume(id)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: id, HealthStatuses: s.d.volumeHealth(v)}}, nil
}

// ControllerListVolumeHealth lists the volumes with a known problem, paginated like ListVolumes.
func (s *controllerServer) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	var sick []*csi.VolumeHealth
	for _, v := range s.d.volumes.ReadyVolumes() {
		if h := s.d.volumeHealth(v); len(h) > 0 {
			sick = append(sick, &csi.VolumeHealth{VolumeId: v.ID, HealthStatuses: h})
		}
	}
	entries, next, err := page(sick, func(h *csi.VolumeHealth) string { return h.GetVolumeId() }, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerListVolumeHealthResponse{Entries: entries, NextToken: next}, nil
}

// volumeHealth reports what is wrong with a volume: its pool unhealthy or gone (INACCESSIBLE),
// its image missing (DATA_LOSS). Empty means healthy.
func (d *Driver) volumeHealth(v state.Volume) []*csi.VolumeHealth_VolumeHealthEntry {
	if reason, msg, dataLoss := d.volumes.ImageProblem(v); reason != "" {
		c := csi.VolumeHealthErrorType_INACCESSIBLE
		if dataLoss {
			c = csi.VolumeHealthErrorType_DATA_LOSS
		}
		return []*csi.VolumeHealth_VolumeHealthEntry{{Status: c, Reason: reason, Message: msg}}
	}
	return d.datasetHealth(v)
}

func (s *controllerServer) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	d := s.d
	pl, err := volume.ParseParams(req.GetParameters(), params.StorageClass)
	if err != nil {
		return nil, err
	}
	shape := volumeShape{access: state.Mount, fsType: volume.DefaultFSType}
	if caps := req.GetVolumeCapabilities(); len(caps) > 0 {
		if shape, err = checkCapabilities(caps); err != nil {
			return &csi.GetCapacityResponse{}, nil // nothing can be created with these
		}
	}
	resp := &csi.GetCapacityResponse{MinimumVolumeSize: wrapInt64(minVolumeBytes(shape))}
	if t := req.GetAccessibleTopology(); t != nil && !d.segmentMatches(t) {
		resp.MaximumVolumeSize = wrapInt64(0)
		return resp, nil
	}
	pools, _ := d.pools.List()
	var total, largest int64
	for _, p := range pool.Matching(pools, pl.Pool, pl.PoolSelector) {
		m := pool.MaxVolumeBytes(p)
		total += m
		if m > largest {
			largest = m
		}
	}
	resp.AvailableCapacity = total
	resp.MaximumVolumeSize = wrapInt64(largest)
	return resp, nil
}

func (s *controllerServer) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity range is required")
	}
	v, err := d.volumes.ReadyVolume(id)
	if err != nil {
		return nil, err
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := capabilitiesFit(v, []*csi.VolumeCapability{c}); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	size, err := volumeSize(req.GetCapacityRange(), volumeShape{access: v.AccessType, fsType: v.FSType}, v.CapacityBytes)
	if err != nil {
		return nil, err
	}
	if size <= v.CapacityBytes {
		// Grown already, perhaps by this same request retried (external-resizer repeats a call
		// whose answer it lost): a filesystem may not have followed yet, and the node's growth
		// is idempotent, so it is asked for again rather than the resize marked finished.
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: v.AccessType == state.Mount}, nil
	}
	if _, err := d.volumes.Grow(v, size); err != nil {
		return nil, err
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
}
