package driver

import (
	"context"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/volume"
)

type nodeServer struct {
	csi.UnimplementedNodeServer
	d *Driver
}

func (s *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, c := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: c}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (s *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: s.d.cfg.NodeID, AccessibleTopology: s.d.nodeTopology()}, nil
}

// access is what a capability asks of a volume, for the volume service.
func access(c *csi.VolumeCapability) volume.Access {
	return volume.Access{
		Block:        c.GetBlock() != nil,
		FSType:       c.GetMount().GetFsType(),
		MountFlags:   c.GetMount().GetMountFlags(),
		SingleWriter: c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		ReaderOnly: c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY ||
			c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
	}
}

// NodeStageVolume stages an image volume (attach; for a mount volume, dataset first, then
// format on first use, mount and fill) or a static PV's cached dataset tree.
func (s *nodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := requireVolumeAndPath(id, target, "staging target path"); err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	vol := s.d.volumes.Open(id, req.GetVolumeContext(), false)
	if vol.Kind() == volume.KindImage {
		if err := checkCapability(req.GetVolumeCapability()); err != nil {
			return nil, err
		}
	}
	err := vol.Stage(ctx, volume.StageRequest{Path: target, Access: access(req.GetVolumeCapability()),
		VolumeContext: req.GetVolumeContext(), Secrets: req.GetSecrets()})
	if err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

func (s *nodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := requireVolumeAndPath(id, target, "staging target path"); err != nil {
		return nil, err
	}
	if err := s.d.volumes.Open(id, nil, false).Unstage(ctx, target); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staged filesystem (or the loop device, for block) to the
// target path, read-only when asked; an inline volume is created (or its dataset's cached tree
// served) at the target. A publication already in place only renews the pod's credentials
// (pkg/volume, republish.go).
func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	d := s.d
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if err := requireVolumeAndPath(id, target, "target path"); err != nil {
		return nil, err
	}
	c := req.GetVolumeCapability()
	if c == nil {
		return nil, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	// kubelet calls again while the pod runs (requiresRepublish), with the pod's current token.
	d.volumes.RenewCredentials(ctx, req.GetVolumeContext())
	vol := d.volumes.Open(id, req.GetVolumeContext(), req.GetReadonly())
	r := volume.PublishRequest{Target: target, StagingPath: req.GetStagingTargetPath(), ReadOnly: req.GetReadonly(),
		Access: access(c), VolumeContext: req.GetVolumeContext(), Secrets: req.GetSecrets()}
	if vol.Kind() == volume.KindImage {
		if err := checkCapability(c); err != nil {
			return nil, err
		}
		if volume.IsInline(req.GetVolumeContext()) {
			inline, err := d.inlineVolume(req)
			if err != nil {
				return nil, err
			}
			r.Inline = inline
		}
	}
	if err := vol.Publish(ctx, r); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// inlineVolume parses an inline volume's attributes and sizes it.
func (d *Driver) inlineVolume(req *csi.NodePublishVolumeRequest) (*volume.Inline, error) {
	if req.GetVolumeCapability().GetBlock() != nil {
		return nil, status.Error(codes.InvalidArgument, "inline ephemeral volumes must be mount volumes")
	}
	pl, err := volume.ParseParams(req.GetVolumeContext(), params.Inline)
	if err != nil {
		return nil, err
	}
	shape := volumeShape{access: state.Mount, fsType: req.GetVolumeCapability().GetMount().GetFsType()}
	if shape.fsType == "" {
		shape.fsType = volume.DefaultFSType
	}
	var rng *csi.CapacityRange
	if pl.Size > 0 {
		rng = &csi.CapacityRange{RequiredBytes: pl.Size}
	}
	size, err := volumeSize(rng, shape, d.cfg.DefaultVolumeSize)
	if err != nil {
		return nil, err
	}
	return &volume.Inline{Params: pl, Size: size}, nil
}

func (s *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if err := requireVolumeAndPath(id, target, "target path"); err != nil {
		return nil, err
	}
	if err := s.d.volumes.Open(id, nil, false).Unpublish(ctx, target); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (s *nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	d := s.d
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := requireVolumeAndPath(id, path, "volume path"); err != nil {
		return nil, err
	}
	v, err := d.volumes.ReadyVolume(id)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume path %s: %v", path, err)
	}
	if !fi.IsDir() || v.AccessType == state.Block {
		size, err := d.volumes.Images().DeviceSize(path)
		if err != nil {
			return nil, volume.Internal("reading block device size", err)
		}
		return &csi.NodeGetVolumeStatsResponse{
			Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}},
		}, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, volume.Internal("statfs of volume path", err)
	}
	bs := int64(st.Bsize)
	return &csi.NodeGetVolumeStatsResponse{
		Usage: []*csi.VolumeUsage{
			{Unit: csi.VolumeUsage_BYTES, Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs, Used: int64(st.Blocks-st.Bfree) * bs},
			{Unit: csi.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
		},
	}, nil
}

// NodeGetVolumeHealth reports the volume's pool and image health, and whether the path the CO
// asks about is still mounted.
func (s *nodeServer) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	v, err := d.volumes.ReadyVolume(id)
	if err != nil {
		return nil, err
	}
	health := d.volumeHealth(v)
	for _, path := range []string{req.GetStagingTargetPath(), req.GetVolumePublishPath()} {
		if path == "" || len(health) > 0 {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			return nil, status.Errorf(codes.NotFound, "volume path %s: %v", path, err)
		}
		if v.AccessType == state.Mount && !(v.StagePending && path == req.GetStagingTargetPath()) { // pending: mounted at first publish
			if notMnt, err := d.mounter.IsLikelyNotMountPoint(path); err == nil && notMnt {
				health = append(health, &csi.VolumeHealth_VolumeHealthEntry{Status: csi.VolumeHealthErrorType_INACCESSIBLE,
					Reason: "NotMounted", Message: "volume path " + path + " is not mounted"})
			}
		}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: id, HealthStatuses: health}}, nil
}

// NodeGetStorageHealth reports each unhealthy pool of this node as an unreachable backend.
func (s *nodeServer) NodeGetStorageHealth(context.Context, *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	pools, _ := s.d.pools.List()
	resp := &csi.NodeGetStorageHealthResponse{}
	for _, p := range pools {
		if p.Healthy {
			continue
		}
		resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
			Status:  csi.StorageHealthErrorType_STORAGE_UNREACHABLE,
			Reason:  "PoolUnhealthy",
			Message: "pool " + p.Name + ": " + p.Message,
		})
	}
	return resp, nil
}

// NodeExpandVolume makes the loop device see the grown image and grows the filesystem online.
func (s *nodeServer) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	d := s.d
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := requireVolumeAndPath(id, path, "volume path"); err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err != nil {
		if _, lerr := d.volumes.Lookup(id); lerr != nil {
			return nil, lerr
		}
		return nil, status.Errorf(codes.NotFound, "volume path %s: %v", path, err)
	}
	mnt := req.GetStagingTargetPath()
	if mnt == "" {
		mnt = path
	}
	size, err := d.volumes.Expand(ctx, id, mnt, req.GetVolumeCapability().GetBlock() != nil)
	if err != nil {
		return nil, err
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// requireVolumeAndPath checks the two fields every node RPC needs: the volume ID and a path
// (what names the path in the error).
func requireVolumeAndPath(id, path, what string) error {
	if id == "" {
		return status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if path == "" {
		return status.Errorf(codes.InvalidArgument, "%s is required", what)
	}
	return nil
}
