package consts

const (
	// ParamOutputTarget names where the write-back of a writable dataset volume uploads what its
	// pods created or changed (s3://bucket/prefix, on the dataset's endpoint, with its
	// credentials); the prefix may hold PodNamespaceVar and PodNameVar, a StorageClass's
	// PVCNamespaceVar, PVCNameVar and PVNameVar (docs/datasets.md, "Write-back").
	ParamOutputTarget = "outputTarget"
	// ParamOutputDeletions ("true" or "false", default false) makes the write-back also delete
	// at the output target the dataset paths the pods deleted (the overlay's whiteouts).
	ParamOutputDeletions = "outputDeletions"
	// ParamOutputInterval (a duration, e.g. "10m") makes the write-back also upload, at that
	// interval while the volume is in use, what changed since the last time (checkpoints);
	// the node's --writeback-min-interval bounds it below.
	ParamOutputInterval = "outputInterval"
	// PodNamespaceVar and PodNameVar in an output target are replaced with the pod's namespace
	// and name, which kubelet passes with podInfoOnMount.
	PodNamespaceVar = "${pod.namespace}"
	PodNameVar      = "${pod.name}"
	// PVCNamespaceVar, PVCNameVar and PVNameVar in a StorageClass's output target are replaced,
	// at CreateVolume, with the claim's namespace and name and the volume's name, which
	// external-provisioner passes with --extra-create-metadata (the same names its secret
	// templates take): each claim of a class gets a target of its own.
	PVCNamespaceVar = "${pvc.namespace}"
	PVCNameVar      = "${pvc.name}"
	PVNameVar       = "${pv.name}"
	// ParamPVCName, ParamPVCNamespace and ParamPVName are where external-provisioner passes
	// them among CreateVolume's parameters.
	ParamPVCName      = "csi.storage.k8s.io/pvc/name"
	ParamPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	ParamPVName       = "csi.storage.k8s.io/pv/name"
	// VolumeContextPodName is where kubelet passes the pod's name (its namespace:
	// VolumeContextPodNamespace).
	VolumeContextPodName = "csi.storage.k8s.io/pod.name"
	// VolumeContextPodUID is where kubelet passes the pod's UID (Events name the pod by it).
	VolumeContextPodUID = "csi.storage.k8s.io/pod.uid"
)
