// Package installcheck says whether an install of Cistern works, as `helm test` asks it
// (`csi-driver check-install`, the chart's templates/tests): the CSIDriver object exists, the node
// plugin registered the driver on at least one node (its CSINode lists it), and every such node
// has its pools published as StoragePool objects of the driver. It only reads, so its pod needs
// get on one CSIDriver and list on CSINodes and StoragePools.
package installcheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
)

// Pools lists every StoragePool (poolpublisher.Client's List).
type Pools func(ctx context.Context) ([]spapi.StoragePool, error)

// Report is what the check found.
type Report struct {
	// Nodes are the nodes whose CSINode lists the driver, sorted.
	Nodes []string
	// Pools are the driver's StoragePool objects by node, for each of Nodes.
	Pools map[string][]string
}

// Check reads the install of driver; its error lists every problem found.
func Check(ctx context.Context, kube kubernetes.Interface, pools Pools, driver string) (Report, error) {
	r := Report{Pools: map[string][]string{}}
	if _, err := kube.StorageV1().CSIDrivers().Get(ctx, driver, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return r, fmt.Errorf("no CSIDriver %s: the chart's csidriver.yaml was not installed", driver)
	} else if err != nil {
		return r, fmt.Errorf("CSIDriver %s: %w", driver, err)
	}
	csiNodes, err := kube.StorageV1().CSINodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return r, fmt.Errorf("listing CSINodes: %w", err)
	}
	for _, n := range csiNodes.Items {
		if slices.ContainsFunc(n.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driver }) {
			r.Nodes = append(r.Nodes, n.Name)
		}
	}
	sort.Strings(r.Nodes)
	if len(r.Nodes) == 0 {
		return r, fmt.Errorf("no node has registered %s (no CSINode lists it): is the cistern-node DaemonSet running?", driver)
	}
	list, err := pools(ctx)
	if err != nil {
		return r, fmt.Errorf("listing StoragePools: %w", err)
	}
	for _, p := range list {
		if p.Spec.Driver != driver {
			continue
		}
		for _, n := range p.Status.AccessibleNodes {
			r.Pools[n] = append(r.Pools[n], p.Name)
		}
	}
	var errs []error
	for _, n := range r.Nodes {
		if len(r.Pools[n]) == 0 {
			errs = append(errs, fmt.Errorf("node %s runs %s but has no StoragePool published: see its storagepool-sidecar's log", n, driver))
		}
	}
	return r, errors.Join(errs...)
}
