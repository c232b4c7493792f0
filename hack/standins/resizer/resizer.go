// Package resizer is the controller of the external-resizer stand-in (hack/standins): it expands
// the volumes of claims whose request grew, as kubernetes-csi/external-resizer does for the
// current API (allocatedResources and allocatedResourceStatuses, RecoverVolumeExpansionFailure
// being GA).
//
// A claim is expanded when it is Bound, its request exceeds status.capacity, its class allows
// expansion and its PersistentVolume is this driver's and bound to it (claimRef UID). With a
// node name (node deployment, as external-resizer's pull request #573 proposes for node-local
// volumes, and as external-provisioner and csi-snapshotter have it) only volumes whose node
// affinity matches that node are taken: each node's driver holds its own volumes and answers
// NotFound for the others'.
//
// The steps, each a write the next sync sees:
//
//  1. the claim's status: condition Resizing, allocatedResources = the request,
//     allocatedResourceStatuses = ControllerResizeInProgress; Event Resizing;
//  2. ControllerExpandVolume; on error an Event VolumeResizeFailed and a retry with the queue's
//     exponential backoff (a final error also sets condition ControllerResizeError, and
//     InvalidArgument or OutOfRange the status ControllerResizeInfeasible);
//  3. the PersistentVolume's spec.capacity;
//  4. node expansion required: condition FileSystemResizePending and status NodeResizePending
//     (Event FileSystemResizeRequired), and kubelet's NodeExpandVolume finishes the claim; else
//     status.capacity, no resize condition or status, Event VolumeResizeSuccessful.
package resizer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// Event reasons, external-resizer's.
const (
	ReasonResizing         = "Resizing"
	ReasonResizeFailed     = "VolumeResizeFailed"
	ReasonResizeSuccessful = "VolumeResizeSuccessful"
	ReasonFSResizeRequired = "FileSystemResizeRequired"
)

// Expander is the driver's controller service as the controller uses it (csi.ControllerClient).
type Expander interface {
	ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest, opts ...grpc.CallOption) (*csi.ControllerExpandVolumeResponse, error)
}

// Config is what New needs.
type Config struct {
	Client     kubernetes.Interface
	DriverName string
	Expander   Expander
	// Timeout of one ControllerExpandVolume call.
	Timeout time.Duration
	// NodeName, when set, limits the controller to volumes whose node affinity matches that Node.
	NodeName string
	// ResyncPeriod of the informers; 0: none.
	ResyncPeriod time.Duration
	// RetryStart and RetryMax bound the exponential backoff of a failed claim.
	RetryStart, RetryMax time.Duration
}

// Controller expands claims; Run drives it.
type Controller struct {
	cfg      Config
	factory  informers.SharedInformerFactory
	nodes    informers.SharedInformerFactory
	claims   corelisters.PersistentVolumeClaimLister
	volumes  corelisters.PersistentVolumeLister
	classes  storagelisters.StorageClassLister
	node     corelisters.NodeLister
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	events   record.EventBroadcaster
}

// New builds the controller and registers its informers' handlers.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Expander == nil || cfg.DriverName == "" {
		return nil, errors.New("resizer: a client, an expander and a driver name are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.RetryStart <= 0 {
		cfg.RetryStart = time.Second
	}
	if cfg.RetryMax < cfg.RetryStart {
		cfg.RetryMax = 5 * time.Minute
	}
	c := &Controller{
		cfg:     cfg,
		factory: informers.NewSharedInformerFactory(cfg.Client, cfg.ResyncPeriod),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryStart, cfg.RetryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "resizer-pvc"}),
	}
	c.events = record.NewBroadcaster()
	c.recorder = c.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "external-resizer " + cfg.DriverName})

	pvcs := c.factory.Core().V1().PersistentVolumeClaims()
	pvs := c.factory.Core().V1().PersistentVolumes()
	scs := c.factory.Storage().V1().StorageClasses()
	c.claims, c.volumes, c.classes = pvcs.Lister(), pvs.Lister(), scs.Lister()
	c.synced = []cache.InformerSynced{pvcs.Informer().HasSynced, pvs.Informer().HasSynced, scs.Informer().HasSynced}
	if _, err := pvcs.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, obj any) { c.enqueue(obj) },
	}); err != nil {
		return nil, err
	}
	// A volume's capacity or claimRef decides too (a sync may have seen the claim first).
	if _, err := pvs.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueClaimOf,
		UpdateFunc: func(_, obj any) { c.enqueueClaimOf(obj) },
	}); err != nil {
		return nil, err
	}
	if cfg.NodeName != "" {
		// Only this Node: its labels (the topology kubelet sets once the driver registers)
		// decide which volumes are this node's.
		c.nodes = informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
			}))
		n := c.nodes.Core().V1().Nodes()
		c.node = n.Lister()
		c.synced = append(c.synced, n.Informer().HasSynced)
	}
	return c, nil
}

