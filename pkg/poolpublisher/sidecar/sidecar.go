// Package sidecar assembles the storagepool-sidecar: a connection to the CSI driver, informers
// on the StoragePool objects it may write, and the publishing reconciler of pkg/poolpublisher,
// behind leader election. cmd/storagepool-sidecar fills its Config from flags.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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
	"github.com/cistern-csi/cistern/pkg/poolpublisher"
)

// Config is everything the sidecar needs.
type Config struct {
	// Standard holds the flags every CSI sidecar has (csi-lib-utils standardflags): the driver's
	// address, kubeconfig, API QPS, leader election, metrics.
	Standard standardflags.SidecarConfiguration
	// NodeName is the node whose pools this instance publishes; empty publishes everything the
	// driver reports (the single instance next to a controller-mode driver).
	NodeName string
	// ResyncPeriod is how often the driver's pools are compared with the objects even without a
	// change reported.
	ResyncPeriod time.Duration
	// MaxErrors is how many recent errors each StoragePool keeps per reporting node (0: the
	// default).
	MaxErrors int
	// ListPageSize is how many pools one ControllerListStoragePools call returns (0: all).
	ListPageSize int32
	// MaxCachedDatasets is how many datasets of a pool's cache each StoragePool lists.
	MaxCachedDatasets int
	// Timeout bounds the driver calls made at start.
	Timeout time.Duration
	// UserAgent names this process to the API server.
	UserAgent string
}

// Sidecar publishes a CSI driver's pools as StoragePool objects.
type Sidecar struct {
	cfg        Config
	restConfig *rest.Config
}

// New checks cfg and loads the API server configuration; Run starts the sidecar.
func New(cfg Config) (*Sidecar, error) {
	var errs []error
	std := cfg.Standard
	if std.CSIAddress == "" {
		errs = append(errs, errors.New("--csi-address is required"))
	}
	if std.MetricsAddress != "" && std.HttpEndpoint != "" {
		errs = append(errs, errors.New("only one of --metrics-address and --http-endpoint can be set"))
	}
	if cfg.ResyncPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--resync-period %s must be positive", cfg.ResyncPeriod))
	}
	if cfg.ListPageSize < 0 {
		errs = append(errs, fmt.Errorf("--list-page-size %d must not be negative", cfg.ListPageSize))
	}
	if cfg.MaxCachedDatasets <= 0 || cfg.MaxCachedDatasets > 1024 {
		errs = append(errs, fmt.Errorf("--max-cached-datasets must be between 1 and 1024 (the CRD's bound), got %d", cfg.MaxCachedDatasets))
	}
	if cfg.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %s must be positive", cfg.Timeout))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	restConfig, err := buildConfig(std.KubeConfig)
	if err != nil {
		return nil, fmt.Errorf("API server configuration: %w", err)
	}
	restConfig.QPS = float32(std.KubeAPIQPS)
	restConfig.Burst = std.KubeAPIBurst
	restConfig.UserAgent = cfg.UserAgent
	return &Sidecar{cfg: cfg, restConfig: restConfig}, nil
}

// Run connects to the driver and publishes its pools until ctx ends.
func (s *Sidecar) Run(ctx context.Context) error {
	cfg, std := s.cfg, s.cfg.Standard
	logger := klog.FromContext(ctx)

	// Connect waits until the driver's socket answers.
	metricsManager := metrics.NewCSIMetricsManagerForSidecar("")
	conn, err := connection.Connect(ctx, std.CSIAddress, metricsManager)
	if err != nil {
		return fmt.Errorf("connecting to the CSI driver at %s: %w", std.CSIAddress, err)
	}
	defer conn.Close()
	// No Probe wait: a driver whose pools are all unhealthy reports not ready, and publishing
	// exactly that is this sidecar's job.
	callCtx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	driverName, err := csirpc.GetDriverName(callCtx, conn)
	if err != nil {
		return fmt.Errorf("asking the CSI driver its name: %w", err)
	}
	metricsManager.SetDriverName(driverName)
	source := poolpublisher.NewDriverPools(conn, cfg.ListPageSize).WithMaxCachedDatasets(int32(cfg.MaxCachedDatasets))
	if err := source.CheckSupported(callCtx); err != nil {
		return err
	}
	logger.Info("CSI driver serves StoragePoolController", "driver", driverName)

	m := poolpublisher.NewMetrics(metricsManager.GetRegistry())
	mux := s.serveMetrics(ctx, metricsManager)

	client, err := poolpublisher.NewClient(s.restConfig)
	if err != nil {
		return err
	}
	informers, err := s.informers(client)
	if err != nil {
		return err
	}
	objects, err := poolpublisher.NewObjectCache(informers...)
	if err != nil {
		return err
	}
	reconciler, err := poolpublisher.NewReconciler(poolpublisher.Config{
		DriverName:        driverName,
		NodeName:          cfg.NodeName,
		ResyncPeriod:      cfg.ResyncPeriod,
		MaxErrors:         cfg.MaxErrors,
		MaxCachedDatasets: cfg.MaxCachedDatasets,
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
	leaderelection.RunWithLeaderElection(ctx, s.restConfig, std, runPublisher, lockName, mux, true)
	return nil
}

// serveMetrics serves the metrics and /healthz on the standard flags' address, when one is
// set; the returned mux is the one leader election adds its health check to.
func (s *Sidecar) serveMetrics(ctx context.Context, metricsManager metrics.CSIMetricsManager) *http.ServeMux {
	std, logger := s.cfg.Standard, klog.FromContext(ctx)
	mux := http.NewServeMux()
	addr := std.HttpEndpoint
	if addr == "" {
		addr = std.MetricsAddress
	}
	if addr != "" {
		metricsManager.RegisterToServer(mux, std.MetricsPath)
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		go func() {
			logger.Info("Serving metrics", "address", addr, "path", std.MetricsPath)
			if err := http.ListenAndServe(addr, mux); err != nil {
				logger.Error(err, "Metrics server failed")
				klog.FlushAndExit(klog.ExitFlushTimeout, 1)
			}
		}()
	}
	return mux
}

// informers watch the StoragePool objects this sidecar publishes: with a node name only that
// node's and the shared ones (1,000 sidecars must not each watch all pools), else every pool.
func (s *Sidecar) informers(client *poolpublisher.Client) ([]cache.SharedIndexInformer, error) {
	if node := s.cfg.NodeName; node != "" {
		return []cache.SharedIndexInformer{
			poolpublisher.NewInformer(client, labels.SelectorFromSet(labels.Set{consts.LabelNode: poolpublisher.LabelValue(node)})),
			poolpublisher.NewInformer(client, labels.SelectorFromSet(labels.Set{consts.LabelShared: "true"})),
		}, nil
	}
	all, err := labels.NewRequirement(consts.LabelPool, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	return []cache.SharedIndexInformer{poolpublisher.NewInformer(client, labels.NewSelector().Add(*all))}, nil
}

func buildConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}
