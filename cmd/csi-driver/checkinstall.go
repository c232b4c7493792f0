package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/installcheck"
	"github.com/cistern-csi/cistern/pkg/poolpublisher"
)

// runCheckInstall is `csi-driver check-install`, what the chart's `helm test` pod runs: it reads
// the CSIDriver, the CSINodes and the StoragePools and exits 1 unless every node that registered
// the driver has its pools published (pkg/installcheck).
func runCheckInstall(args []string) {
	fs := flag.NewFlagSet("check-install", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file; in-cluster configuration when empty")
	driverName := fs.String("driver-name", consts.DriverName, "the CSI driver to check")
	timeout := fs.Duration("timeout", time.Minute, "how long the API calls may take")
	_ = fs.Parse(args)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	rc, kube, err := kubeClient(*kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "check-install:", err)
		os.Exit(1)
	}
	pools, err := poolpublisher.NewClient(rc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "check-install:", err)
		os.Exit(1)
	}
	r, err := installcheck.Check(ctx, kube, func(ctx context.Context) ([]spapi.StoragePool, error) {
		l, err := pools.List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		return l.Items, nil
	}, *driverName)
	for _, n := range r.Nodes {
		fmt.Printf("node %s: StoragePools %s\n", n, strings.Join(r.Pools[n], ", "))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "check-install:", err)
		os.Exit(1)
	}
	fmt.Printf("%s is installed: %d nodes, each with its StoragePools\n", *driverName, len(r.Nodes))
}