// Run starts the informers and workers and returns when ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	logger := klog.FromContext(ctx)
	c.events.StartStructuredLogging(4)
	c.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.cfg.Client.CoreV1().Events("")})
	defer c.events.Shutdown()
	defer c.queue.ShutDown()
	c.factory.Start(ctx.Done())
	if c.nodes != nil {
		c.nodes.Start(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return ctx.Err()
	}
	logger.Info("Starting external resizer", "driver", c.cfg.DriverName, "node", c.cfg.NodeName, "workers", workers)
	for range max(workers, 1) {
		go wait.UntilWithContext(ctx, c.work, time.Second)
	}
	<-ctx.Done()
	return nil
}

func (c *Controller) enqueue(obj any) {
	if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		c.queue.Add(key)
	}
}

func (c *Controller) enqueueClaimOf(obj any) {
	if pv, ok := obj.(*corev1.PersistentVolume); ok && pv.Spec.ClaimRef != nil {
		c.queue.Add(pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name)
	}
}

func (c *Controller) work(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.Sync(ctx, key); err != nil {
		klog.FromContext(ctx).Error(err, "Expanding the claim failed; retrying", "claim", key, "retries", c.queue.NumRequeues(key))
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// Sync expands the claim of the key (namespace/name) if it asks for it and is this
// controller's. An error means: retry later.
func (c *Controller) Sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pvc, err := c.claims.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if _, ok, err := c.volumeToExpand(pvc, nil); err != nil || !ok {
		return err
	}
	// The caches may lag behind this controller's own writes (the volume's new capacity seen
	// before the claim's NodeResizePending): decide again on both as the API server has them,
	// so that a volume already expanded is not expanded again, which a driver may answer
	// without node_expansion_required, finishing a claim whose filesystem never grew.
	pvc, err = c.cfg.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	pv, err := c.cfg.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if _, ok, err := c.volumeToExpand(pvc, pv); err != nil || !ok {
		return err
	}
	return c.expand(ctx, pvc, pv)
}

// volumeToExpand returns the claim's PersistentVolume (pv, or the cache's when nil) when the
// claim asks for more than it has and the volume is this controller's to expand now.
func (c *Controller) volumeToExpand(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) (*corev1.PersistentVolume, bool, error) {
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return nil, false, nil
	}
	request := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	capacity := pvc.Status.Capacity[corev1.ResourceStorage]
	if request.Cmp(capacity) <= 0 {
		return nil, false, nil
	}
	if pv == nil {
		var err error
		pv, err = c.volumes.Get(pvc.Spec.VolumeName)
		if apierrors.IsNotFound(err) {
			return nil, false, nil
		} else if err != nil {
			return nil, false, err
		}
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != c.cfg.DriverName {
		return nil, false, nil
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.Namespace != pvc.Namespace || ref.UID != pvc.UID {
		return nil, false, nil
	}
	if !c.classAllowsExpansion(pvc) {
		return nil, false, nil
	}
	if c.cfg.NodeName != "" {
		mine, err := c.onThisNode(pv)
		if err != nil || !mine {
			return nil, false, err
		}
	}
	// The volume has grown: kubelet's turn (NodeExpandVolume), not ours.
	pvSize := pv.Spec.Capacity[corev1.ResourceStorage]
	switch pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] {
	case corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimNodeResizeInProgress:
		if pvSize.Cmp(request) >= 0 {
			return nil, false, nil
		}
	}
	if pvSize.Cmp(request) >= 0 && hasCondition(pvc, corev1.PersistentVolumeClaimFileSystemResizePending) {
		return nil, false, nil
	}
	return pv, true, nil
}

func (c *Controller) classAllowsExpansion(pvc *corev1.PersistentVolumeClaim) bool {
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName == "" {
		return false
	}
	sc, err := c.classes.Get(*pvc.Spec.StorageClassName)
	return err == nil && sc.AllowVolumeExpansion != nil && *sc.AllowVolumeExpansion
}

// onThisNode says whether the volume's node affinity matches this controller's Node. A volume
// with no affinity is no node's.
func (c *Controller) onThisNode(pv *corev1.PersistentVolume) (bool, error) {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return false, nil
	}
	node, err := c.node.Get(c.cfg.NodeName)
	if err != nil {
		return false, fmt.Errorf("reading node %s: %w", c.cfg.NodeName, err)
	}
	return nodeaffinity.NewLazyErrorNodeSelector(pv.Spec.NodeAffinity.Required).Match(node)
}

