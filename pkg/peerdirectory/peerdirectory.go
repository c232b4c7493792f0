// Package peerdirectory is the peer engine's Directory (peer.Directory) over the StoragePool
// inventory, outside the data engine: it is the one part of peer fan-out that talks to the pools
// API. It finds a node's peers for a dataset in the StoragePool inventory and
// publishes the node's own peer endpoint there.
//
// Every node's StoragePools list the datasets its cache holds, Ready or Staging
// (status.cache.datasets, written by the storagepool-sidecar). The node plugin adds two
// annotations to its own node-local StoragePools: where its peer port is and the SHA-256 of the
// certificate it serves there (peer.AnnotationEndpoint, peer.AnnotationCertHash). The annotations
// are written with a field manager of their own, so the sidecar's server-side apply keeps them.
// One informer over StoragePools answers every lookup from memory.
package peerdirectory

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/poolpublisher"
)

// fieldManager owns the peer annotations.
const fieldManager = "cistern-peer"

// Inventory is a peer.Directory over the StoragePool objects.
type Inventory struct {
	client   *poolpublisher.Client
	informer cache.SharedIndexInformer
	node     string // this node's label value
	self     peer.Peer
	interval time.Duration
}

// New returns an Inventory for node (its name), which publishes self's endpoint and certificate
// hash; Run starts it.
func New(client *poolpublisher.Client, node string, self peer.Peer) *Inventory {
	return &Inventory{
		client:   client,
		informer: poolpublisher.NewInformer(client, labels.Everything()),
		node:     poolpublisher.LabelValue(node),
		self:     self,
		interval: 30 * time.Second,
	}
}

// Run watches the StoragePools and keeps this node's annotated until ctx ends.
func (v *Inventory) Run(ctx context.Context) {
	go v.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), v.informer.HasSynced) {
		return
	}
	// The sidecar may create (or re-create) the objects at any time: check them periodically.
	wait.UntilWithContext(ctx, v.publish, v.interval)
}

// publish annotates this node's StoragePools that lack the current endpoint.
func (v *Inventory) publish(ctx context.Context) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		peer.AnnotationEndpoint: v.self.Address, peer.AnnotationCertHash: v.self.CertHash}}})
	for _, obj := range v.informer.GetStore().List() {
		sp, ok := obj.(*spapi.StoragePool)
		if !ok || sp.Labels[consts.LabelNode] != v.node || sp.Labels[consts.LabelShared] == "true" {
			continue
		}
		if sp.Annotations[peer.AnnotationEndpoint] == v.self.Address && sp.Annotations[peer.AnnotationCertHash] == v.self.CertHash {
			continue
		}
		_, err := v.client.Patch(ctx, sp.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
		if err != nil {
			klog.FromContext(ctx).Error(err, "publishing the peer endpoint", "storagePool", sp.Name)
		}
	}
}

// Peers implements peer.Directory: the nodes whose StoragePools hold dataset id Ready or Staging
// and publish a peer endpoint, this node excepted.
func (v *Inventory) Peers(id string) []peer.Peer {
	objs := v.informer.GetStore().List()
	pools := make([]*spapi.StoragePool, 0, len(objs))
	for _, obj := range objs {
		if sp, ok := obj.(*spapi.StoragePool); ok {
			pools = append(pools, sp)
		}
	}
	return peersOf(pools, id, v.node)
}

// peersOf picks the peers of dataset id from StoragePools, leaving out the node labelled self.
func peersOf(pools []*spapi.StoragePool, id, self string) []peer.Peer {
	var out []peer.Peer
	seen := map[string]bool{}
	for _, sp := range pools {
		node := sp.Labels[consts.LabelNode]
		if sp.Status.Cache == nil || node == "" || node == self {
			continue
		}
		addr, hash := sp.Annotations[peer.AnnotationEndpoint], sp.Annotations[peer.AnnotationCertHash]
		if addr == "" || hash == "" || seen[addr] {
			continue
		}
		for _, d := range sp.Status.Cache.Datasets {
			if d.ID == id && (d.State == spapi.DatasetReady || d.State == spapi.DatasetStaging) {
				seen[addr] = true
				out = append(out, peer.Peer{Node: node, Address: addr, CertHash: hash})
				break
			}
		}
	}
	return out
}

// String is for logs.
func (v *Inventory) String() string { return fmt.Sprintf("StoragePool inventory (node %s)", v.node) }
