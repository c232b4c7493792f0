// Package poolpublisher publishes the pools a CSI driver reports (StoragePoolController) as
// StoragePool objects, with server-side apply, writing only what changed.
package poolpublisher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	spac "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1/applyconfiguration/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
)

// FieldManagerPrefix starts the field manager name of every storagepool-sidecar instance.
const FieldManagerPrefix = "storagepool-sidecar"

// FieldManager is the field manager of the sidecar publishing node's pools ("" for the single
// instance next to a controller-mode driver). Each node has its own, so that the nodes of a
// shared pool each own their entry of status.accessibleNodes.
func FieldManager(node string) string {
	if node == "" {
		return FieldManagerPrefix
	}
	return FieldManagerPrefix + "/" + LabelValue(node)
}

// DefaultMaxErrors is how many errors an object keeps per reporting sidecar.
const DefaultMaxErrors = 10

// Config says what a Reconciler publishes.
type Config struct {
	// DriverName goes into spec.driver (from the driver's GetPluginInfo).
	DriverName string
	// NodeName is the node whose pools this sidecar publishes; empty for the single instance next
	// to a controller-mode driver, which publishes whatever the driver reports.
	NodeName string
	// ResyncPeriod is how often the driver's pools are compared with the objects even when the
	// driver reports no change.
	ResyncPeriod time.Duration
	// MaxErrors bounds status.errors (per reporting sidecar).
	MaxErrors int
	// MaxCachedDatasets bounds status.cache.datasets, whatever the driver sends.
	MaxCachedDatasets int
}

// DefaultMaxCachedDatasets is how many datasets of a pool's cache an object lists.
const DefaultMaxCachedDatasets = 32

// PoolWriter is the part of the StoragePool client the reconciler writes with.
type PoolWriter interface {
	Apply(ctx context.Context, obj *spac.StoragePoolApplyConfiguration, opts metav1.ApplyOptions) (*spapi.StoragePool, error)
	ApplyStatus(ctx context.Context, obj *spac.StoragePoolApplyConfiguration, opts metav1.ApplyOptions) (*spapi.StoragePool, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// ObjectStore is where the reconciler reads objects from: an informer cache, never the API.
type ObjectStore interface {
	Get(name string) *spapi.StoragePool
	List() []*spapi.StoragePool
	// Mutated and Deleted record this sidecar's own writes, which the store may not show yet.
	Mutated(obj *spapi.StoragePool)
	Deleted(obj *spapi.StoragePool)
}

// Reconciler makes the StoragePool objects match the driver's pools.
type Reconciler struct {
	cfg     Config
	manager string
	source  PoolSource
	writer  PoolWriter
	objects ObjectStore
	metrics *Metrics
	clock   clock.PassiveClock
	queue   workqueue.TypedRateLimitingInterface[string]

	mu sync.Mutex
	// syncedGeneration is the driver generation of the last successful sync.
	syncedGeneration uint64
	synced           bool
}

// syncKey is the only work item: every trigger asks for one full, idempotent sync.
const syncKey = "pools"

// NewReconciler returns a Reconciler; metrics may be nil.
func NewReconciler(cfg Config, source PoolSource, writer PoolWriter, objects ObjectStore, m *Metrics) (*Reconciler, error) {
	if cfg.DriverName == "" {
		return nil, errors.New("driver name is required")
	}
	if cfg.ResyncPeriod <= 0 {
		return nil, fmt.Errorf("resync period must be positive, got %v", cfg.ResyncPeriod)
	}
	if cfg.MaxErrors <= 0 {
		cfg.MaxErrors = DefaultMaxErrors
	}
	if cfg.MaxCachedDatasets <= 0 {
		cfg.MaxCachedDatasets = DefaultMaxCachedDatasets
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Reconciler{
		cfg:     cfg,
		manager: FieldManager(cfg.NodeName),
		source:  source,
		writer:  writer,
		objects: objects,
		metrics: m,
		clock:   clock.RealClock{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "storagepools"}),
	}, nil
}

// Run syncs on start, every resync period, whenever the driver reports a change and whenever
// Enqueue is called, until ctx ends. The object store must have synced before.
func (r *Reconciler) Run(ctx context.Context) {
	defer r.queue.ShutDown()
	logger := klog.FromContext(ctx)
	logger.Info("Publishing storage pools", "driver", r.cfg.DriverName, "node", r.cfg.NodeName,
		"fieldManager", r.manager, "resyncPeriod", r.cfg.ResyncPeriod)
	go wait.UntilWithContext(ctx, func(context.Context) { r.Enqueue() }, r.cfg.ResyncPeriod)
	go r.watchDriver(ctx)
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for r.processNext(ctx) {
		}
	}, time.Second)
	<-ctx.Done()
}

// Enqueue asks for a sync.
func (r *Reconciler) Enqueue() { r.queue.Add(syncKey) }

func (r *Reconciler) processNext(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(key)
	if err := r.Sync(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Failed to publish storage pools, will retry")
		r.queue.AddRateLimited(key)
		return true
	}
	r.queue.Forget(key)
	return true
}

