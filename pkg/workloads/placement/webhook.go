package placement

import (
	"context"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/params"
)

// The webhook reads claims, volumes and classes by name and lists StoragePools by label, straight
// from the API server (a claim made just before its pod must be seen); it watches nothing.
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims;persistentvolumes,verbs=get
// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get
// +kubebuilder:rbac:groups=storagepool.storage.k8s.io,resources=storagepools,verbs=list

// Path is where the pod placement webhook is served.
const Path = "/mutate-pod-placement"

// Budget is how long one admission may spend reading; the webhook configuration's timeout is
// longer, so a slow API server ends in an unchanged pod, not in the failure policy.
const Budget = time.Second

// Register adds the pod placement webhook to srv. reader must read from the API server, not a
// cache.
func Register(srv webhook.Server, scheme *runtime.Scheme, reader client.Reader, driverName string) {
	srv.Register(Path, admission.WithDefaulter[*corev1.Pod](scheme, &Webhook{Reader: reader, DriverName: driverName}))
}

// Webhook adds a preferred node affinity toward the nodes that hold a pod's datasets. It never
// refuses a pod: on any error it admits the pod unchanged.
type Webhook struct {
	Reader     client.Reader
	DriverName string
}

// Default is the admission entry point.
func (w *Webhook) Default(ctx context.Context, pod *corev1.Pod) error {
	if pod.Spec.NodeName != "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, Budget)
	defer cancel()
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod))
	wants, err := w.wants(ctx, pod)
	if err != nil {
		logger.V(2).Info("Admitting pod without data placement", "err", err)
		return nil
	}
	var nodeSets [][]string
	for _, want := range wants {
		var pools spapi.StoragePoolList
		if err := w.Reader.List(ctx, &pools, client.MatchingLabelsSelector{Selector: want.LabelSelector()}); err != nil {
			logger.V(2).Info("Admitting pod without data placement", "dataset", want.DatasetID, "err", err)
			return nil
		}
		nodes := want.Nodes(pools.Items)
		logger.V(4).Info("Dataset location", "dataset", want.DatasetID, "nodes", nodes)
		nodeSets = append(nodeSets, nodes)
	}
	if Prefer(pod, nodeSets) {
		logger.V(3).Info("Preferring nodes that hold the pod's data", "terms", pod.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
	}
	return nil
}

// wants lists what each of the pod's Cistern dataset volumes needs, once per distinct need.
func (w *Webhook) wants(ctx context.Context, pod *corev1.Pod) ([]Want, error) {
	var out []Want
	seen := map[string]bool{}
	add := func(v params.Volume) {
		want, ok := WantOf(v)
		if !ok {
			return
		}
		key := want.DatasetID + "\x00" + want.Pool + "\x00"
		if want.PoolSelector != nil {
			key += want.PoolSelector.String()
		}
		if !seen[key] {
			seen[key] = true
			out = append(out, want)
		}
	}
	for _, vol := range pod.Spec.Volumes {
		var (
			v   params.Volume
			ok  bool
			err error
		)
		switch {
		case vol.PersistentVolumeClaim != nil:
			v, ok, err = w.claimVolume(ctx, pod.Namespace, vol.PersistentVolumeClaim.ClaimName)
		case vol.Ephemeral != nil && vol.Ephemeral.VolumeClaimTemplate != nil:
			v, ok, err = w.classVolume(ctx, vol.Ephemeral.VolumeClaimTemplate.Spec.StorageClassName)
		case vol.CSI != nil && vol.CSI.Driver == w.DriverName:
			// Parsed as the driver will; a volume it would refuse names no dataset here.
			v, err = params.Parse(vol.CSI.VolumeAttributes, params.Inline)
			ok = err == nil
			err = nil
		}
		if err != nil {
			return nil, err
		}
		if ok {
			add(v)
		}
	}
	return out, nil
}

// claimVolume reads a claim's parameters: the PV's volume attributes once it is bound, its
// class's parameters before (a WaitForFirstConsumer claim is provisioned where the scheduler
// puts its first pod). ok is false for a claim that is not (yet) a Cistern one.
func (w *Webhook) claimVolume(ctx context.Context, ns, name string) (params.Volume, bool, error) {
	var pvc corev1.PersistentVolumeClaim
	if err := w.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &pvc); err != nil {
		return params.Volume{}, false, ignoreNotFound(err)
	}
	if pvc.Spec.VolumeName == "" {
		return w.classVolume(ctx, pvc.Spec.StorageClassName)
	}
	var pv corev1.PersistentVolume
	if err := w.Reader.Get(ctx, types.NamespacedName{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		return params.Volume{}, false, ignoreNotFound(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != w.DriverName {
		return params.Volume{}, false, nil
	}
	// The attributes also hold keys the provisioner adds: read the placement and dataset keys,
	// as the driver does for a volume it adopted.
	keys := maps.Clone(pv.Spec.CSI.VolumeAttributes)
	maps.DeleteFunc(keys, func(k, _ string) bool {
		return k != consts.ParamPool && k != consts.ParamPoolSelector && !params.IsDatasetKey(k)
	})
	v, err := params.Parse(keys, params.StorageClass)
	return v, err == nil, nil
}

func (w *Webhook) classVolume(ctx context.Context, class *string) (params.Volume, bool, error) {
	if class == nil || *class == "" {
		return params.Volume{}, false, nil
	}
	var sc storagev1.StorageClass
	if err := w.Reader.Get(ctx, types.NamespacedName{Name: *class}, &sc); err != nil {
		return params.Volume{}, false, ignoreNotFound(err)
	}
	if sc.Provisioner != w.DriverName {
		return params.Volume{}, false, nil
	}
	v, err := params.Parse(sc.Parameters, params.StorageClass)
	return v, err == nil, nil
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
