// Package driver implements the Cistern CSI plugin: Identity, Controller and Node services over
// node-local storage pools, plus the StoragePoolController service of the StoragePool KEP.
package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/volume"
)

// Mode selects which CSI services the plugin serves.
type Mode string

const (
	ModeAll        Mode = "all"
	ModeController Mode = "controller"
	ModeNode       Mode = "node"
)

// Config is everything the driver needs; cmd/csi-driver fills it from flags.
type Config struct {
	DriverName    string
	VendorVersion string
	// Endpoint is the CSI socket, unix:///path/csi.sock.
	Endpoint string
	NodeID   string
	Mode     Mode
	// PoolsConfig is the pools config file; it is re-read when it changes.
	PoolsConfig string
	// StateDir holds the persisted volume and snapshot records.
	StateDir string
	// DefaultVolumeSize is used when a CreateVolume asks for no particular size.
	DefaultVolumeSize int64
	// PoolCheckInterval is how often pool health and capacity are checked.
	PoolCheckInterval time.Duration
	// ShutdownTimeout bounds how long in-flight RPCs may run after a stop signal.
	ShutdownTimeout time.Duration
	// KubeletRoot is kubelet's root directory (--root-dir): staging and target paths must be
	// under it. Empty means DefaultKubeletRoot.
	KubeletRoot string
	// Inline bounds inline ephemeral volumes (a pod author's): their size and pools.
	Inline volume.InlineLimits
	// Writable says how writable volumes of a dataset get its data (layered or copied).
	Writable volume.WritableDatasets
	// Streaming configures streaming dataset volumes (dataMode=streaming).
	Streaming volume.StreamingVolumes
	// Staging configures the progress Events of the stagings volumes wait for (on their claim
	// or inline volume's pod); the zero value posts none.
	Staging volume.StagingEvents
	// VolumeDevSuid mounts volumes without nodev,nosuid (--volume-dev-suid; docs/security.md).
	VolumeDevSuid bool
	// Datasets configures dataset staging (see dataset.go); its Pools come from the pools config.
	Datasets datasource.Config
	// Peers serves this node's datasets to other node plugins (docs/datasets.md, "Peer fan-out");
	// Datasets.Peers is the client side.
	Peers PeerConfig
}

// PeerConfig is the peer port of a node plugin.
type PeerConfig struct {
	// Listen is the peer port's address (--peer-listen); empty serves no peers.
	Listen string
	// Server configures it; its Store is the driver's dataset manager.
	Server peer.ServerConfig
}

func (c *Config) validate() error {
	var errs []error
	if c.DriverName == "" {
		errs = append(errs, errors.New("driver name is required"))
	}
	if c.Endpoint == "" {
		errs = append(errs, errors.New("endpoint is required"))
	}
	if c.NodeID == "" {
		errs = append(errs, errors.New("node ID is required"))
	}
	switch c.Mode {
	case ModeAll, ModeController, ModeNode:
	default:
		errs = append(errs, fmt.Errorf("mode %q is not one of all, controller, node", c.Mode))
	}
	if c.PoolsConfig == "" {
		errs = append(errs, errors.New("pools config is required"))
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("state directory is required"))
	}
	if c.DefaultVolumeSize <= 0 {
		c.DefaultVolumeSize = 1 << 30
	}
	if c.PoolCheckInterval <= 0 {
		c.PoolCheckInterval = 10 * time.Second
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.KubeletRoot == "" {
		c.KubeletRoot = DefaultKubeletRoot
	}
	if !filepath.IsAbs(c.KubeletRoot) {
		errs = append(errs, fmt.Errorf("kubelet root %q is not absolute", c.KubeletRoot))
	}
	return errors.Join(errs...)
}

// Driver holds what the CSI services share.
type Driver struct {
	cfg Config
	// peers serves the node's datasets to other node plugins, when configured.
	peers   *peer.Server
	pools   *pool.Manager
	locks   *keyLocks
	mounter *mount.SafeFormatAndMount
	resizer *mount.ResizeFs
	metrics metrics.CSIMetricsManager
	// datasets stages dataset sources into the pools' caches (see dataset.go).
	datasets *datasource.Manager
	// cache is datasets by pool name: what the volume service and the inventory use.
	cache *datasource.Datasets
	// volumes is the node's volume engine; the node RPCs are a thin layer over it.
	volumes *volume.Service

	poolsConfigStamp fileStamp
	ready            chan struct{}
}

// New validates cfg, loads the pools config and the persisted state, and cleans up what a crash
// may have left half-done. It does not listen yet; call Run.
func New(cfg Config) (*Driver, error) {
	return newDriver(cfg, volume.LoopImages{})
}

