// Command storagepool-sidecar publishes the pools of a CSI driver as StoragePool objects
// (storagepool.storage.k8s.io/v1alpha1). It runs next to the driver: in the node DaemonSet with
// --node-name (one per node), or as a single leader-elected instance next to a controller-mode
// driver. See docs/storagepools.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/standardflags"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/logflags"
	"github.com/cistern-csi/cistern/pkg/poolpublisher"
	"github.com/cistern-csi/cistern/pkg/poolpublisher/sidecar"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	logCfg := logflags.Register(flag.CommandLine)
	// --csi-address, --kubeconfig, --leader-election*, --kube-api-*, --http-endpoint,
	// --metrics-*, --version: the flags every CSI sidecar has.
	standardflags.RegisterCommonFlags(flag.CommandLine)
	cfg := sidecar.Config{UserAgent: "cistern-storagepool-sidecar/" + version}
	var pageSize int
	flag.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "Node whose pools this instance publishes (default $NODE_NAME). Empty: publish everything the driver reports, as the single instance next to a controller-mode driver (use --leader-election).")
	flag.DurationVar(&cfg.ResyncPeriod, "resync-period", 10*time.Minute, "How often to compare the driver's pools with the StoragePool objects even when the driver reports no change.")
	flag.IntVar(&cfg.MaxErrors, "max-errors", poolpublisher.DefaultMaxErrors, "How many recent errors each StoragePool keeps (per reporting node).")
	flag.IntVar(&pageSize, "list-page-size", 500, "Pools per ControllerListStoragePools call (0: all at once).")
	flag.IntVar(&cfg.MaxCachedDatasets, "max-cached-datasets", poolpublisher.DefaultMaxCachedDatasets, "How many datasets of a pool's cache each StoragePool lists in status.cache.datasets (the most recently used; the counts cover all).")
	flag.DurationVar(&cfg.Timeout, "timeout", 30*time.Second, "Timeout of the driver calls made at start.")
	flag.Parse()
	if standardflags.Configuration.ShowVersion {
		fmt.Println(version)
		return
	}
	if err := logflags.Apply(logCfg); err != nil {
		klog.ErrorS(err, "Invalid logging flags")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	cfg.Standard = standardflags.Configuration
	cfg.ListPageSize = int32(pageSize)

	s, err := sidecar.New(cfg)
	if err != nil {
		klog.ErrorS(err, "Invalid configuration")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	klog.InfoS("Starting storagepool-sidecar", "version", version, "node", cfg.NodeName)
	if err := s.Run(ctx); err != nil {
		klog.ErrorS(err, "storagepool-sidecar failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}
