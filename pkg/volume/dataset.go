package volume

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/state"
)

// ParseParams parses a parameter map once for its use (pkg/params: one key table, one parser)
// and returns its errors with the code datasource.Code gives them.
func ParseParams(m map[string]string, use params.Use) (params.Volume, error) {
	v, err := params.Parse(m, use)
	if err != nil {
		return params.Volume{}, status.Error(datasource.Code(err), err.Error())
	}
	return v, nil
}

// recordedDataset returns the dataset of a volume the driver recorded, or nil: its parameters
// were checked when it was created. An inline volume's dataset is a tenant's (docs/security.md),
// as is a writable copy's of a VolumeManager's static PV.
func recordedDataset(v state.Volume) (*datasource.Spec, error) {
	use, tenant := params.StorageClass, v.Ephemeral
	switch {
	case v.CopyOf != "":
		use, tenant = params.StaticPV, tenantVolume(v.CopyOf)
	case v.Ephemeral:
		use = params.Inline
	}
	p, err := ParseParams(v.Parameters, use)
	if err != nil {
		return nil, err
	}
	spec := datasource.SpecOf(p.Dataset)
	if spec != nil {
		spec.Tenant, spec.Namespace = tenant, callerNamespace(v.Parameters, v.Ephemeral)
	}
	return spec, nil
}

// callerNamespace is the namespace a volume is charged to: its dataset listings
// (datasource.Spec.Namespace) and its share of the node's streaming volumes. The publishing
// pod's (kubelet's podInfoOnMount, which a pod author cannot override), else, but for an inline
// volume (whose attributes are the pod author's), the claim's (external-provisioner's, or the
// VolumeManager controller's); empty for neither.
func callerNamespace(attrs map[string]string, inline bool) string {
	if ns := attrs[consts.VolumeContextPodNamespace]; ns != "" || inline {
		return ns
	}
	return attrs[consts.VolumeContextPVCNamespace]
}

// volumeDataset returns the dataset of an image-backed volume, from its CreateVolume parameters
// or, for a volume the driver adopted, from the dataset keys of the volume context (which also
// holds keys the provisioner adds, such as its identity).
func volumeDataset(v state.Volume, volumeContext map[string]string) (*datasource.Spec, error) {
	if len(v.Parameters) > 0 {
		return recordedDataset(v)
	}
	ds := map[string]string{}
	for k, val := range volumeContext {
		if params.IsDatasetKey(k) {
			ds[k] = val
		}
	}
	p, err := ParseParams(ds, params.StorageClass)
	if err != nil {
		return nil, err
	}
	spec := datasource.SpecOf(p.Dataset)
	if spec != nil {
		spec.Namespace = callerNamespace(volumeContext, false)
	}
	return spec, nil
}

// recordedAttrs is what a volume's record keeps of its volume context: everything but the keys
// dropped and the pod's ServiceAccount tokens, which are credentials and never written to disk.
func recordedAttrs(volumeContext map[string]string, drop ...string) map[string]string {
	attrs := make(map[string]string, len(volumeContext))
	for k, v := range volumeContext {
		if k != consts.VolumeContextSATokens && !slices.Contains(drop, k) {
			attrs[k] = v
		}
	}
	return attrs
}

// usableBytes is what a dataset may take of a volume: the filesystem keeps some for itself.
func usableBytes(capacity int64) int64 { return capacity - capacity/20 }