// newDriver is New with the image operations given (tests wrap them).
func newDriver(cfg Config, images volume.Images) (*Driver, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("invalid driver config: %w", err)
	}
	pc, err := pool.LoadConfig(cfg.PoolsConfig)
	if err != nil {
		return nil, err
	}
	store, err := state.Open(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	exec := utilexec.New()
	// Without systemd: the plugin mounts from its own container, where no systemd scope can
	// outlive it, and mount.New's lazy detection of systemd, written by whichever mount runs
	// first, is a data race between concurrent NodePublishVolume calls (found by the fault
	// suite's race-built driver).
	d := &Driver{
		cfg:     cfg,
		pools:   pool.NewManager(pc),
		locks:   newKeyLocks(),
		mounter: mount.NewSafeFormatAndMount(mount.NewWithoutSystemd(""), exec),
		resizer: mount.NewResizeFs(exec),
		metrics: metrics.NewCSIMetricsManagerForPlugin(cfg.DriverName),
		ready:   make(chan struct{}),
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newPoolCollector(d), newStateCollector(d))
	d.metrics = d.metrics.WithAdditionalRegistry(reg)
	d.poolsConfigStamp, _ = stampOf(cfg.PoolsConfig)
	d.pools.Refresh()
	if d.datasets, err = d.initDatasets(reg); err != nil {
		return nil, fmt.Errorf("invalid dataset config: %w", err)
	}
	d.cache = datasource.NewDatasets(d.datasets, datasetPools{d.pools, cfg.NodeID})
	if cfg.Peers.Listen != "" {
		sc := cfg.Peers.Server
		sc.Store = d.datasets
		if d.peers, err = peer.NewServer(sc); err != nil {
			return nil, fmt.Errorf("invalid peer config: %w", err)
		}
		reg.MustRegister(d.peers.Collectors()...)
	}
	d.volumes = volume.New(volume.Config{NodeID: cfg.NodeID, Store: store, Pools: d.pools, Images: images,
		Mounter: d.mounter, Resizer: d.resizer, Datasets: d.cache, Inline: cfg.Inline, Writable: cfg.Writable,
		Streaming: cfg.Streaming, DevSuid: cfg.VolumeDevSuid, Staging: cfg.Staging})
	reg.MustRegister(d.volumes.WriteBackCollectors()...)
	reg.MustRegister(d.volumes.ReadyCollectors()...)
	d.volumes.MigrateTreeRecords(cfg.StateDir)
	d.volumes.Recover()
	// Before any call: a streaming volume's readers wait for its takeover, never for a call.
	d.volumes.TakeOverStreams(context.Background())
	return d, nil
}

// Pools exposes the pool manager (for metrics and tests).
func (d *Driver) Pools() *pool.Manager { return d.pools }

// Metrics exposes the gRPC metrics manager so the caller can serve it over HTTP.
func (d *Driver) Metrics() metrics.CSIMetricsManager { return d.metrics }

// Run serves the CSI socket until ctx is cancelled, then stops gracefully.
func (d *Driver) Run(ctx context.Context) error {
	srv, err := d.newServer()
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	defer close(stop)
	defer d.volumes.StopWriteBacks()
	go d.watchPools(stop)
	go d.datasets.Run(ctx)
	go d.volumes.WatchKeeper(ctx)
	if d.peers != nil {
		l, err := net.Listen("tcp", d.cfg.Peers.Listen)
		if err != nil {
			return fmt.Errorf("peer port: %w", err)
		}
		go func() {
			if err := d.peers.Serve(ctx, l); err != nil {
				klog.ErrorS(err, "Peer port failed", "address", d.cfg.Peers.Listen)
			}
		}()
	}
	return srv.serve(ctx, d.cfg.Endpoint, d.cfg.ShutdownTimeout, func() { close(d.ready) })
}

// Ready is closed once the driver listens on its socket.
func (d *Driver) Ready() <-chan struct{} { return d.ready }

// watchPools re-checks pool health periodically and re-reads the pools config when it changes.
func (d *Driver) watchPools(stop <-chan struct{}) {
	wait.Until(func() {
		d.reloadPoolsConfig()
		d.pools.Refresh()
	}, d.cfg.PoolCheckInterval, stop)
}

func (d *Driver) reloadPoolsConfig() {
	st, err := stampOf(d.cfg.PoolsConfig)
	if err != nil || st == d.poolsConfigStamp {
		return
	}
	cfg, err := pool.LoadConfig(d.cfg.PoolsConfig)
	if err != nil {
		klog.ErrorS(err, "Ignoring changed pools config; keeping the previous one", "path", d.cfg.PoolsConfig)
		d.poolsConfigStamp = st
		return
	}
	d.poolsConfigStamp = st
	klog.InfoS("Pools config changed", "path", d.cfg.PoolsConfig, "pools", len(cfg.Pools))
	d.pools.SetConfig(cfg)
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}
