package consts

const (
	// ParamOutputTarget names where the write-back of a writable dataset volume uploads what its
	// pods created or changed (s3://bucket/prefix, on the dataset's endpoint, with its
	// credentials); the prefix may hold PodNamespaceVar and PodNameVar (docs/datasets.md,
	// "Write-back").
	ParamOutputTarget = "outputTarget"
	// PodNamespaceVar and PodNameVar in an output target are replaced with the pod's namespace
	// and name, which kubelet passes with podInfoOnMount.
	PodNamespaceVar = "${pod.namespace}"
	PodNameVar      = "${pod.name}"
	// VolumeContextPodName is where kubelet passes the pod's name (its namespace:
	// VolumeContextPodNamespace).
	VolumeContextPodName = "csi.storage.k8s.io/pod.name"
)
