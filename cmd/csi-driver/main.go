// Command csi-driver is the Cistern CSI plugin: Identity, Controller and Node services over the
// node's storage pools, plus the StoragePoolController service, on one unix socket.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"github.com/cistern-csi/cistern/pkg/datasource/nodeevents"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/datasource/peer/discovery"
	"github.com/cistern-csi/cistern/pkg/driver"
	"github.com/cistern-csi/cistern/pkg/registration"
	"github.com/cistern-csi/cistern/pkg/storagepool"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	cfg := driver.Config{VendorVersion: version}
	var mode, httpEndpoint, registrationPath, registrationDir string
	var defaultSize int64
	klog.InitFlags(nil)
	flag.StringVar(&cfg.DriverName, "driver-name", consts.DriverName, "CSI driver name.")
	flag.StringVar(&cfg.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint (unix:///path/to/csi.sock).")
	flag.StringVar(&cfg.NodeID, "node-id", "", "Node ID reported in NodeGetInfo and topology (the Kubernetes node name).")
	flag.StringVar(&mode, "mode", string(driver.ModeAll), "Services to serve: all, controller or node.")
	flag.StringVar(&cfg.PoolsConfig, "pools-config", "/etc/cistern/pools.yaml", "Pools config file (YAML); re-read when it changes.")
	flag.StringVar(&cfg.StateDir, "state-dir", "/var/lib/cistern", "Directory for persisted volume and snapshot state.")
	flag.Int64Var(&defaultSize, "default-volume-size", 1<<30, "Size in bytes of a volume created without a capacity request.")
	flag.DurationVar(&cfg.PoolCheckInterval, "pool-check-interval", 10*time.Second, "How often pool health and capacity are checked.")
	flag.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "How long in-flight calls may finish after SIGTERM.")
	flag.StringVar(&httpEndpoint, "http-endpoint", "", "Address (host:port) serving /metrics and /healthz; empty disables it.")
	flag.Int64Var(&cfg.Inline.MaxBytes, "max-inline-volume-bytes", 100<<30, "Largest inline ephemeral volume, and largest dataset a read-only inline volume naming no size may cache; 0 is unlimited.")
	inlinePools := flag.String("inline-pools", "", "Comma-separated pools inline ephemeral volumes may use; empty allows every pool.")
	flag.StringVar(&cfg.KubeletRoot, "kubelet-root", driver.DefaultKubeletRoot, "kubelet's root directory (its --root-dir): staging and target paths outside it are refused.")
	flag.StringVar(&registrationPath, "kubelet-registration-path", "", "The CSI socket path as kubelet sees it; when set, the driver registers itself with kubelet's plugin watcher (no node-driver-registrar needed).")
	flag.StringVar(&registrationDir, "plugin-registration-dir", registration.DefaultDir, "kubelet's plugin registration directory, for --kubelet-registration-path.")
	var localSourceRoots, tenantEndpoints string
	flag.StringVar(&localSourceRoots, "local-source-roots", "", "Comma-separated node directories that file:// dataset sources may read; empty disables file:// sources.")
	flag.StringVar(&tenantEndpoints, "tenant-s3-endpoints", "", "Comma-separated S3 endpoints that inline volumes and VolumeManagers may name: host names, *.domain suffixes, CIDR blocks (AWS without an endpoint counts as s3.amazonaws.com). Empty refuses every tenant endpoint; \"*\" allows any; link-local and cloud metadata addresses are refused always.")
	flag.IntVar(&cfg.Datasets.Concurrency, "staging-concurrency", 16, "Parallel reads from dataset sources, across all datasets staging on the node.")
	flag.Int64Var(&cfg.Datasets.BandwidthBytesPerSec, "staging-bandwidth", 0, "Bytes per second that dataset staging on the node may use; 0 is unlimited.")
	flag.Float64Var(&cfg.Datasets.LowWatermark, "cache-low-watermark", 0.10, "Fraction of a pool kept free: below it, unused cached datasets are evicted, least recently used first.")
	flag.Float64Var(&cfg.Datasets.HighWatermark, "cache-high-watermark", 0.20, "Fraction of a pool that eviction frees up to.")
	flag.DurationVar(&cfg.Datasets.ProgressInterval, "dataset-progress-interval", 5*time.Second, "How often a dataset being staged reports its progress to the StoragePool publisher (each report of a changed progress is one status write per staging pool).")
	flag.DurationVar(&cfg.Datasets.AccessProofTTL, "dataset-access-ttl", datasource.DefaultAccessProofTTL, "How long a caller's full proof of access to a cached dataset (its own listing matching the cache) is remembered; within it a cache hit costs one pinned read. 0 lists on every hit.")
	var nfsServers string
	flag.StringVar(&nfsServers, "nfs-servers", "", "Comma-separated NFS servers (host or host:port, as written in nfs:// URLs) that inline volumes may name; empty refuses nfs:// in inline volumes.")
	nfsUID := flag.Uint("nfs-uid", datasource.NobodyID, "AUTH_UNIX uid the NFS client presents.")
	nfsGID := flag.Uint("nfs-gid", datasource.NobodyID, "AUTH_UNIX gid the NFS client presents.")
	lim := &cfg.Datasets.Limits
	def := datasource.DefaultLimits
	flag.Int64Var(&lim.MaxBytes, "max-dataset-bytes", def.MaxBytes, "Largest dataset (bytes) a volume may name.")
	flag.Int64Var(&lim.MaxObjects, "max-dataset-objects", def.MaxObjects, "Most entries (files, directories, links; empty files too) a dataset may have; also the most keys and common prefixes its listing may go through, those its patterns drop included.")
	flag.IntVar(&lim.MaxKeyLength, "max-dataset-key-length", def.MaxKeyLength, "Longest key (bytes) of a dataset entry.")
	flag.IntVar(&lim.MaxKeyDepth, "max-dataset-key-depth", def.MaxKeyDepth, "Most path segments of a dataset entry's key.")
	flag.Int64Var(&lim.MaxManifestBytes, "max-dataset-manifest-bytes", def.MaxManifestBytes, "Largest manifest (bytes) a dataset may write to its pool.")
	flag.Int64Var(&lim.MinThroughput, "staging-min-throughput", def.MinThroughput, "Bytes per second below which a read of an object is cancelled and retried (after --staging-read-grace).")
	flag.DurationVar(&lim.ReadGrace, "staging-read-grace", def.ReadGrace, "Time a read of an object may take on top of its size at --staging-min-throughput.")
	flag.DurationVar(&lim.JobDeadline, "staging-deadline", def.JobDeadline, "Longest one staging attempt may take.")
	flag.DurationVar(&lim.AbandonAfter, "staging-abandon-after", def.AbandonAfter, "A staging no volume asked for in this long is cancelled and its partial data deleted.")
	flag.IntVar(&lim.PerSource, "staging-concurrency-per-source", 0, "Parallel reads from one source endpoint (S3 endpoint, NFS server); 0 is a quarter of --staging-concurrency.")
	flag.IntVar(&lim.Listings, "max-concurrent-listings", def.Listings, "Dataset listings (of stagings and access proofs) under way on the node at once; more wait.")
	flag.IntVar(&lim.ListingsPerSource, "max-concurrent-listings-per-source", def.ListingsPerSource, "Dataset listings under way against one source endpoint at once; more wait.")
	flag.Int64Var(&lim.MaxGlobWork, "max-dataset-glob-work", def.MaxGlobWork, "Include/exclude matching one listing may do, in pattern bytes times key bytes; past it the dataset is refused.")
	flag.StringVar(&cfg.Peers.Listen, "peer-listen", "", "Address (host:port) of the peer port, which serves this node's S3 datasets to other node plugins (docs/datasets.md); empty: no peer fan-out. Needs API access (in-cluster, or --kubeconfig).")
	peerAdvertise := flag.String("peer-advertise", "", "host:port at which other nodes reach the peer port (the pod IP and the port); published on this node's StoragePools.")
	peerTokenFile := flag.String("peer-token-file", "/var/run/secrets/cistern-peer/token", "This node plugin's ServiceAccount token for the audience cistern-peer (a projected token kubelet keeps fresh).")
	peerAccounts := flag.String("peer-service-accounts", "cistern-system/cistern-node", "Comma-separated namespace/name of the ServiceAccounts whose pod-bound tokens the peer port serves.")
	flag.Int64Var(&cfg.Peers.Server.BandwidthBytesPerSec, "peer-upload-bandwidth", 256<<20, "Bytes per second the peer port may send, across peers; 0 is unlimited.")
	flag.IntVar(&cfg.Peers.Server.MaxUploads, "peer-max-uploads", 8, "Requests for pieces the peer port answers at once (a batch of small entries counts as one); more wait briefly, then go to other peers or the source.")
	events := flag.Bool("events", false, "Record dataset cache evictions as Events on this node's Node object (needs API access: in-cluster, or --kubeconfig).")
	kubeconfig := flag.String("kubeconfig", "", "Kubeconfig for --events and --peer-listen; empty uses the in-cluster configuration.")
	showVersion := flag.Bool("version", false, "Print the version and exit.")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	if *inlinePools != "" {
		cfg.Inline.Pools = strings.Split(*inlinePools, ",")
	}
	if localSourceRoots != "" {
		cfg.Datasets.LocalSourceRoots = strings.Split(localSourceRoots, ",")
	}
	allow, err := egress.ParseAllow(strings.Split(tenantEndpoints, ","))
	if err != nil {
		klog.ErrorS(err, "Invalid --tenant-s3-endpoints")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	cfg.Datasets.TenantEndpoints = allow
	if nfsServers != "" {
		cfg.Datasets.NFSServers = strings.Split(nfsServers, ",")
	}
	uid, gid := uint32(*nfsUID), uint32(*nfsGID)
	cfg.Datasets.NFSUID, cfg.Datasets.NFSGID = &uid, &gid
	cfg.Mode = driver.Mode(mode)
	cfg.DefaultVolumeSize = defaultSize
	if *events {
		rec, err := eventRecorder(*kubeconfig, cfg.NodeID)
		if err != nil {
			klog.ErrorS(err, "Cannot record Events")
			klog.FlushAndExit(klog.ExitFlushTimeout, 1)
		}
		defer rec.Stop()
		cfg.Datasets.OnEvict = rec.Evicted
	}

	var inventory *discovery.Inventory
	if cfg.Peers.Listen != "" {
		if inventory, err = setupPeers(&cfg, *kubeconfig, *peerAdvertise, *peerTokenFile, *peerAccounts); err != nil {
			klog.ErrorS(err, "Cannot serve peers")
			klog.FlushAndExit(klog.ExitFlushTimeout, 1)
		}
	}

	d, err := driver.New(cfg)
	if err != nil {
		klog.ErrorS(err, "Cannot start the driver")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if httpEndpoint != "" {
		go serveHTTP(ctx, httpEndpoint, d)
	}
	if inventory != nil {
		go inventory.Run(ctx)
	}
	if registrationPath != "" {
		reg, err := registration.New(registration.Config{DriverName: cfg.DriverName, Endpoint: registrationPath, Dir: registrationDir})
		if err != nil {
			klog.ErrorS(err, "Cannot register with kubelet")
			klog.FlushAndExit(klog.ExitFlushTimeout, 1)
		}
		go registerWhenReady(ctx, d, reg)
	}
	klog.InfoS("Starting Cistern CSI driver", "version", version, "driver", cfg.DriverName, "node", cfg.NodeID, "mode", cfg.Mode)
	if err := d.Run(ctx); err != nil {
		klog.ErrorS(err, "Driver stopped with an error")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.InfoS("Driver stopped")
}

// eventRecorder records Events on the node through the in-cluster configuration or kubeconfig.
func eventRecorder(kubeconfig, node string) (*nodeevents.Recorder, error) {
	if node == "" {
		return nil, errors.New("--events needs --node-id")
	}
	_, client, err := kubeClient(kubeconfig)
	if err != nil {
		return nil, err
	}
	return nodeevents.New(client, node, "cistern-csi-driver"), nil
}

// kubeClient is a client of the API server, through the in-cluster configuration or kubeconfig,
// and its configuration for the other clients built on it.
func kubeClient(kubeconfig string) (*rest.Config, kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	rc.UserAgent = "cistern-csi-driver/" + version
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	return rc, client, nil
}

// setupPeers prepares peer fan-out: the peer port's certificate and authenticator, and the
// client side that finds peers in the StoragePool inventory (docs/datasets.md).
func setupPeers(cfg *driver.Config, kubeconfig, advertise, tokenFile, accounts string) (*discovery.Inventory, error) {
	if cfg.NodeID == "" || advertise == "" {
		return nil, errors.New("--peer-listen needs --node-id and --peer-advertise")
	}
	rc, client, err := kubeClient(kubeconfig)
	if err != nil {
		return nil, err
	}
	spClient, err := storagepool.NewClient(rc)
	if err != nil {
		return nil, err
	}
	cert, hash, err := peer.SelfSigned(cfg.NodeID)
	if err != nil {
		return nil, err
	}
	cfg.Peers.Server.Cert = cert
	cfg.Peers.Server.Auth = &peer.TokenReviewer{Client: client.AuthenticationV1().TokenReviews(), ServiceAccounts: strings.Split(accounts, ",")}
	self := storagepool.LabelValue(cfg.NodeID)
	// Requests name versions bound to the asking node and this one, by the names the
	// StoragePools publish (peer.BindVersion).
	cfg.Peers.Server.Self, cfg.Peers.Server.NodeName = self, storagepool.LabelValue
	inventory := discovery.New(spClient, cfg.NodeID, peer.Peer{Node: self, Address: advertise, CertHash: hash})
	token := &peer.TokenFile{Path: tokenFile}
	if cfg.Datasets.Peers, err = peer.NewNetwork(peer.NetworkConfig{Self: self, Directory: inventory, Token: token.Token}); err != nil {
		return nil, err
	}
	return inventory, nil
}

// registerWhenReady offers the driver to kubelet once it serves: kubelet calls NodeGetInfo as
// soon as it sees the registration socket.
func registerWhenReady(ctx context.Context, d *driver.Driver, reg *registration.Server) {
	select {
	case <-ctx.Done():
		return
	case <-d.Ready():
	}
	if err := reg.Run(ctx); err != nil {
		klog.ErrorS(err, "Kubelet plugin registration failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

func serveHTTP(ctx context.Context, addr string, d *driver.Driver) {
	mux := http.NewServeMux()
	d.Metrics().RegisterToServer(mux, "/metrics")
	// Healthy as long as any pool is (or none is configured): one bad disk must not get the
	// whole plugin restarted.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		pools, _ := d.Pools().List()
		if len(pools) == 0 {
			fmt.Fprintln(w, "ok")
			return
		}
		for _, p := range pools {
			if p.Healthy {
				fmt.Fprintln(w, "ok")
				return
			}
		}
		http.Error(w, "no healthy pool", http.StatusServiceUnavailable)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		klog.ErrorS(err, "HTTP endpoint failed", "address", addr)
	}
}
