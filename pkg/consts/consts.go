// Package consts holds the names every Cistern component agrees on: driver name, topology key,
// parameter keys, labels. Keep them here so the driver, sidecar and controllers cannot drift.
package consts

const (
	// DriverName is the default CSI driver name (flag --driver-name).
	DriverName = "cistern.csi.dev"
	// TopologyKey is the topology segment key NodeGetInfo reports; its value is the node ID.
	TopologyKey = "topology.cistern.csi.dev/node"

	// ParamPool targets one pool by name (StorageClass parameter).
	ParamPool = "pool"
	// ParamPoolSelector targets any pool whose labels match, e.g. "media=ssd,tier=hot".
	ParamPoolSelector = "poolSelector"
	// ParamFSType selects the filesystem of a volume image (ext4 or xfs).
	ParamFSType = "csi.storage.k8s.io/fstype"
	// ParamSize is the size of a CSI inline volume (a resource quantity, e.g. 2Gi); only valid in
	// inline volume attributes.
	ParamSize = "size"
	// ParamInlineContext marks a CSI inline volume's context (kubelet sets it to "true").
	ParamInlineContext = "csi.storage.k8s.io/ephemeral"
	// ParamReadAheadKiB is the one mutable parameter (VolumeAttributesClass): the read-ahead of
	// the volume's loop device. Large sequential reads of datasets and model files gain from a
	// bigger read-ahead; random-access workloads from a smaller one.
	ParamReadAheadKiB = "readAheadKiB"
	// ParamCapacity is the most a static PV's dataset may take on a node (a resource quantity);
	// the VolumeManager controller writes its volumes' capacity here. A larger dataset fails
	// staging with OutOfRange, and each writable copy of the volume gets this size.
	ParamCapacity = "capacity"
	// ParamDataMode chooses how a dataset volume gets its data: DataModeStaged (the default)
	// publishes it once the whole dataset is on the node; DataModeStreaming publishes it as soon
	// as the listing is taken and the caller's access proved, and fetches what is read before it
	// is staged (pkg/streamfs): a read-only volume is the streaming tree, a writable one an
	// overlay on it.
	ParamDataMode     = "dataMode"
	DataModeStaged    = "staged"
	DataModeStreaming = "streaming"
	// ReservedParamPrefix is the prefix of keys external-provisioner adds; always accepted.
	ReservedParamPrefix = "csi.storage.k8s.io/"

	// Dataset parameters (see pkg/datasource).
	ParamSource    = "source"
	ParamEndpoint  = "endpoint"
	ParamRegion    = "region"
	ParamPathStyle = "pathStyle"
	ParamInclude   = "include"
	ParamExclude   = "exclude"
	// ParamNFSVersion is an nfs:// dataset's protocol: NFSVersion3 (the default: go-nfs-client,
	// MOUNT and the export path) or NFSVersion4 (libnfs, the server's NFSv4 namespace, its pseudo
	// path).
	ParamNFSVersion = "nfsVersion"
	NFSVersion3     = "3"
	NFSVersion4     = "4"
	// ParamCABundle names the CA bundle (a file of the driver's --s3-ca-bundles directory, a key
	// of the ConfigMap or Secret mounted there) that verifies an https endpoint.
	ParamCABundle = "caBundle"
	// ParamCredentials selects where an S3 dataset's keys come from: "secret" (the default: the
	// CSI secret, or anonymous without one) or "webIdentity" (the pod's ServiceAccount token
	// exchanged for a role's keys; ParamRoleARN names the role).
	ParamCredentials = "credentials"
	ParamRoleARN     = "roleARN"
	// ParamRoleFrom, instead of ParamRoleARN, takes the role from the pod's ServiceAccount:
	// RoleFromServiceAccount reads its AnnotationRoleARN, or else AnnotationEKSRoleARN.
	ParamRoleFrom          = "roleFrom"
	RoleFromServiceAccount = "serviceAccount"
	// AnnotationRoleARN is the ServiceAccount annotation naming the role its pods' web-identity
	// datasets take (roleFrom=serviceAccount); AnnotationEKSRoleARN, IRSA's, is read when it is
	// absent, so a ServiceAccount set up for IRSA needs nothing more.
	AnnotationRoleARN    = "cistern.csi.dev/role-arn"
	AnnotationEKSRoleARN = "eks.amazonaws.com/role-arn"
	// VolumeContextSAName and VolumeContextPodNamespace are where kubelet names the pod's
	// ServiceAccount and namespace in NodePublishVolume's volume context (podInfoOnMount).
	VolumeContextSAName       = "csi.storage.k8s.io/serviceAccount.name"
	VolumeContextPodNamespace = "csi.storage.k8s.io/pod.namespace"
	// VolumeContextPVCNamespace is the claim's namespace: in CreateVolume's parameters
	// (external-provisioner's --extra-create-metadata), hence in a provisioned volume's record,
	// and in the volumeAttributes of the PersistentVolumes the VolumeManager controller makes
	// for the claims of its namespace.
	VolumeContextPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	// CredentialsWebIdentity is ParamCredentials' value for web-identity credentials.
	CredentialsWebIdentity = "webIdentity"
	// DefaultWebIdentityAudience is the audience of the ServiceAccount tokens exchanged for a
	// role's keys: AWS STS's (IRSA's), which most other STS implementations accept too.
	DefaultWebIdentityAudience = "sts.amazonaws.com"
	// VolumeContextSATokens is where kubelet puts the pod's ServiceAccount tokens for the
	// CSIDriver's tokenRequests (NodePublishVolume's volume context, JSON by audience).
	VolumeContextSATokens = "csi.storage.k8s.io/serviceAccount.tokens"

	// VolumeManagerHandlePrefix starts the volume handle of every static PV the VolumeManager
	// controller makes. Only holders of PV create permission can name a handle, so the driver
	// treats such PVs as written by the VolumeManager's (untrusted) author.
	VolumeManagerHandlePrefix = "cistern-vm-"

	// StartupTaintKey is the node taint that keeps pods off a node until its node plugin serves
	// and kubelet has registered it: the administrator registers nodes with it (kubelet
	// --register-with-taints), the node DaemonSet tolerates it, and the node plugin with
	// --remove-startup-taint removes it from its own Node (pkg/startuptaint).
	StartupTaintKey = "cistern.csi.dev/agent-not-ready"

	// LabelPool and LabelNode label StoragePool objects.
	LabelPool = "cistern.csi.dev/pool"
	LabelNode = "cistern.csi.dev/node"
	// LabelShared marks the StoragePool object of a shared pool (value "true"); it has no node label.
	LabelShared = "cistern.csi.dev/shared"
	// LabelDatasetPrefix, followed by a dataset ID, labels the StoragePool of a node-local pool
	// whose cache holds that dataset Ready (value "true"), so that "which nodes hold dataset X"
	// is a label selector: -l dataset.cistern.csi.dev/<id>.
	LabelDatasetPrefix = "dataset.cistern.csi.dev/"

	// LabelDataPlacement set to DataPlacementDisabled on a Namespace keeps its pods away from the
	// workload-controller's pod placement webhook (no preference for nodes holding their data).
	LabelDataPlacement    = "cistern.csi.dev/data-placement"
	DataPlacementDisabled = "disabled"

	// LabelSnapshotManagedBy is external-snapshotter's label naming the node whose csi-snapshotter
	// (in node-deployment mode) handles a VolumeSnapshotContent; the sidecar ignores contents
	// without it. The snapshot-controller sets it on the contents it creates; the
	// workload-controller sets it on hand-made ones of the driver (pkg/workloads/snapshotnode).
	LabelSnapshotManagedBy = "snapshot.storage.kubernetes.io/managed-by"

	// StoragePoolGroup is the API group of StoragePool objects (the KEP's group).
	StoragePoolGroup = "storagepool.storage.k8s.io"
)
