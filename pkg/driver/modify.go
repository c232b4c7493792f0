package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// ParamReadAheadKiB is the one mutable parameter (VolumeAttributesClass): the read-ahead of the
// volume's loop device. Large sequential reads of datasets and model files gain from a bigger
// read-ahead; random-access workloads from a smaller one.
const ParamReadAheadKiB = "readAheadKiB"

const maxReadAheadKiB = 65536

// parseMutable validates VolumeAttributesClass parameters.
func parseMutable(params map[string]string) error {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != ParamReadAheadKiB {
			return status.Errorf(codes.InvalidArgument, "mutable parameter %q is not supported (supported: %s)", k, ParamReadAheadKiB)
		}
		n, err := strconv.Atoi(params[k])
		if err != nil || n < 0 || n > maxReadAheadKiB {
			return status.Errorf(codes.InvalidArgument, "%s must be an integer between 0 and %d, not %q", k, maxReadAheadKiB, params[k])
		}
	}
	return nil
}

// applyMutable sets the loop device's read-ahead when the volume asks for one.
func applyMutable(dev string, params map[string]string) error {
	ra, ok := params[ParamReadAheadKiB]
	if !ok || dev == "" {
		return nil
	}
	path := filepath.Join("/sys/block", filepath.Base(dev), "queue", "read_ahead_kb")
	if err := os.WriteFile(path, []byte(ra), 0o644); err != nil {
		return fmt.Errorf("setting read-ahead of %s: %w", dev, err)
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
	if err := applyMutable(v.Device, v.MutableParameters); err != nil {
		return nil, internal("applying mutable parameters", err)
	}
	if err := d.store.PutVolume(v); err != nil {
		return nil, internal("saving volume state", err)
	}
	klog.FromContext(ctx).V(4).Info("Modified volume", "volumeID", id, "mutableParameters", v.MutableParameters)
	return &csi.ControllerModifyVolumeResponse{}, nil
}
