// Package volumemanager implements the VolumeManager (KVC) API: for each dataset it picks the
// nodes that hold it (nodes.go), builds a static PersistentVolume of the Cistern CSI driver pinned
// to those nodes and the claim users mount (build.go), and reconciles them (controller.go).
package volumemanager

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/url"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/params"
)

// Labels on the objects made for a VolumeManager; PersistentVolumes are cluster-scoped and cannot
// be owned by it, so these are how the controller finds them again.
const (
	LabelManager   = "data.cistern.dev/volumemanager"
	LabelNamespace = "data.cistern.dev/volumemanager-namespace"
	LabelVolumeID  = "data.cistern.dev/volume-id"
	// Finalizer releases the PersistentVolumes when the VolumeManager is deleted.
	Finalizer = "data.cistern.dev/release-volumes"
)

var (
	defaultCapacity = resource.MustParse("1Gi")
	// DefaultMaxCapacity bounds a VolumeConfig's capacity (the CRD cannot: see its field comment)
	// unless the administrator sets Config.MaxCapacity.
	DefaultMaxCapacity = resource.MustParse("1Pi")
)

// Config is what the admin decides for every VolumeManager.
type Config struct {
	// DriverName is the CSI driver; consts.DriverName by default.
	DriverName string
	// LocalSourceRoots are the node directories a Local source may name (the driver's
	// --local-source-roots); with none, Local sources are refused.
	LocalSourceRoots []string
	// NFSServers are the NFS servers (host or host:port) an NFS source may name (the driver's
	// --nfs-servers, the list it allows in inline volumes); with none, NFS sources are refused:
	// any namespace user writes a VolumeManager.
	NFSServers []string
	// StagerImage runs the stager pods (stager.go): any image whose entrypoint exits 0 given
	// --version, by default the controller's own.
	StagerImage string
	// MaxCapacity is the largest capacity a VolumeConfig may ask for (DefaultMaxCapacity when
	// zero). Any namespace user writes a VolumeManager, and with a writer access mode every pod
	// of it gets a writable copy of this size on its node: the administrator bounds it.
	MaxCapacity resource.Quantity
	// AllowControlPlane lets a VolumeManager whose tolerations allow it use control-plane nodes.
	// Off (the default), a control-plane node is never eligible, whatever a namespace user
	// tolerates: stager pods and tenants' cached data stay off the nodes of the API server.
	AllowControlPlane bool
}

func (c Config) maxCapacity() resource.Quantity {
	if c.MaxCapacity.IsZero() {
		return DefaultMaxCapacity
	}
	return c.MaxCapacity
}

func (c Config) driverName() string {
	if c.DriverName == "" {
		return consts.DriverName
	}
	return c.DriverName
}

// DatasetAttributes turns a volume config into the driver's dataset parameters. They are checked
// by the driver's own parser (pkg/params), so admission and the node give the same errors; on top,
// the source URL must match its type, a Local path must be under an allowed root, an NFS server
// must be one the administrator allows, and the capacity must be within bounds.
func DatasetAttributes(vc *datav1alpha1.VolumeConfig, cfg Config) (map[string]string, error) {
	want := map[datav1alpha1.SourceType]string{datav1alpha1.SourceS3: "s3", datav1alpha1.SourceNFS: "nfs", datav1alpha1.SourceLocal: "file"}[vc.SourceType]
	if want == "" {
		return nil, fmt.Errorf("sourceType %q is not S3, NFS or Local", vc.SourceType)
	}
	c := capacity(vc)
	attrs := map[string]string{consts.ParamSource: vc.SourceURL, consts.ParamCapacity: c.String()}
	for opt, param := range map[string]string{
		datav1alpha1.OptionEndpoint: consts.ParamEndpoint, datav1alpha1.OptionRegion: consts.ParamRegion,
		datav1alpha1.OptionPathStyle: consts.ParamPathStyle, datav1alpha1.OptionInclude: consts.ParamInclude,
		datav1alpha1.OptionExclude: consts.ParamExclude, datav1alpha1.OptionNFSVersion: consts.ParamNFSVersion,
	} {
		if v, ok := vc.Options[opt]; ok {
			attrs[param] = v
		}
	}
	if vc.OutputTarget != "" {
		attrs[consts.ParamOutputTarget] = vc.OutputTarget
		if vc.OutputDeletions {
			attrs[consts.ParamOutputDeletions] = "true"
		}
		if vc.OutputInterval != nil {
			attrs[consts.ParamOutputInterval] = vc.OutputInterval.Duration.String()
		}
	}
	u, err := url.Parse(vc.SourceURL)
	if err != nil {
		return nil, fmt.Errorf("sourceURL %q: %w", vc.SourceURL, err)
	}
	if u.Scheme != want {
		return nil, fmt.Errorf("sourceURL %q: a %s source must start with %s://", vc.SourceURL, vc.SourceType, want)
	}
	if max := cfg.maxCapacity(); vc.Capacity != nil && (vc.Capacity.Sign() <= 0 || vc.Capacity.Cmp(max) > 0) {
		return nil, fmt.Errorf("capacity %s is not more than 0 and at most %s", vc.Capacity.String(), max.String())
	}
	if vc.SourceType == datav1alpha1.SourceLocal {
		// Before the parser: it would name a ".." segment less plainly.
		if err := checkLocalPath(u, cfg.LocalSourceRoots); err != nil {
			return nil, fmt.Errorf("sourceURL %q: %w", vc.SourceURL, err)
		}
	}
	parsed, err := params.Parse(attrs, params.StaticPV)
	if err != nil {
		return nil, err
	}
	if host := parsed.Dataset.Host; vc.SourceType == datav1alpha1.SourceNFS && !slices.Contains(cfg.NFSServers, host) {
		return nil, fmt.Errorf("sourceURL %q: NFS server %s is not allowed (the administrator allows servers with --nfs-servers)", vc.SourceURL, host)
	}
	if err := checkOutputTarget(vc, cfg); err != nil {
		return nil, err
	}
	return attrs, nil
}

