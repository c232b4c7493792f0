// Command storagepool-sidecar publishes the pools of a CSI driver as StoragePool objects
// (storagepool.storage.k8s.io/v1alpha1). It runs next to the driver: in the node DaemonSet with
// --node-name (one per node), or as a single leader-elected instance next to a controller-mode
// driver. See docs/storagepools.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/kubernetes-csi/csi-lib-utils/leaderelection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	csirpc "github.com/kubernetes-csi/csi-lib-utils/rpc"
	"github.com/kubernetes-csi/csi-lib-utils/standardflags"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/storagepool"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	klog.InitFlags(nil)
	standardflags.RegisterCommonFlags(flag.CommandLine)
	var (
		nodeName  = flag.String("node-name", os.Getenv("NODE_NAME"), "Node whose pools this instance publishes (default $NODE_NAME). Empty: publish everything the driver reports, as the single instance next to a controller-mode driver (use --leader-election).")
		resync    = flag.Duration("resync-period", 10*time.Minute, "How often to compare the driver's pools with the StoragePool objects even when the driver reports no change.")
		maxErrors = flag.Int("max-errors", storagepool.DefaultMaxErrors, "How many recent errors each StoragePool keeps (per reporting node).")
		pageSize  = flag.Int("list-page-size", 500, "Pools per ControllerListStoragePools call (0: all at once).")
		maxCached = flag.Int("max-cached-datasets", storagepool.DefaultMaxCachedDatasets, "How many datasets of a pool's cache each StoragePool lists in status.cache.datasets (the most recently used; the counts cover all).")
		timeout   = flag.Duration("timeout", 30*time.Second, "Timeout of the driver calls made at start.")
	)
	flag.Parse()
	cfg := standardflags.Configuration
	if cfg.ShowVersion {
		fmt.Println(os.Args[0], version)
		return
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	logger := klog.FromContext(ctx)
	if err := run(ctx, cfg, *nodeName, *resync, *maxErrors, *maxCached, int32(*pageSize), *timeout); err != nil {
		logger.Error(err, "storagepool-sidecar failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

func run(ctx context.Context, cfg standardflags.SidecarConfiguration, nodeName string, resync time.Duration,
	maxErrors, maxCached int, pageSize int32, timeout time.Duration) error {
	logger := klog.FromContext(ctx)
	if cfg.MetricsAddress != "" && cfg.HttpEndpoint != "" {
		return fmt.Errorf("only one of --metrics-address and --http-endpoint can be set")
	}
	restConfig, err := buildConfig(cfg.KubeConfig)
	if err != nil {
		return err
	}
	restConfig.QPS = float32(cfg.KubeAPIQPS)
	restConfig.Burst = cfg.KubeAPIBurst

	// Connect waits until the driver's socket answers.
	metricsManager := metrics.NewCSIMetricsManagerForSidecar("")
	conn, err := connection.Connect(ctx, cfg.CSIAddress, metricsManager)
	if err != nil {
		return fmt.Errorf("connecting to the CSI driver at %s: %w", cfg.CSIAddress, err)
	}
	defer conn.Close()
	// No Probe wait: a driver whose pools are all unhealthy reports not ready, and publishing
	// exactly that is this sidecar's job.
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	driverName, err := csirpc.GetDriverName(callCtx, conn)
	if err != nil {
		return fmt.Errorf("asking the CSI driver its name: %w", err)
	}
	metricsManager.SetDriverName(driverName)
	if maxCached <= 0 || maxCached > 1024 {
		return fmt.Errorf("--max-cached-datasets must be between 1 and 1024 (the CRD's bound), got %d", maxCached)
	}
	source := storagepool.NewDriverPools(conn, pageSize).WithMaxCachedDatasets(int32(maxCached))
	if err := source.CheckSupported(callCtx); err != nil {
		return err
	}
	logger.Info("CSI driver serves StoragePoolController", "driver", driverName)

	m := storagepool.NewMetrics(metricsManager.GetRegistry())
	mux := http.NewServeMux()
	addr := cfg.HttpEndpoint
	if addr == "" {
		addr = cfg.MetricsAddress
	}
	if addr != "" {
		metricsManager.RegisterToServer(mux, cfg.MetricsPath)
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		go func() {
			logger.Info("Serving metrics", "address", addr, "path", cfg.MetricsPath)
			if err := http.ListenAndServe(addr, mux); err != nil {
				logger.Error(err, "Metrics server failed")
				klog.FlushAndExit(klog.ExitFlushTimeout, 1)
			}
		}()
	}

	client, err := storagepool.NewClient(restConfig)
	if err != nil {
		return err
	}
	var informers []cache.SharedIndexInformer
	if nodeName != "" {
		// Only this node's objects and the shared ones: 1,000 sidecars must not each watch all pools.
		informers = append(informers,
			storagepool.NewInformer(client, labels.SelectorFromSet(labels.Set{consts.LabelNode: storagepool.LabelValue(nodeName)})),
			storagepool.NewInformer(client, labels.SelectorFromSet(labels.Set{consts.LabelShared: "true"})))
	} else {
		all, err := labels.NewRequirement(consts.LabelPool, selection.Exists, nil)
		if err != nil {
			return err
		}
		informers = append(informers, storagepool.NewInformer(client, labels.NewSelector().Add(*all)))
	}
	objects, err := storagepool.NewObjectCache(informers...)
	if err != nil {
		return err
	}
	reconciler, err := storagepool.NewReconciler(storagepool.Config{
		DriverName:        driverName,
		NodeName:          nodeName,
		ResyncPeriod:      resync,
		MaxErrors:         maxErrors,
		MaxCachedDatasets: maxCached,
	}, source, client, objects, m)
	if err != nil {
		return err
	}
	// A deleted object is re-created at once rather than at the next resync.
	objects.OnDelete(reconciler.Enqueue)

	runPublisher := func(ctx context.Context) {
		for _, inf := range informers {
			go inf.RunWithContext(ctx)
		}
		if !cache.WaitForCacheSync(ctx.Done(), objects.HasSynced) {
			return
		}
		reconciler.Run(ctx)
	}
	lockName := "storagepool-sidecar-" + driverName
	leaderelection.RunWithLeaderElection(ctx, restConfig, cfg, runPublisher, lockName, mux, true)
	return nil
}

func buildConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}
