package consts

const (
	// ParamOutputTarget names where the write-back of a writable dataset volume uploads what its
	// pods created or changed (s3://bucket/prefix, on the dataset's endpoint, with its
	// credentials); the prefix may hold PodNamespaceVar and PodNameVar (docs/datasets.md,
	// "Write-back").
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
	// VolumeContextPodName is where kubelet passes the pod's name (its namespace:
	// VolumeContextPodNamespace).
	VolumeContextPodName = "csi.storage.k8s.io/pod.name"
	// VolumeContextPodUID is where kubelet passes the pod's UID (Events name the pod by it).
	VolumeContextPodUID = "csi.storage.k8s.io/pod.uid"
)