// checkOutputTarget holds an output target to the rules the node applies to a tenant's, so that
// a VolumeManager the node would refuse at each pod's start is Failed at once: a writer access
// mode (only pods' writable copies have outputs), no placeholder but the pod's, an S3 target only
// on an S3 dataset (its endpoint and keys write it), an NFS target only on a server the
// administrator allows.
func checkOutputTarget(vc *datav1alpha1.VolumeConfig, cfg Config) error {
	if vc.OutputTarget == "" {
		return nil
	}
	if !writable(vc) {
		return fmt.Errorf("outputTarget needs a writer accessMode: what is uploaded is each pod's writable copy")
	}
	filled := strings.NewReplacer(consts.PodNamespaceVar, "ns", consts.PodNameVar, "pod").Replace(vc.OutputTarget)
	if strings.Contains(filled, "${") {
		return fmt.Errorf("outputTarget %q holds a placeholder the node has no value for: a VolumeManager's target takes %s and %s", vc.OutputTarget, consts.PodNamespaceVar, consts.PodNameVar)
	}
	u, err := url.Parse(filled)
	if err != nil {
		return fmt.Errorf("outputTarget %q: %w", vc.OutputTarget, err)
	}
	switch u.Scheme {
	case "s3":
		if vc.SourceType != datav1alpha1.SourceS3 {
			return fmt.Errorf("outputTarget %q: an s3:// target is written on the dataset's S3 endpoint with its keys; a %s dataset has none (use nfs://)", vc.OutputTarget, vc.SourceType)
		}
	case "nfs":
		if !slices.Contains(cfg.NFSServers, u.Host) {
			return fmt.Errorf("outputTarget %q: NFS server %s is not allowed (the administrator allows servers with --nfs-servers)", vc.OutputTarget, u.Host)
		}
	default:
		return fmt.Errorf("outputTarget %q is not s3://bucket[/prefix] or nfs://server/export[/path]", vc.OutputTarget)
	}
	return nil
}

// checkLocalPath accepts file:///dir only under an allowed root. Each segment is checked before
// any cleaning, so "/allowed/../etc" is refused rather than normalised.
func checkLocalPath(u *url.URL, roots []string) error {
	p := u.Path
	if !path.IsAbs(p) || slices.Contains(strings.Split(p, "/"), "..") {
		return fmt.Errorf("path %q must be absolute without '..'", p)
	}
	for _, r := range roots {
		r = path.Clean(r)
		if p == r || strings.HasPrefix(p, strings.TrimSuffix(r, "/")+"/") {
			return nil
		}
	}
	if len(roots) == 0 {
		return fmt.Errorf("local sources are disabled (no --local-source-roots)")
	}
	return fmt.Errorf("path %q is not under an allowed root (%s)", p, strings.Join(roots, ", "))
}

// objectName names the PV and PVC of one volume on one node set: a new node set is a new pair, since
// a bound claim cannot move to another volume and a volume's node affinity cannot change.
func objectName(vm *datav1alpha1.VolumeManager, id string, nodes []string) string {
	sum := sha256.Sum256([]byte(vm.Namespace + "/" + vm.Name + "/" + id + "/" + strings.Join(nodes, ",")))
	return fmt.Sprintf("%s-%s-%s", vm.Name, id, hex.EncodeToString(sum[:])[:8])
}

