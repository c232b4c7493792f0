package driver

import (
	"context"
	"sort"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/consts"
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
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if err := parseMutable(req.GetMutableParameters()); err != nil {
		return nil, err
	}
	if err := s.d.volumes.ModifyVolume(ctx, id, req.GetMutableParameters()); err != nil {
		return nil, err
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}
