package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/state"
)

type nodeServer struct {
	csi.UnimplementedNodeServer
	d *Driver
}

// Format options: no discard, so mkfs does not punch holes into the image whose blocks
// CreateVolume reserved.
var formatOptions = map[string][]string{
	"ext4": {"-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1"},
	"xfs":  {"-K"},
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

// NodeStageVolume attaches the volume's image to a loop device and, for a mount volume, formats
// it on first use and mounts it at the staging path.
func (s *nodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	d := s.d
	id, target := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	if handled, err := d.stageTree(ctx, req); handled { // static dataset PV: cached tree
		if err != nil {
			return nil, err
		}
		return &csi.NodeStageVolumeResponse{}, nil
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	v, err := d.lookupVolume(id)
	if err != nil {
		return nil, err
	}
	if v.AccessType == "" { // adopted from its image: the capability tells
		v.AccessType, v.FSType = state.Mount, req.GetVolumeCapability().GetMount().GetFsType()
		if req.GetVolumeCapability().GetBlock() != nil {
			v.AccessType, v.FSType = state.Block, ""
		}
	}
	if err := capabilitiesFit(v, []*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if v.StagingPath != "" && v.StagingPath != target {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %s", id, v.StagingPath)
	}
	var dev string
	if v.AccessType == state.Mount {
		dev, err = d.mountImage(ctx, &v, target, req.GetVolumeCapability().GetMount().GetMountFlags(), req.GetVolumeContext(), req.GetSecrets())
	} else {
		dev, err = d.attachImage(v)
	}
	if err != nil {
		return nil, err
	}
	v.StagingPath, v.Device = target, dev
	if err := d.store.PutVolumeNodeState(v); err != nil {
		return nil, internal("saving volume state", err)
	}
	klog.FromContext(ctx).V(4).Info("Staged volume", "volumeID", id, "device", dev, "path", target)
	return &csi.NodeStageVolumeResponse{}, nil
}

// mountStaging formats the device if it has no filesystem yet, mounts it, and grows the
// filesystem when the image is larger (a volume restored from a smaller snapshot).
func (d *Driver) mountStaging(dev, target string, v state.Volume, flags []string) error {
	if err := os.MkdirAll(target, 0o750); err != nil {
		return internal("creating staging path", err)
	}
	notMnt, err := d.mounter.IsLikelyNotMountPoint(target)
	if err != nil {
		return internal("checking staging path", err)
	}
	if !notMnt {
		src, _, err := mount.GetDeviceNameFromMount(d.mounter, target)
		if err != nil {
			return internal("checking staging mount", err)
		}
		if src != dev {
			return status.Errorf(codes.FailedPrecondition, "staging path %s is a mount of %s, not of volume %s", target, src, v.ID)
		}
		return nil
	}
	fs := v.FSType
	if fs == "" {
		fs = defaultFSType
	}
	if !v.Formatted {
		// A fresh image of ours: no probe needed before mkfs.
		args := append(append([]string{}, formatOptions[fs]...), dev)
		if fs == "ext4" {
			args = append([]string{"-F", "-m0"}, args...)
		}
		if out, err := d.mounter.Exec.Command("mkfs."+fs, args...).CombinedOutput(); err != nil {
			return internal("formatting volume", fmt.Errorf("mkfs.%s: %v: %s", fs, err, out))
		}
		if err := d.mounter.Mount(dev, target, fs, flags); err != nil {
			return internal("mounting volume", err)
		}
		return nil
	}
	if err := d.mounter.FormatAndMountSensitiveWithFormatOptions(dev, target, fs, flags, nil, formatOptions[fs]); err != nil {
		return internal("formatting and mounting volume", err)
	}
	if !v.NeedsGrow {
		return nil
	}
	if need, err := d.resizer.NeedResize(dev, target); err == nil && need {
		if _, err := d.resizer.Resize(dev, target); err != nil {
			if fs != "ext4" {
				return internal("growing filesystem to the volume size", err)
			}
			// Online ext4 growth needs CAP_SYS_RESOURCE. Nothing uses this fresh mount yet, so
			// a plugin without it grows the filesystem offline instead.
			klog.InfoS("Online resize failed; growing offline", "device", dev, "err", err)
			if err := d.growExt4Offline(dev, target, flags); err != nil {
				return internal("growing filesystem to the volume size", err)
			}
		}
	}
	return nil
}

// growExt4Offline unmounts, checks, grows and remounts an ext4 filesystem.
func (d *Driver) growExt4Offline(dev, target string, flags []string) error {
	if err := d.mounter.Unmount(target); err != nil {
		return err
	}
	if out, err := d.mounter.Exec.Command("e2fsck", "-f", "-p", dev).CombinedOutput(); err != nil {
		// Exit status 1 means errors were corrected; anything above is a failure.
		var ee interface{ ExitStatus() int }
		if !errors.As(err, &ee) || ee.ExitStatus() > 1 {
			return fmt.Errorf("e2fsck %s: %v: %s", dev, err, out)
		}
	}
	if out, err := d.mounter.Exec.Command("resize2fs", dev).CombinedOutput(); err != nil {
		return fmt.Errorf("resize2fs %s: %v: %s", dev, err, out)
	}
	return d.mounter.Mount(dev, target, "ext4", flags)
}

func (s *nodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	d := s.d
	id, target := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	if handled, err := d.unstageTree(ctx, id, target); handled { // static dataset PV
		if err != nil {
			return nil, err
		}
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if err := unmountTarget(d.mounter, target); err != nil {
		return nil, internal("unmounting staging path", err)
	}
	v, ok := d.store.GetVolume(id)
	if !ok {
		if poolOfVolumeID(id) == "" {
			return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
		}
		v = state.Volume{ID: id, Pool: poolOfVolumeID(id)}
	}
	dev := v.Device
	if img, err := d.volumeImage(v); err == nil {
		if found, _ := d.images.Find(img); found != "" {
			dev = found
		}
	}
	if err := d.images.Detach(dev); err != nil {
		return nil, internal("detaching loop device", err)
	}
	if ok {
		v.StagingPath, v.Device = "", ""
		if err := d.store.PutVolumeNodeState(v); err != nil {
			return nil, internal("saving volume state", err)
		}
	}
	klog.FromContext(ctx).V(4).Info("Unstaged volume", "volumeID", id)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staged filesystem (or the loop device, for block) to the
// target path, read-only when asked.
func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	d := s.d
	id, target, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	if handled, err := d.publishTree(ctx, req); handled { // dataset served from the cached tree
		if err != nil {
			return nil, err
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	if isEphemeral(req.GetVolumeContext()) {
		return d.publishEphemeral(ctx, req)
	}
	if staging == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	v, err := d.lookupVolume(id)
	if err != nil {
		return nil, err
	}
	if err := capabilitiesFit(v, []*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if v.StagingPath != staging || v.Device == "" {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", id, staging)
	}
	exclusive := req.GetVolumeCapability().GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	for other := range v.Published {
		if other != target && (exclusive || v.ExclusiveTarget != "") {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published at %s for a single writer", id, other)
		}
	}
	source := staging
	if v.AccessType == state.Block {
		source = v.Device
	}
	if err := d.bindMount(source, target, v.AccessType == state.Block, req.GetReadonly(), req.GetVolumeCapability().GetMount().GetMountFlags()); err != nil {
		return nil, err
	}
	if v.Published == nil {
		v.Published = map[string]bool{}
	}
	v.Published[target] = req.GetReadonly()
	if exclusive {
		v.ExclusiveTarget = target
	}
	if err := d.store.PutVolumeNodeState(v); err != nil {
		return nil, internal("saving volume state", err)
	}
	klog.FromContext(ctx).V(4).Info("Published volume", "volumeID", id, "target", target, "readOnly", req.GetReadonly())
	return &csi.NodePublishVolumeResponse{}, nil
}

// bindMount mounts source on target; a target that is already a mount point is left as it is.
func (d *Driver) bindMount(source, target string, block, readOnly bool, flags []string) error {
	if block {
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return internal("creating target parent", err)
		}
		f, err := os.OpenFile(target, os.O_CREATE, 0o640)
		if err != nil {
			return internal("creating block target file", err)
		}
		f.Close()
	} else if err := os.MkdirAll(target, 0o750); err != nil {
		return internal("creating target path", err)
	}
	notMnt, err := d.mounter.IsLikelyNotMountPoint(target)
	if err != nil {
		return internal("checking target path", err)
	}
	if !notMnt {
		return nil
	}
	if !readOnly && len(flags) == 0 {
		// The common case: one bind mount(2). mount-utils runs mount(8) twice for a bind
		// (bind, then a remount that applies options), which only read-only or flagged
		// publications need.
		if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
			return internal("bind-mounting volume", err)
		}
		return nil
	}
	opts := append([]string{"bind"}, flags...)
	if readOnly {
		opts = append(opts, "ro")
	}
	if err := d.mounter.Mount(source, target, "", opts); err != nil {
		return internal("bind-mounting volume", err)
	}
	return nil
}

func (s *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	d := s.d
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	if handled, err := d.unpublishTree(ctx, id, target); handled { // read-only inline dataset
		if err != nil {
			return nil, err
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if err := unmountTarget(d.mounter, target); err != nil {
		return nil, internal("unmounting target path", err)
	}
	v, ok := d.store.GetVolume(id)
	if !ok {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if v.Ephemeral {
		if err := d.deleteEphemeral(v); err != nil {
			return nil, err
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if _, published := v.Published[target]; published {
		delete(v.Published, target)
		if v.ExclusiveTarget == target {
			v.ExclusiveTarget = ""
		}
		if err := d.store.PutVolumeNodeState(v); err != nil {
			return nil, internal("saving volume state", err)
		}
	}
	klog.FromContext(ctx).V(4).Info("Unpublished volume", "volumeID", id, "target", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// unmountTarget unmounts everything mounted at a directory or block-file target and removes
// it. It calls umount(2) directly — no mount table scan, no fork of umount(8) — and leaves
// anything unexpected (a busy or broken mount) to mount-utils.
func unmountTarget(m mount.Interface, target string) error {
	fi, err := os.Lstat(target)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for {
		err := unix.Unmount(target, 0)
		if err == nil {
			continue // mounts can be stacked
		}
		if errors.Is(err, unix.EINVAL) { // not a mount point (any more)
			break
		}
		if fi.IsDir() {
			return mount.CleanupMountPoint(target, m, true)
		}
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (s *nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	d := s.d
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path is required")
	}
	v, ok := d.store.GetVolume(id)
	if !ok || !v.Ready {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume path %s: %v", path, err)
	}
	if !fi.IsDir() || v.AccessType == state.Block {
		size, err := d.images.DeviceSize(path)
		if err != nil {
			return nil, internal("reading block device size", err)
		}
		return &csi.NodeGetVolumeStatsResponse{
			Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}},
		}, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, internal("statfs of volume path", err)
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
	v, ok := d.store.GetVolume(id)
	if !ok || !v.Ready {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	health := d.volumeHealth(v)
	for _, path := range []string{req.GetStagingTargetPath(), req.GetVolumePublishPath()} {
		if path == "" || len(health) > 0 {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			return nil, status.Errorf(codes.NotFound, "volume path %s: %v", path, err)
		}
		if v.AccessType == state.Mount {
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
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path is required")
	}
	v, err := d.lookupVolume(id)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err != nil {
		return nil, status.Errorf(codes.NotFound, "volume path %s: %v", path, err)
	}
	img, err := d.volumeImage(v)
	if err != nil {
		return nil, err
	}
	dev, err := d.images.Find(img)
	if err != nil {
		return nil, internal("finding loop device", err)
	}
	if dev == "" {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged on this node", id)
	}
	if err := d.images.RefreshSize(dev); err != nil {
		return nil, internal("refreshing loop device size", err)
	}
	size, err := d.images.DeviceSize(dev)
	if err != nil {
		return nil, internal("reading device size", err)
	}
	if v.AccessType == state.Block || req.GetVolumeCapability().GetBlock() != nil {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
	mnt := req.GetStagingTargetPath()
	if mnt == "" {
		mnt = path
	}
	if _, err := d.resizer.Resize(dev, mnt); err != nil {
		if strings.Contains(err.Error(), "Permission denied") {
			return nil, status.Errorf(codes.Internal, "growing filesystem online was refused (an ext4 online resize needs CAP_SYS_RESOURCE in the node plugin): %v", err)
		}
		return nil, internal("growing filesystem", err)
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