// Prestage starts staging a new volume's dataset at CreateVolume when the controller is also
// the node plugin, so the data is usually in place before the pod, and waits, within the RPC's
// budget, for the dataset's listing: a dataset that cannot fit the requested capacity is refused
// with OutOfRange before the volume is created (the code the CSI spec gives a volume smaller than
// its source snapshot: the request, not the node, must change; ResourceExhausted would have the
// provisioner retry the same size). Other failures are logged and surface again at
// NodeStageVolume, as does a listing that outlasts the budget (staging goes on).
//
// An S3 dataset without CreateVolume secrets is not pre-staged: a class that passes its
// credentials only to NodeStageVolume (csi.storage.k8s.io/node-stage-secret-*) would otherwise
// stage anonymously, fail with access denied, and NodeStageVolume would get that cached permanent
// failure even though it brings the right credentials.
func (s *Service) Prestage(ctx context.Context, name, poolName string, size int64, spec *datasource.Spec, secrets map[string]string) error {
	if spec == nil || spec.Scheme == datasource.SchemeS3 && len(secrets) == 0 {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("name", name, "dataset", spec.String())
	creds, err := datasource.CredentialsFromSecrets(secrets)
	if err != nil {
		logger.Error(err, "Not pre-staging dataset")
		return nil
	}
	lctx, cancel := budget(ctx, time.Minute)
	defer cancel()
	st, err := s.datasets.Prepare(lctx, poolName, spec, creds, usableBytes(size), true)
	switch {
	case datasource.Code(err) == codes.OutOfRange:
		return status.Errorf(codes.OutOfRange, "%v; requested capacity %d bytes: request a larger volume", err, size)
	case err != nil:
		logger.Error(err, "Pre-staging dataset failed")
	default:
		logger.V(2).Info("Pre-staging dataset", "status", st.String())
	}
	return nil
}

// budget is how long an RPC may wait for a dataset: until shortly before its deadline, or def
// without one.
func budget(ctx context.Context, def time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, dl.Add(-3*time.Second))
	}
	return context.WithTimeout(ctx, def)
}

// awaitDataset waits for a volume's dataset to be staged on its pool and for the caller to prove,
// with the secrets it brings, that it may read it. It returns the version proved, Unavailable with
// the progress while staging goes on (kubelet retries), and the staging error with its own code
// when staging failed. While it waits, the staging's progress is posted as Events about w's
// claim or pod (staging_events.go; w nil: none).
func (s *Service) awaitDataset(ctx context.Context, spec *datasource.Spec, poolName string, capacity int64, secrets, volumeContext map[string]string, w *stagingWatch) (string, error) {
	if err := s.datasets.CheckEndpoint(spec); err != nil {
		return "", status.Error(datasource.Code(err), err.Error())
	}
	creds, err := s.datasets.Credentials(ctx, spec, secrets, volumeContext)
	if err != nil {
		return "", status.Error(datasource.Code(err), err.Error())
	}
	wctx, cancel := budget(ctx, 30*time.Second)
	defer cancel()
	stop := s.watchStaging(w, poolName, spec)
	st, err := s.datasets.Prepare(wctx, poolName, spec, creds, capacity, false)
	stop()
	s.endWatch(w, st, err)
	if err != nil {
		return "", status.Error(datasource.Code(err), err.Error())
	}
	if !st.Ready() {
		return "", status.Errorf(codes.Unavailable, "%s; retry later", st)
	}
	return st.Version, nil
}

// fillDataset copies the staged dataset version the caller proved it may read into a volume's
// new filesystem; a volume already populated is left alone (its data is the user's now).
func (s *Service) fillDataset(ctx context.Context, spec *datasource.Spec, version, poolName, target string) error {
	if datasource.Populated(target, spec) {
		return nil
	}
	if err := s.datasets.Fill(ctx, poolName, spec, version, target); err != nil {
		return status.Errorf(datasource.Code(err), "filling volume from %s: %v", spec, err)
	}
	return nil
}

// DatasetProblem says what keeps a volume's dataset from being ready on its pool: Reason
// DatasetStaging, with the progress, while it stages; empty otherwise. Failures are told to the
// caller whose attempt failed (NodeStageVolume's error), not here.
func (s *Service) DatasetProblem(v state.Volume) (reason, message string) {
	spec, err := recordedDataset(v)
	if err != nil || spec == nil {
		return "", ""
	}
	if st, known, err := s.datasets.Status(v.Pool, spec); err == nil && known && !st.Ready() {
		return "DatasetStaging", st.String()
	}
	return "", ""
}
