package driver

import (
	"math"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/volume"
)

const (
	mib          = int64(1) << 20
	minExt4Bytes = 16 * mib
	// mkfs.xfs refuses filesystems smaller than 300 MB.
	minXFSBytes   = 300 * mib
	minBlockBytes = 1 * mib
)

var supportedFSTypes = map[string]bool{"ext4": true, "xfs": true}

// volumeShape is what the requested capabilities say about the volume.
type volumeShape struct {
	access state.AccessType
	fsType string
}

// checkCapabilities validates a request's capabilities and derives the access type. A volume is
// either block or mount, not both.
func checkCapabilities(caps []*csi.VolumeCapability) (volumeShape, error) {
	if len(caps) == 0 {
		return volumeShape{}, status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	var shape volumeShape
	for _, c := range caps {
		if err := checkCapability(c); err != nil {
			return volumeShape{}, err
		}
		access, fs := state.Mount, ""
		if c.GetBlock() != nil {
			access = state.Block
		} else {
			fs = c.GetMount().GetFsType()
		}
		if shape.access != "" && shape.access != access {
			return volumeShape{}, status.Error(codes.InvalidArgument, "a volume cannot be both block and mount")
		}
		shape.access = access
		if fs != "" {
			if shape.fsType != "" && shape.fsType != fs {
				return volumeShape{}, status.Errorf(codes.InvalidArgument, "conflicting filesystem types %q and %q", shape.fsType, fs)
			}
			shape.fsType = fs
		}
	}
	if shape.access == state.Mount && shape.fsType == "" {
		shape.fsType = volume.DefaultFSType
	}
	return shape, nil
}

// checkCapability accepts single-node access modes with a block or mount access type. Pools
// are node-local, so multi-node access cannot be honoured.
func checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return status.Error(codes.InvalidArgument, "volume capability is empty")
	}
	if c.GetBlock() == nil && c.GetMount() == nil {
		return status.Error(codes.InvalidArgument, "volume capability needs an access type (block or mount)")
	}
	if c.GetAccessMode() == nil {
		return status.Error(codes.InvalidArgument, "volume capability needs an access mode")
	}
	if fs := c.GetMount().GetFsType(); fs != "" && !supportedFSTypes[fs] {
		return status.Errorf(codes.InvalidArgument, "filesystem type %q is not supported (ext4, xfs)", fs)
	}
	if !supportedAccessMode(c.GetAccessMode().GetMode()) {
		return status.Errorf(codes.InvalidArgument, "access mode %s is not supported: Cistern volumes are node-local", c.GetAccessMode().GetMode())
	}
	return nil
}

func supportedAccessMode(m csi.VolumeCapability_AccessMode_Mode) bool {
	switch m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		return true
	}
	return false
}

func minVolumeBytes(shape volumeShape) int64 {
	switch {
	case shape.access == state.Block:
		return minBlockBytes
	case shape.fsType == "xfs":
		return minXFSBytes
	default:
		return minExt4Bytes
	}
}

// volumeSize turns a capacity range into the size to create: the required bytes rounded up to
// a MiB (or the default when none is asked), at least what the filesystem needs, within limit.
func volumeSize(r *csi.CapacityRange, shape volumeShape, def int64) (int64, error) {
	req, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || limit < 0 {
		return 0, status.Error(codes.InvalidArgument, "capacity range must not be negative")
	}
	if limit > 0 && req > limit {
		return 0, status.Errorf(codes.InvalidArgument, "required bytes %d exceed limit bytes %d", req, limit)
	}
	size := req
	if size == 0 {
		size = def
		if limit > 0 && limit < size {
			size = limit
		}
	}
	if m := minVolumeBytes(shape); size < m {
		size = m
	}
	if size > maxVolumeBytes {
		return 0, status.Errorf(codes.OutOfRange, "required bytes %d exceed the largest volume size, %d bytes", size, int64(maxVolumeBytes))
	}
	size = roundUp(size, mib)
	if limit > 0 && size > limit {
		return 0, status.Errorf(codes.OutOfRange, "the smallest %s volume is %d bytes, above the limit of %d bytes", describe(shape), size, limit)
	}
	return size, nil
}

func describe(s volumeShape) string {
	if s.access == state.Block {
		return "block"
	}
	return s.fsType
}

// maxVolumeBytes is the largest size that rounds up to whole MiB without overflowing an int64
// (no filesystem comes near it; the pool's free space is checked later).
const maxVolumeBytes = math.MaxInt64 / mib * mib

func roundUp(n, unit int64) int64 { return (n + unit - 1) / unit * unit }

// nodeTopology is this node's segment.
func (d *Driver) nodeTopology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{consts.TopologyKey: d.cfg.NodeID}}
}

// topologyAllows says whether a request's accessibility requirements admit this node. Requisite
// topologies, when given, must include it; otherwise preferred ones must, when given.
func (d *Driver) topologyAllows(req *csi.TopologyRequirement) bool {
	if req == nil {
		return true
	}
	list := req.GetRequisite()
	if len(list) == 0 {
		list = req.GetPreferred()
	}
	if len(list) == 0 {
		return true
	}
	for _, t := range list {
		if d.segmentMatches(t) {
			return true
		}
	}
	return false
}

// segmentMatches is true when every segment we know about names this node. Segments with
// other keys (for example zone labels kubelet adds) do not constrain us.
func (d *Driver) segmentMatches(t *csi.Topology) bool {
	v, ok := t.GetSegments()[consts.TopologyKey]
	return !ok || v == d.cfg.NodeID
}

// validateCapabilitiesFor checks that capabilities fit an existing volume.
func capabilitiesFit(v state.Volume, caps []*csi.VolumeCapability) error {
	for _, c := range caps {
		if err := checkCapability(c); err != nil {
			return err
		}
		if err := volume.Fits(v, c.GetBlock() != nil, c.GetMount().GetFsType()); err != nil {
			return err
		}
	}
	return nil
}