func (c *Controller) expand(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) error {
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(pvc), "volume", pv.Name)
	request := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	pvc, err := c.updateStatus(ctx, pvc, func(s *corev1.PersistentVolumeClaimStatus) {
		setResizeCondition(s, corev1.PersistentVolumeClaimCondition{Type: corev1.PersistentVolumeClaimResizing, Status: corev1.ConditionTrue})
		setStorage(&s.AllocatedResources, request)
		setStorageStatus(s, corev1.PersistentVolumeClaimControllerResizeInProgress)
	})
	if err != nil {
		return fmt.Errorf("marking the claim as resizing: %w", err)
	}
	c.recorder.Eventf(pvc, corev1.EventTypeNormal, ReasonResizing, "External resizer is resizing volume %s", pv.Name)

	size, nodeExpansion, err := c.callExpand(ctx, pv, request)
	if err != nil {
		c.recorder.Eventf(pvc, corev1.EventTypeWarning, ReasonResizeFailed, "resize volume %q by resizer %q failed: %v", pv.Name, c.cfg.DriverName, err)
		if final(err) {
			c.markFailed(ctx, pvc, err)
		}
		return fmt.Errorf("ControllerExpandVolume of %s: %w", pv.Name, err)
	}
	logger.V(2).Info("Volume expanded by the driver", "capacity", size.String(), "nodeExpansionRequired", nodeExpansion)
	if err := c.setVolumeCapacity(ctx, pv, size); err != nil {
		return err
	}
	if nodeExpansion {
		if _, err := c.updateStatus(ctx, pvc, func(s *corev1.PersistentVolumeClaimStatus) {
			setResizeCondition(s, corev1.PersistentVolumeClaimCondition{
				Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue,
				Message: "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
			})
			setStorageStatus(s, corev1.PersistentVolumeClaimNodeResizePending)
		}); err != nil {
			return fmt.Errorf("marking the claim for node expansion: %w", err)
		}
		c.recorder.Event(pvc, corev1.EventTypeNormal, ReasonFSResizeRequired, "Require file system resize of volume on node")
		return nil
	}
	if _, err := c.updateStatus(ctx, pvc, func(s *corev1.PersistentVolumeClaimStatus) {
		setStorage(&s.Capacity, size)
		setResizeCondition(s)
		delete(s.AllocatedResourceStatuses, corev1.ResourceStorage)
		if len(s.AllocatedResourceStatuses) == 0 {
			s.AllocatedResourceStatuses = nil
		}
	}); err != nil {
		return fmt.Errorf("marking the claim as resized: %w", err)
	}
	c.recorder.Event(pvc, corev1.EventTypeNormal, ReasonResizeSuccessful, "Resize volume succeeded")
	return nil
}

