package driver

import (
	"context"
	"sort"
	"strconv"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

const maxReadAheadKiB = 65536

// parseMutable validates VolumeAttributesClass parameters.
func parseMutable(params map[string]string) error {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != consts.ParamReadAheadKiB {
			return status.Errorf(codes.InvalidArgument, "mutable parameter %q is not supported (supported: %s)", k, consts.ParamReadAheadKiB)
		}
		n, err := strconv.Atoi(params[k])
		if err != nil || n < 0 || n > maxReadAheadKiB {
			return status.Errorf(codes.InvalidArgument, "%s must be an integer between 0 and %d, not %q", k, maxReadAheadKiB, params[k])
		}
	}
	return nil
}

// ControllerModifyVolume applies new mutable parameters. They are stored with the volume and
// take effect at once when the volume is staged on this node, otherwise at its next staging.
func (s *controllerServer) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if err := parseMutable(req.GetMutableParameters()); err != nil {
		return nil, err
	}
	v, ok := d.store.GetVolume(id)
	if !ok || !v.Ready {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	if v.MutableParameters == nil {
		v.MutableParameters = map[string]string{}
	}
	for k, val := range req.GetMutableParameters() {
		v.MutableParameters[k] = val
	}
	if err := volume.ApplyMutable(v.Device, v.MutableParameters); err != nil {
		return nil, volume.Internal("applying mutable parameters", err)
	}
	if err := d.store.PutVolume(v); err != nil {
		return nil, volume.Internal("saving volume state", err)
	}
	klog.FromContext(ctx).V(4).Info("Modified volume", "volumeID", id, "mutableParameters", v.MutableParameters)
	return &csi.ControllerModifyVolumeResponse{}, nil
}