// watchDriver asks for a sync whenever the driver's generation moves, reconnecting the stream
// with backoff. Resyncs still run when the driver does not implement the stream.
func (r *Reconciler) watchDriver(ctx context.Context) {
	logger := klog.FromContext(ctx)
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 6, Cap: 30 * time.Second}
	for ctx.Err() == nil {
		first := true
		err := r.source.Watch(ctx, func(generation uint64) {
			// The first message of a stream always syncs: a restarted driver counts from scratch.
			if first || !r.isSynced(generation) {
				logger.V(4).Info("Driver reports a pool change", "generation", generation)
				r.Enqueue()
			}
			first = false
			backoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 6, Cap: 30 * time.Second}
		})
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.Unimplemented {
			logger.Info("Driver does not stream pool changes, relying on resync", "resyncPeriod", r.cfg.ResyncPeriod)
			return
		}
		delay := backoff.Step()
		logger.V(2).Info("Pool watch stream ended, reconnecting", "err", err, "delay", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

func (r *Reconciler) isSynced(generation uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced && r.syncedGeneration == generation
}

func (r *Reconciler) setSynced(generation uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.synced, r.syncedGeneration = true, generation
}

// Sync publishes the driver's pools once: applies what differs from the cached objects and
// deletes owned objects of pools the driver no longer reports. When the driver cannot be asked,
// nothing is deleted: the error is recorded in the owned objects instead.
func (r *Reconciler) Sync(ctx context.Context) (err error) {
	logger := klog.FromContext(ctx)
	start := r.clock.Now()
	defer func() {
		r.metrics.syncDuration.Observe(r.clock.Since(start).Seconds())
		result := "success"
		if err != nil {
			result = "error"
		}
		r.metrics.syncs.WithLabelValues(result).Inc()
	}()

	pools, generation, err := r.source.List(ctx)
	if err != nil {
		return errors.Join(fmt.Errorf("listing the driver's pools: %w", err), r.recordUnreachable(ctx, err))
	}
	r.metrics.pools.Set(float64(len(pools)))

	var errs []error
	desired := map[string]*desiredPool{}
	complete := true
	for _, p := range pools {
		if c := p.GetCache(); c != nil && len(c.GetDatasets()) > r.cfg.MaxCachedDatasets {
			c.Datasets = c.Datasets[:r.cfg.MaxCachedDatasets]
		}
		if c := p.GetCache(); c != nil && len(c.GetOutputs()) > r.cfg.MaxCachedDatasets {
			c.Outputs = c.Outputs[:r.cfg.MaxCachedDatasets] // outputs_total still counts them
		}
		d, err := newDesiredPool(p, r.cfg.DriverName, r.cfg.NodeName)
		if err == nil && desired[d.name] != nil {
			err = fmt.Errorf("pools %q and %q map to the same object %q", desired[d.name].pool.GetName(), p.GetName(), d.name)
		}
		if err != nil {
			errs = append(errs, err)
			complete = false
			continue
		}
		desired[d.name] = d
	}
	names := make([]string, 0, len(desired))
	for name := range desired {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := r.publish(ctx, desired[name]); err != nil {
			errs = append(errs, fmt.Errorf("publishing pool %q: %w", desired[name].pool.GetName(), err))
		}
	}
	if complete {
		for _, obj := range r.objects.List() {
			if desired[obj.Name] == nil && r.owns(obj) {
				if err := r.release(ctx, obj); err != nil {
					errs = append(errs, fmt.Errorf("removing pool object %q: %w", obj.Name, err))
				}
			}
		}
	} else {
		logger.Info("Some pools were not understood, not removing any object this time")
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	r.setSynced(generation)
	logger.V(4).Info("Storage pools in sync", "pools", len(desired), "generation", generation)
	return nil
}

// publish applies the object's labels and spec, then its status, each only when what this
// sidecar owns differs from what it wants.
func (r *Reconciler) publish(ctx context.Context, d *desiredPool) error {
	logger := klog.FromContext(ctx)
	current := r.objects.Get(d.name)
	if current != nil {
		if err := r.checkSamePool(current, d); err != nil {
			return err
		}
	}
	meta := d.metaApplyConfig()
	if current == nil || !r.upToDate(current, meta, "") {
		obj, err := r.writer.Apply(ctx, meta, metav1.ApplyOptions{FieldManager: r.manager, Force: true})
		r.metrics.writes.WithLabelValues("apply").Inc()
		if err != nil {
			return err
		}
		if current == nil {
			logger.Info("Created storage pool object", "storagePool", d.name)
		} else {
			logger.V(4).Info("Updated storage pool object", "storagePool", d.name)
		}
		r.objects.Mutated(obj)
		current = obj
	}

	own, err := r.ownStatus(current)
	if err != nil {
		return err
	}
	st := d.status(own, current, r.cfg.NodeName, r.cfg.MaxErrors, r.clock.Now())
	return r.applyStatus(ctx, current, st)
}

func (r *Reconciler) applyStatus(ctx context.Context, current *spapi.StoragePool, st spapi.StoragePoolStatus) error {
	ac, err := statusApplyConfig(current.Name, st)
	if err != nil {
		return err
	}
	if r.upToDate(current, ac, "status") {
		return nil
	}
	obj, err := r.writer.ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: r.manager, Force: true})
	r.metrics.writes.WithLabelValues("apply_status").Inc()
	if err != nil {
		return err
	}
	klog.FromContext(ctx).V(4).Info("Updated storage pool status", "storagePool", current.Name)
	r.objects.Mutated(obj)
	return nil
}

