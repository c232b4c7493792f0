package placement

import (
	"context"
	"maps"
	"strings"
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
// from the API server (a claim made just before its pod must be seen); it watches nothing. Reading
// VolumeSnapshots and their contents (sources.go) is granted by deploy/csi/snapshots, with the
// CRDs, not here.
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

// Webhook adds a preferred node affinity toward the nodes that hold a pod's datasets (those of
// the administrator's StorageClasses and PersistentVolumes only: see needs), and a
// required one toward the node that holds the snapshot or volume a new claim of the pod is made
// from. It never refuses a pod: on any error it admits the pod unchanged.
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
	needs, err := w.needs(ctx, pod)
	if err != nil {
		logger.V(2).Info("Admitting pod without data placement", "err", err)
		return nil
	}
	var nodeSets [][]string
	for _, want := range needs.datasets {
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
	if len(needs.sources) > 0 {
		if nodes := Common(needs.sources); len(nodes) == 0 {
			// The pod cannot run anywhere; the provisioners' ResourceExhausted says why, per claim.
			logger.V(2).Info("Volumes restored or cloned from data on different nodes; not requiring a node", "nodes", needs.sources)
		} else if Require(pod, nodes) {
			logger.V(3).Info("Requiring the nodes that hold the sources of the pod's new volumes", "nodes", nodes)
		}
	}
	return nil
}

// needs is what a pod's volumes ask of its node.
type needs struct {
	// datasets are preferred: one Want per distinct need.
	datasets []Want
	// sources are required: for each claim still to be provisioned from a node-local snapshot
	// or volume of the driver, the nodes that hold it.
	sources [][]string
}

// needs reads the pod's volumes: the Cistern datasets they name and the nodes their data sources
// hold.
func (w *Webhook) needs(ctx context.Context, pod *corev1.Pod) (needs, error) {
	var out needs
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
			out.datasets = append(out.datasets, want)
		}
	}
	for _, vol := range pod.Spec.Volumes {
		var (
			v     params.Volume
			ok    bool
			nodes []string
			err   error
		)
		switch {
		case vol.PersistentVolumeClaim != nil:
			v, ok, nodes, err = w.claim(ctx, pod.Namespace, vol.PersistentVolumeClaim.ClaimName)
		case vol.Ephemeral != nil && vol.Ephemeral.VolumeClaimTemplate != nil:
			// The claim is made from the template after the pod: to be provisioned, by definition.
			v, ok, nodes, err = w.unboundClaim(ctx, pod.Namespace, &vol.Ephemeral.VolumeClaimTemplate.Spec)
		case vol.CSI != nil && vol.CSI.Driver == w.DriverName:
			// An inline volume's dataset is the pod author's to name, with any bucket and prefix:
			// preferring the nodes that cache it would tell them, even on a dry run, whether a
			// guess is cached and where (the webhook cannot tell whether they may read it). Only
			// datasets of the administrator's classes and volumes are placed.
		}
		if err != nil {
			return needs{}, err
		}
		if ok {
			add(v)
		}
		if len(nodes) > 0 {
			out.sources = append(out.sources, nodes)
		}
	}
	return out, nil
}

// claim reads a claim: its parameters (ok is false for a claim that is not, or not yet, a Cistern
// one, or names no dataset) and, while it is unbound, the nodes its data source confines it to.
// Once bound, its PV's attributes say where its dataset may come from (a VolumeManager's static
// PV pinned to several nodes, a shared pool), and the PV's own node affinity confines the pod.
func (w *Webhook) claim(ctx context.Context, ns, name string) (params.Volume, bool, []string, error) {
	var pvc corev1.PersistentVolumeClaim
	if err := w.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &pvc); err != nil {
		return params.Volume{}, false, nil, ignoreNotFound(err)
	}
	if pvc.Spec.VolumeName == "" {
		return w.unboundClaim(ctx, ns, &pvc.Spec)
	}
	var pv corev1.PersistentVolume
	if err := w.Reader.Get(ctx, types.NamespacedName{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		return params.Volume{}, false, nil, ignoreNotFound(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != w.DriverName {
		return params.Volume{}, false, nil, nil
	}
	if strings.HasPrefix(pv.Spec.CSI.VolumeHandle, consts.VolumeManagerHandlePrefix) {
		// A VolumeManager's volume: a namespace user named its source. Its PV already confines
		// the pod to the nodes the VolumeManager staged on with its own credentials.
		return params.Volume{}, false, nil, nil
	}
	// The attributes also hold keys the provisioner adds: read the placement and dataset keys,
	// as the driver does for a volume it adopted.
	keys := maps.Clone(pv.Spec.CSI.VolumeAttributes)
	maps.DeleteFunc(keys, func(k, _ string) bool {
		return k != consts.ParamPool && k != consts.ParamPoolSelector && !params.IsDatasetKey(k)
	})
	v, err := params.Parse(keys, params.StorageClass)
	return v, err == nil, nil, nil
}

// unboundClaim reads a claim still to be provisioned (a WaitForFirstConsumer claim is provisioned
// where the scheduler puts its first pod): its class's parameters and, for a class of the driver,
// the nodes its data source is on.
func (w *Webhook) unboundClaim(ctx context.Context, ns string, spec *corev1.PersistentVolumeClaimSpec) (params.Volume, bool, []string, error) {
	sc, err := w.class(ctx, spec.StorageClassName)
	if sc == nil || err != nil {
		return params.Volume{}, false, nil, err
	}
	nodes, err := w.sourceNodes(ctx, ns, spec)
	if err != nil {
		return params.Volume{}, false, nil, err
	}
	v, err := params.Parse(sc.Parameters, params.StorageClass)
	return v, err == nil, nodes, nil
}

// class returns the StorageClass of that name if it is the driver's, else nil.
func (w *Webhook) class(ctx context.Context, class *string) (*storagev1.StorageClass, error) {
	if class == nil || *class == "" {
		return nil, nil
	}
	var sc storagev1.StorageClass
	if err := w.Reader.Get(ctx, types.NamespacedName{Name: *class}, &sc); err != nil {
		return nil, ignoreNotFound(err)
	}
	if sc.Provisioner != w.DriverName {
		return nil, nil
	}
	return &sc, nil
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