// pvName is cluster-wide, so it carries the namespace too.
func pvName(vm *datav1alpha1.VolumeManager, id string, nodes []string) string {
	sum := sha256.Sum256([]byte(vm.Namespace + "/" + objectName(vm, id, nodes)))
	return consts.VolumeManagerHandlePrefix + hex.EncodeToString(sum[:])[:20]
}

func accessMode(vc *datav1alpha1.VolumeConfig) corev1.PersistentVolumeAccessMode {
	if vc.AccessMode == "" {
		return corev1.ReadOnlyMany
	}
	return vc.AccessMode
}

// writable says whether pods get writable copies of the data (every mode but ReadOnlyMany).
func writable(vc *datav1alpha1.VolumeConfig) bool { return accessMode(vc) != corev1.ReadOnlyMany }

func capacity(vc *datav1alpha1.VolumeConfig) resource.Quantity {
	if vc.Capacity == nil {
		return defaultCapacity
	}
	return *vc.Capacity
}

func labels(vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig) map[string]string {
	l := maps.Clone(vc.Labels)
	if l == nil {
		l = map[string]string{}
	}
	l[LabelManager] = vm.Name
	l[LabelNamespace] = vm.Namespace
	l[LabelVolumeID] = vc.ID
	return l
}

// NodeAffinity selects the given nodes by the driver's topology key.
func NodeAffinity(nodes []string) *corev1.NodeAffinity {
	return &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
			Key: consts.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: slices.Clone(nodes),
		}}}},
	}}
}

// PersistentVolume is the static volume of the Cistern driver holding the dataset on nodes. It
// is Retain: deleting it releases the dataset, and the node cache keeps the bytes until evicted.
func PersistentVolume(vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig, nodes []string, attrs map[string]string, cfg Config) *corev1.PersistentVolume {
	driver := cfg.driverName()
	name := objectName(vm, vc.ID, nodes)
	csi := &corev1.CSIPersistentVolumeSource{
		Driver:           driver,
		VolumeHandle:     pvName(vm, vc.ID, nodes),
		ReadOnly:         !writable(vc),
		VolumeAttributes: maps.Clone(attrs),
	}
	if csi.VolumeAttributes == nil {
		csi.VolumeAttributes = map[string]string{}
	}
	// The namespace of the claim it is bound to, as external-provisioner names a provisioned
	// volume's: the node charges the VolumeManager's listings to it (NodeStageVolume names no pod).
	csi.VolumeAttributes[consts.VolumeContextPVCNamespace] = vm.Namespace
	if s := vc.Options[datav1alpha1.OptionSecretName]; s != "" {
		csi.NodeStageSecretRef = &corev1.SecretReference{Name: s, Namespace: vm.Namespace}
		if writable(vc) {
			// Each writable copy is filled from the cached version the caller proves it may read.
			csi.NodePublishSecretRef = csi.NodeStageSecretRef.DeepCopy()
		}
	}
	return &corev1.PersistentVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: pvName(vm, vc.ID, nodes), Labels: labels(vm, vc)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: capacity(vc)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{accessMode(vc)},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			VolumeMode:                    ptr.To(corev1.PersistentVolumeFilesystem),
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: csi},
			ClaimRef: &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim",
				Namespace: vm.Namespace, Name: name},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: NodeAffinity(nodes).RequiredDuringSchedulingIgnoredDuringExecution},
		},
	}
}

// PersistentVolumeClaim is the claim users mount, bound to the PersistentVolume of the same nodes.
func PersistentVolumeClaim(vm *datav1alpha1.VolumeManager, vc *datav1alpha1.VolumeConfig, nodes []string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{
			Name: objectName(vm, vc.ID, nodes), Namespace: vm.Namespace, Labels: labels(vm, vc),
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{accessMode(vc)},
			StorageClassName: ptr.To(""),
			VolumeName:       pvName(vm, vc.ID, nodes),
			VolumeMode:       ptr.To(corev1.PersistentVolumeFilesystem),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: capacity(vc)}},
		},
	}
}

// StatusVolume is what users read: the volumeSource for their pods, the affinity that sends
// them to the nodes its claim serves, and the data's state on each node.
func StatusVolume(vc *datav1alpha1.VolumeConfig, claim string, serving []string, nodes []datav1alpha1.NodeStatus, msg string) datav1alpha1.Volume {
	return datav1alpha1.Volume{
		ID: vc.ID,
		VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
			ClaimName: claim, ReadOnly: !writable(vc)}},
		NodeAffinity: NodeAffinity(serving),
		Nodes:        slices.Clone(nodes),
		Message:      msg,
	}
}