// callExpand asks the driver for the size, with the volume's capability (its mode, filesystem
// and access mode) as external-resizer passes it. The size is what the driver answers, or the
// request when it answers none.
func (c *Controller) callExpand(ctx context.Context, pv *corev1.PersistentVolume, request resource.Quantity) (resource.Quantity, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	resp, err := c.cfg.Expander.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
		VolumeId:         pv.Spec.CSI.VolumeHandle,
		CapacityRange:    &csi.CapacityRange{RequiredBytes: request.Value()},
		VolumeCapability: capability(pv),
	})
	if err != nil {
		return resource.Quantity{}, false, err
	}
	size := request
	if resp.GetCapacityBytes() > 0 {
		size = *resource.NewQuantity(resp.GetCapacityBytes(), resource.BinarySI)
	}
	return size, resp.GetNodeExpansionRequired(), nil
}

func capability(pv *corev1.PersistentVolume) *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: accessMode(pv.Spec.AccessModes)}}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: pv.Spec.CSI.FSType, MountFlags: pv.Spec.MountOptions}}
	}
	return c
}

func accessMode(modes []corev1.PersistentVolumeAccessMode) csi.VolumeCapability_AccessMode_Mode {
	for _, m := range modes {
		switch m {
		case corev1.ReadWriteOncePod:
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		case corev1.ReadWriteMany:
			return csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		case corev1.ReadOnlyMany:
			return csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
		}
	}
	return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
}

// final says whether a failed call ended (the driver refused it) rather than possibly still
// going on, with external-resizer's split of the gRPC codes.
func final(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return false
	}
	return true
}

// markFailed records a final failure on the claim: condition ControllerResizeError, and
// ControllerResizeInfeasible for a size the driver cannot give (the user must change the
// request). A failure to record it is logged: the retry records it again.
func (c *Controller) markFailed(ctx context.Context, pvc *corev1.PersistentVolumeClaim, cause error) {
	code := status.Code(cause)
	if _, err := c.updateStatus(ctx, pvc, func(s *corev1.PersistentVolumeClaimStatus) {
		setResizeCondition(s, corev1.PersistentVolumeClaimCondition{
			Type: corev1.PersistentVolumeClaimControllerResizeError, Status: corev1.ConditionTrue,
			Message: "CSI ControllerExpandVolume failed: " + cause.Error(),
		})
		if code == codes.InvalidArgument || code == codes.OutOfRange {
			setStorageStatus(s, corev1.PersistentVolumeClaimControllerResizeInfeasible)
		}
	}); err != nil {
		klog.FromContext(ctx).Error(err, "Recording the failed expansion on the claim", "claim", klog.KObj(pvc))
	}
}

// updateStatus applies change to a copy of the claim's status and writes it when it changed. A
// conflict (kube-controller-manager annotates the claim as it grows, kubelet writes its status)
// is retried on the claim as the API server has it: losing the write that follows a successful
// ControllerExpandVolume would call the driver again, and the driver's answer to a volume
// already at the size need not say again that the node must expand it.
func (c *Controller) updateStatus(ctx context.Context, pvc *corev1.PersistentVolumeClaim, change func(*corev1.PersistentVolumeClaimStatus)) (*corev1.PersistentVolumeClaim, error) {
	claims := c.cfg.Client.CoreV1().PersistentVolumeClaims(pvc.Namespace)
	cur, out := pvc, pvc
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		next := cur.DeepCopy()
		change(&next.Status)
		if statusEqual(cur.Status, next.Status) {
			out = cur
			return nil
		}
		updated, err := claims.UpdateStatus(ctx, next, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if latest, gerr := claims.Get(ctx, pvc.Name, metav1.GetOptions{}); gerr == nil {
				cur = latest
			}
		}
		if err != nil {
			return err
		}
		out = updated
		return nil
	})
	if err != nil {
		return pvc, err
	}
	return out, nil
}

// setVolumeCapacity writes the volume's spec.capacity with a merge patch (the volume's other
// fields are the provisioner's).
func (c *Controller) setVolumeCapacity(ctx context.Context, pv *corev1.PersistentVolume, size resource.Quantity) error {
	if cur := pv.Spec.Capacity[corev1.ResourceStorage]; cur.Cmp(size) == 0 {
		return nil
	}
	patch := fmt.Sprintf(`{"spec":{"capacity":{"storage":%q}}}`, size.String())
	if _, err := c.cfg.Client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("updating the capacity of %s to %s: %w", pv.Name, size.String(), err)
	}
	return nil
}
