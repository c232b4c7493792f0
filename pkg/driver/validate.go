package driver

import (
	"path/filepath"
	"regexp"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultKubeletRoot is kubelet's --root-dir unless the cluster changed it.
const DefaultKubeletRoot = "/var/lib/kubelet"

// validID is what the driver accepts as a volume or snapshot ID from a CSI client: IDs name
// files under the pools and the state directory, so a "/" or ".." must never reach them.
var validID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// checkRequest refuses, before any handler runs, IDs that are not validID and node paths
// outside the kubelet root: whoever can reach the socket could otherwise have the driver mount
// over, or remove, any path on the node. Empty fields are left to the handlers, which say
// which one is required.
func (d *Driver) checkRequest(req any) error {
	for _, id := range requestIDs(req) {
		if id != "" && (!validID.MatchString(id) || id == "." || id == "..") {
			return status.Errorf(codes.InvalidArgument, "ID %q is not 1-128 letters, digits, '.', '_' or '-'", id)
		}
	}
	for _, p := range requestPaths(req) {
		if p != "" && !under(d.cfg.KubeletRoot, p) {
			return status.Errorf(codes.InvalidArgument, "path %q is not under the kubelet root %s", p, d.cfg.KubeletRoot)
		}
	}
	return nil
}

func requestIDs(req any) []string {
	var ids []string
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		ids = append(ids, r.GetVolumeId())
	}
	if r, ok := req.(interface{ GetSnapshotId() string }); ok {
		ids = append(ids, r.GetSnapshotId())
	}
	if r, ok := req.(interface{ GetSourceVolumeId() string }); ok {
		ids = append(ids, r.GetSourceVolumeId())
	}
	if r, ok := req.(interface{ GetSourceVolumeIds() []string }); ok {
		ids = append(ids, r.GetSourceVolumeIds()...)
	}
	if r, ok := req.(interface{ GetSnapshotIds() []string }); ok {
		ids = append(ids, r.GetSnapshotIds()...)
	}
	if r, ok := req.(interface{ GetGroupSnapshotId() string }); ok {
		ids = append(ids, r.GetGroupSnapshotId())
	}
	if r, ok := req.(*csi.CreateVolumeRequest); ok {
		src := r.GetVolumeContentSource()
		ids = append(ids, src.GetSnapshot().GetSnapshotId(), src.GetVolume().GetVolumeId())
	}
	return ids
}

// requestPaths are the paths the driver mounts at, or unmounts and removes. The volume_path of
// NodeGetVolumeStats and NodeExpandVolume is left to the handlers: it is only read (and a
// missing one must be NotFound, as csi-sanity checks).
func requestPaths(req any) []string {
	var paths []string
	if r, ok := req.(interface{ GetTargetPath() string }); ok {
		paths = append(paths, r.GetTargetPath())
	}
	if r, ok := req.(interface{ GetStagingTargetPath() string }); ok {
		paths = append(paths, r.GetStagingTargetPath())
	}
	return paths
}

// under reports whether path, cleaned, is root or below it.
func under(root, path string) bool {
	if !filepath.IsAbs(path) {
		return false
	}
	root, path = filepath.Clean(root), filepath.Clean(path)
	return root == "/" || path == root || strings.HasPrefix(path, root+"/")
}
