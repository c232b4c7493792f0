package peerdirectory

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
)

func pool(name, node, addr string, datasets ...spapi.CachedDataset) *spapi.StoragePool {
	sp := &spapi.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
	if node != "" {
		sp.Labels[consts.LabelNode] = node
	}
	if addr != "" {
		sp.Annotations[peer.AnnotationEndpoint] = addr
		sp.Annotations[peer.AnnotationCertHash] = "hash-" + node
	}
	if datasets != nil {
		sp.Status.Cache = &spapi.DatasetCache{Datasets: datasets}
	}
	return sp
}

func TestPeersOf(t *testing.T) {
	ready := spapi.CachedDataset{ID: "d1", State: spapi.DatasetReady}
	staging := spapi.CachedDataset{ID: "d1", State: spapi.DatasetStaging}
	failed := spapi.CachedDataset{ID: "d1", State: spapi.DatasetFailed}
	other := spapi.CachedDataset{ID: "d2", State: spapi.DatasetReady}
	pools := []*spapi.StoragePool{
		pool("fast.a", "a", "10.0.0.1:7443", ready),
		pool("bulk.a", "a", "10.0.0.1:7443", ready), // one node, two pools: one peer
		pool("fast.b", "b", "10.0.0.2:7443", staging),
		pool("fast.c", "c", "10.0.0.3:7443", failed),
		pool("fast.d", "d", "10.0.0.4:7443", other),
		pool("fast.e", "e", "", ready),                    // no endpoint published (yet)
		pool("shared", "", "10.0.0.9:7443", ready),        // a shared pool names no node
		pool("fast.self", "self", "10.0.0.5:7443", ready), // this node
	}
	var got []string
	for _, p := range peersOf(pools, "d1", "self") {
		got = append(got, p.Node+"="+p.Address+"#"+p.CertHash)
	}
	want := []string{"a=10.0.0.1:7443#hash-a", "b=10.0.0.2:7443#hash-b"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