// recordUnreachable marks every owned object's Healthy condition Unknown and logs the error in
// it, at most once per distinct message, instead of deleting anything.
func (r *Reconciler) recordUnreachable(ctx context.Context, cause error) error {
	var errs []error
	for _, obj := range r.objects.List() {
		if !r.owns(obj) {
			continue
		}
		own, err := r.ownStatus(obj)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		st := unreachableStatus(own, obj, r.cfg.NodeName, cause, r.cfg.MaxErrors, r.clock.Now())
		if err := r.applyStatus(ctx, obj, st); err != nil {
			errs = append(errs, fmt.Errorf("recording the driver error in %q: %w", obj.Name, err))
		}
	}
	return errors.Join(errs...)
}

// release gives up an object of a pool the driver no longer reports: deleted when no other
// sidecar reports the pool, otherwise only this sidecar's fields (its accessibleNodes entry,
// its errors) are removed by applying empty configurations.
func (r *Reconciler) release(ctx context.Context, obj *spapi.StoragePool) error {
	logger := klog.FromContext(ctx)
	if r.otherReporters(obj) {
		empty := spac.StoragePool(obj.Name)
		if !r.upToDate(obj, empty, "status") {
			updated, err := r.writer.ApplyStatus(ctx, empty, metav1.ApplyOptions{FieldManager: r.manager, Force: true})
			r.metrics.writes.WithLabelValues("apply_status").Inc()
			if err != nil {
				return err
			}
			r.objects.Mutated(updated)
			obj = updated
		}
		if !r.upToDate(obj, empty, "") {
			updated, err := r.writer.Apply(ctx, empty, metav1.ApplyOptions{FieldManager: r.manager, Force: true})
			r.metrics.writes.WithLabelValues("apply").Inc()
			if err != nil {
				return err
			}
			r.objects.Mutated(updated)
		}
		logger.Info("Node no longer reports the shared storage pool", "storagePool", obj.Name)
		return nil
	}
	err := r.writer.Delete(ctx, obj.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &obj.UID, ResourceVersion: &obj.ResourceVersion},
	})
	r.metrics.writes.WithLabelValues("delete").Inc()
	if apierrors.IsNotFound(err) {
		r.objects.Deleted(obj)
		return nil
	}
	if err != nil {
		return err
	}
	r.objects.Deleted(obj)
	logger.Info("Deleted storage pool object", "storagePool", obj.Name)
	return nil
}

// owns says whether this sidecar published obj: it is of our driver and our field manager has
// applied to it.
func (r *Reconciler) owns(obj *spapi.StoragePool) bool {
	if obj.Spec.Driver != r.cfg.DriverName {
		return false
	}
	for _, f := range obj.ManagedFields {
		if f.Manager == r.manager && f.Operation == metav1.ManagedFieldsOperationApply {
			return true
		}
	}
	return false
}

// otherReporters says whether another sidecar also applies to obj (a shared pool).
func (r *Reconciler) otherReporters(obj *spapi.StoragePool) bool {
	for _, f := range obj.ManagedFields {
		if f.Manager != r.manager && f.Operation == metav1.ManagedFieldsOperationApply &&
			strings.HasPrefix(f.Manager, FieldManagerPrefix) {
			return true
		}
	}
	return false
}

// checkSamePool refuses to write an object that exists for another driver or another pool.
func (r *Reconciler) checkSamePool(obj *spapi.StoragePool, d *desiredPool) error {
	if obj.Spec.Driver != r.cfg.DriverName {
		return fmt.Errorf("object %q exists for driver %q", obj.Name, obj.Spec.Driver)
	}
	for _, k := range []string{consts.LabelPool, consts.LabelNode, consts.LabelShared} {
		if obj.Labels[k] != d.labels[k] {
			return fmt.Errorf("object %q exists for another pool (label %s=%q, want %q)", obj.Name, k, obj.Labels[k], d.labels[k])
		}
	}
	return nil
}

// upToDate says whether what this sidecar owns in obj (for the subresource) is exactly want.
func (r *Reconciler) upToDate(obj *spapi.StoragePool, want *spac.StoragePoolApplyConfiguration, subresource string) bool {
	own, err := spac.ExtractStoragePoolFrom(obj, r.manager, subresource)
	if err != nil {
		return false
	}
	return equality.Semantic.DeepEqual(own, want)
}

// ownStatus is the status this sidecar last applied to obj (its own fields only).
func (r *Reconciler) ownStatus(obj *spapi.StoragePool) (*spapi.StoragePool, error) {
	ac, err := spac.ExtractStoragePoolStatus(obj, r.manager)
	if err != nil {
		return nil, fmt.Errorf("reading the fields of %q this sidecar owns: %w", obj.Name, err)
	}
	return typedFromApplyConfig(ac)
}
