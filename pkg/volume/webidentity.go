package volume

// Claims whose dataset is read with a pod's web identity (docs/security.md, "Pod-level S3
// credentials"). kubelet hands a pod's ServiceAccount token (CSI tokenRequests) only to
// NodePublishVolume, never to NodeStageVolume, which has no pod. So staging such a claim touches
// no data: it records the volume as staged, pending; the first publish proves the pod's right
// with the keys its token is exchanged for, then mounts and fills the volume at the staging path
// as staging would have. Every later publish, by the same pod or another, proves that caller's
// own right before the bind mount: two pods with different roles, or of different
// ServiceAccounts, are two principals, and a pod refused by the STS gets nothing of the claim.

import (
	"context"
	"os"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/state"
)

// podIdentity says whether a dataset is read with the publishing pod's web identity.
func podIdentity(spec *datasource.Spec) bool {
	return spec != nil && spec.Credentials == consts.CredentialsWebIdentity
}

// stagePending records v as staged at path with nothing mounted: its first publish, which brings
// a pod's token, mounts and fills it (publishPodIdentity).
func (s *Service) stagePending(ctx context.Context, v state.Volume, path string) error {
	if err := os.MkdirAll(path, 0o750); err != nil {
		return Internal("creating staging path", err)
	}
	v.StagingPath, v.Device, v.StagePending = path, "", true
	if err := s.store.PutVolumeNodeState(v); err != nil {
		return Internal("saving volume state", err)
	}
	klog.FromContext(ctx).V(4).Info("Staged volume pending its first publish (web identity)", "volumeID", v.ID, "path", path)
	return nil
}

// publishPodIdentity proves that the publishing pod may read v's dataset, with its own web
// identity, before its bind mount. A volume staged pending is mounted and filled at its staging
// path with that proof (mountImage); v is updated and written. Otherwise the proof is a caller's
// ordinary one (awaitDataset: a remembered proof, or a listing equal to a cached version's), of
// the very version the claim was filled with; a refusal (the STS's, the S3 server's, or another
// version) is the caller's error.
func (s *Service) publishPodIdentity(ctx context.Context, v *state.Volume, spec *datasource.Spec, r PublishRequest) error {
	if !v.StagePending {
		version, err := s.awaitDataset(ctx, spec, v.Pool, usableBytes(v.CapacityBytes), r.Secrets, r.VolumeContext, claimWatch(*v, r.VolumeContext))
		if err != nil {
			return err
		}
		// The pod proved it reads the version it sees; the claim holds the one it was filled
		// with. Another (the source changed since, or these credentials resolve to other data)
		// proves nothing of the claim's bytes.
		if v.DatasetVersion != "" && version != v.DatasetVersion {
			return status.Errorf(codes.PermissionDenied, "volume %s holds another version of %s than this pod's credentials read (the source changed since the claim was filled, or they resolve to other data): not published", v.ID, spec.Describe())
		}
		return nil
	}
	dev, _, err := s.mountImage(ctx, v, r.StagingPath, r.MountFlags, r.VolumeContext, r.Secrets)
	if err != nil {
		return err
	}
	v.Device, v.StagePending = dev, false
	if err := s.store.PutVolume(*v); err != nil {
		return Internal("saving volume state", err)
	}
	klog.FromContext(ctx).V(4).Info("Staged volume at its first publish (web identity)", "volumeID", v.ID, "device", dev, "path", r.StagingPath)
	return nil
}
