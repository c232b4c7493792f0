package poolpublisher

import (
	"context"
	"strconv"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	spac "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1/applyconfiguration/storagepool/v1alpha1"
)

// Scheme knows the StoragePool types.
var Scheme = runtime.NewScheme()

func init() {
	utilruntimeMust(spapi.AddToScheme(Scheme))
	utilruntimeMust(metav1.AddMetaToScheme(Scheme))
}

func utilruntimeMust(err error) {
	if err != nil {
		panic(err)
	}
}

// Client is the typed StoragePool client: get, list, watch, apply, apply status, delete.
type Client = gentype.ClientWithListAndApply[*spapi.StoragePool, *spapi.StoragePoolList, *spac.StoragePoolApplyConfiguration]

// NewClient returns a StoragePool client for config.
func NewClient(config *rest.Config) (*Client, error) {
	cfg := rest.CopyConfig(config)
	cfg.GroupVersion = &spapi.SchemeGroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(Scheme).WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return gentype.NewClientWithListAndApply[*spapi.StoragePool, *spapi.StoragePoolList, *spac.StoragePoolApplyConfiguration](
		"storagepools", rc, runtime.NewParameterCodec(Scheme), "",
		func() *spapi.StoragePool { return &spapi.StoragePool{} },
		func() *spapi.StoragePoolList { return &spapi.StoragePoolList{} }), nil
}

// NewInformer returns an informer on the StoragePool objects matching selector.
func NewInformer(client *Client, selector labels.Selector) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector.String()
			return client.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector.String()
			return client.Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformer(lw, &spapi.StoragePool{}, 0, cache.Indexers{})
}

// ObjectCache is the sidecar's view of the objects it may own, read from one or more informers
// (a node's objects and the shared ones), overlaid with its own writes the informers have not
// delivered yet. Without the overlay, a lagging watch (a busy API server) would make the next
// sync see an old or missing object and write it again.
type ObjectCache struct {
	informers []cache.SharedIndexInformer

	mu sync.Mutex
	// written holds the objects this sidecar wrote, until an informer has caught up with them.
	written map[string]*spapi.StoragePool
	// deleted holds the UIDs of objects this sidecar deleted, until an informer sees the deletion.
	deleted map[string]types.UID
	// onDelete is called after an informer reported a deletion and the cache forgot the object.
	onDelete func()
}

// NewObjectCache returns a cache over informers; it must be created before they start.
func NewObjectCache(informers ...cache.SharedIndexInformer) (*ObjectCache, error) {
	c := &ObjectCache{
		informers: informers,
		written:   map[string]*spapi.StoragePool{},
		deleted:   map[string]types.UID{},
	}
	for _, inf := range informers {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: c.deleteHandler}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *ObjectCache) deleteHandler(obj any) {
	name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	c.mu.Lock()
	delete(c.written, name)
	delete(c.deleted, name)
	notify := c.onDelete
	c.mu.Unlock()
	if notify != nil {
		notify()
	}
}

// OnDelete sets a function called whenever an object is deleted, e.g. to re-create it at once.
func (c *ObjectCache) OnDelete(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onDelete = f
}

// HasSynced reports whether every informer has listed once.
func (c *ObjectCache) HasSynced() bool {
	for _, inf := range c.informers {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

// Get returns the object called name as this sidecar last knows it, or nil.
func (c *ObjectCache) Get(name string) *spapi.StoragePool {
	var stored *spapi.StoragePool
	for _, inf := range c.informers {
		if obj, ok, err := inf.GetStore().GetByKey(name); err == nil && ok {
			if sp := obj.(*spapi.StoragePool); stored == nil || resourceVersion(sp) > resourceVersion(stored) {
				stored = sp
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if uid, ok := c.deleted[name]; ok && (stored == nil || stored.UID == uid) {
		return nil
	}
	if w := c.written[name]; w != nil {
		if stored == nil || resourceVersion(w) > resourceVersion(stored) {
			return w
		}
		delete(c.written, name) // the informer has caught up
	}
	return stored
}

// List returns every object in the cache.
func (c *ObjectCache) List() []*spapi.StoragePool {
	names := map[string]bool{}
	for _, inf := range c.informers {
		for _, key := range inf.GetStore().ListKeys() {
			names[key] = true
		}
	}
	c.mu.Lock()
	for name := range c.written {
		names[name] = true
	}
	c.mu.Unlock()
	out := make([]*spapi.StoragePool, 0, len(names))
	for name := range names {
		if obj := c.Get(name); obj != nil {
			out = append(out, obj)
		}
	}
	return out
}

// Mutated records an object this sidecar just wrote.
func (c *ObjectCache) Mutated(obj *spapi.StoragePool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.written[obj.Name]; w == nil || resourceVersion(obj) > resourceVersion(w) {
		c.written[obj.Name] = obj
	}
	delete(c.deleted, obj.Name)
}

// Deleted records an object this sidecar just deleted.
func (c *ObjectCache) Deleted(obj *spapi.StoragePool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.written, obj.Name)
	c.deleted[obj.Name] = obj.UID
}

// resourceVersion parses the resource version as the integer it is in practice (client-go's
// mutation cache relies on the same); 0 when it is not one.
func resourceVersion(obj *spapi.StoragePool) uint64 {
	v, _ := strconv.ParseUint(obj.ResourceVersion, 10, 64)
	return v
}
