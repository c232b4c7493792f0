package storagepool

import (
	"context"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

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

// mutationTTL is how long an object this sidecar wrote is preferred over an older one in an
// informer that has not seen the write yet.
const mutationTTL = time.Minute

// ObjectCache is the sidecar's view of the objects it may own, read from one or more informers
// (a node's objects and the shared ones), including its own writes not yet seen by them.
type ObjectCache struct {
	informers []cache.SharedIndexInformer
	mutations []cache.MutationCache
}

// NewObjectCache returns a cache over informers.
func NewObjectCache(logger klog.Logger, informers ...cache.SharedIndexInformer) *ObjectCache {
	c := &ObjectCache{informers: informers}
	for _, inf := range informers {
		c.mutations = append(c.mutations, cache.NewIntegerResourceVersionMutationCache(
			logger, inf.GetStore(), inf.GetIndexer(), mutationTTL, true))
	}
	return c
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

// Get returns the object called name, or nil.
func (c *ObjectCache) Get(name string) *spapi.StoragePool {
	var newest *spapi.StoragePool
	for _, m := range c.mutations {
		obj, ok, err := m.GetByKey(name)
		if err != nil || !ok {
			continue
		}
		if sp := obj.(*spapi.StoragePool); newest == nil || resourceVersion(sp) > resourceVersion(newest) {
			newest = sp
		}
	}
	return newest
}

// resourceVersion parses the resource version as the integer it is in practice (the mutation
// cache relies on the same); 0 when it is not one.
func resourceVersion(obj *spapi.StoragePool) uint64 {
	v, _ := strconv.ParseUint(obj.ResourceVersion, 10, 64)
	return v
}

// List returns every object in the cache.
func (c *ObjectCache) List() []*spapi.StoragePool {
	seen := map[string]bool{}
	var out []*spapi.StoragePool
	for i, inf := range c.informers {
		for _, key := range inf.GetStore().ListKeys() {
			if seen[key] {
				continue
			}
			if obj, ok, err := c.mutations[i].GetByKey(key); err == nil && ok {
				seen[key] = true
				out = append(out, obj.(*spapi.StoragePool))
			}
		}
	}
	return out
}

// Mutated records an object this sidecar just wrote, so that the next sync compares against it
// even when the informers have not seen the write yet.
func (c *ObjectCache) Mutated(obj *spapi.StoragePool) {
	for _, m := range c.mutations {
		m.Mutation(obj)
	}
}
