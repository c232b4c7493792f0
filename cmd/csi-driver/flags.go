package main

import (
	"flag"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/driver"
	"github.com/cistern-csi/cistern/pkg/streamfs"
	"github.com/cistern-csi/cistern/pkg/volume"
)

// options are the flags that are not driver.Config fields as they stand.
type options struct {
	mode, httpEndpoint, metricsSecureAddress                   string
	defaultSize                                                int64
	inlinePools, localSourceRoots, tenantEndpoints, nfsServers string
	writableDatasets, webIdentityRoles, unverifiable           string
	nfsUID, nfsGID                                             uint
	peerAdvertise, peerTokenFile, peerAccounts                 string
	peerReviews                                                peer.ReviewLimits
	events, removeStartupTaint, showVersion                    bool
	kubeconfig                                                 string
}

// bindFlags registers every flag: the driver's straight into cfg, the others into o.
func bindFlags(cfg *driver.Config, o *options) {
	bindDriverFlags(cfg, o)
	bindDatasetFlags(&cfg.Datasets, o)
	bindLimitFlags(&cfg.Datasets.Limits)
	bindPeerFlags(&cfg.Peers, o)
}

func bindDriverFlags(cfg *driver.Config, o *options) {
	flag.StringVar(&cfg.DriverName, "driver-name", consts.DriverName, "CSI driver name.")
	flag.StringVar(&cfg.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint (unix:///path/to/csi.sock).")
	flag.StringVar(&cfg.NodeID, "node-id", "", "Node ID reported in NodeGetInfo and topology (the Kubernetes node name).")
	flag.StringVar(&o.mode, "mode", string(driver.ModeAll), "Services to serve: all, controller or node.")
	flag.StringVar(&cfg.PoolsConfig, "pools-config", "/etc/cistern/pools.yaml", "Pools config file (YAML); re-read when it changes.")
	flag.StringVar(&cfg.StateDir, "state-dir", "/var/lib/cistern", "Directory for persisted volume and snapshot state.")
	flag.Int64Var(&o.defaultSize, "default-volume-size", 1<<30, "Size in bytes of a volume created without a capacity request.")
	flag.DurationVar(&cfg.PoolCheckInterval, "pool-check-interval", 10*time.Second, "How often pool health and capacity are checked.")
	flag.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "How long in-flight calls may finish after SIGTERM.")
	flag.StringVar(&o.httpEndpoint, "http-endpoint", "", "Address (host:port) serving /metrics and /healthz; empty disables it.")
	flag.StringVar(&o.metricsSecureAddress, "metrics-secure-address", "", "Address (host:port) serving /metrics over HTTPS to callers whose token may get the /metrics non-resource URL (checked with TokenReview and SubjectAccessReview, as the workload-controller's --metrics-secure); needs API access (in-cluster, or --kubeconfig). Empty disables it.")
	flag.StringVar(&cfg.Writable.WriteBack.Dir, "writeback-dir", "/var/lib/cistern/writeback", "Directory (on storage that outlives the node plugin) for the journals of uploads of volumes' outputs (outputTarget); empty refuses output targets.")
	flag.DurationVar(&cfg.Writable.WriteBack.MinInterval, "writeback-min-interval", 5*time.Minute, "Shortest outputInterval (uploads of a volume's outputs at an interval while it is in use) a volume may name; shorter ones are refused at publish. Checkpoints run one at a time on the node.")
	flag.Int64Var(&cfg.Writable.WriteBack.MaxPendingBytes, "writeback-max-pending-bytes", 100<<30, "Most bytes of outputs not uploaded yet the node may hold, each namespace's counted up to its share: a volume naming an output target is refused at publish while the node holds this much; 0 is unlimited.")
	flag.Int64Var(&cfg.Writable.WriteBack.MaxPendingBytesPerNamespace, "writeback-max-pending-bytes-per-namespace", 0, "A namespace's share of --writeback-max-pending-bytes: its volumes naming an output target are refused while it holds this much not uploaded yet, and what it holds past it does not count against the node; 0 is a quarter of --writeback-max-pending-bytes.")
	flag.DurationVar(&cfg.Writable.WriteBack.MaxAge, "writeback-max-age", 7*24*time.Hour, "How long an upload of a volume's outputs may stay pending after the volume is let go (its target refusing): then it expires, its credentials are deleted, an inline volume is deleted with the outputs not uploaded, a claim keeps them; 0 never expires.")
	flag.Int64Var(&cfg.Inline.MaxBytes, "max-inline-volume-bytes", 100<<30, "Largest inline ephemeral volume, and largest dataset a read-only inline volume naming no size may cache; 0 is unlimited.")
	flag.StringVar(&o.inlinePools, "inline-pools", "", "Comma-separated pools inline ephemeral volumes may use; empty allows every pool.")
	flag.BoolVar(&cfg.VolumeDevSuid, "volume-dev-suid", false, "Mount volumes without nodev,nosuid, so that device nodes and set-user-ID files in them work (for the rare workload that needs them). Off, a device node a pod makes in its volume cannot be opened, and set-user-ID bits are ignored.")
	flag.StringVar(&cfg.KubeletRoot, "kubelet-root", driver.DefaultKubeletRoot, "kubelet's root directory (its --root-dir): staging and target paths outside it are refused.")
	flag.StringVar(&cfg.Streaming.Keeper, "fuse-keeper", "", "Socket of the FUSE keeper (csi-driver fuse-keeper, run apart from the plugin): streaming volumes' FUSE connections are kept there, so that a restart or upgrade of the plugin loses no read; empty, or no keeper listening: a restart breaks their reads.")
	flag.IntVar(&cfg.Streaming.MaxOpenFiles, "streaming-max-open-files", streamfs.DefaultMaxOpenFiles, "Most files the node's streaming volumes together hold open for the files their pods read (descriptors, and the backing files the kernel holds for files passed through): past it the least recently read are closed, and opened again when read (a pod reading many files cannot run the plugin out of descriptors, nor the kernel out of open files). Keep it well under the plugin's open-files limit; 0 is the default.")
	flag.IntVar(&cfg.Streaming.MaxVolumes, "streaming-max-volumes", volume.DefaultMaxStreamingVolumes, "Most streaming volumes the node serves at once (each a FUSE server in the plugin and a record in the FUSE keeper's memory): one more is refused at publish/stage with ResourceExhausted; 0 is the default.")
	flag.IntVar(&cfg.Streaming.MaxVolumesPerNamespace, "streaming-max-volumes-per-namespace", 0, "Most streaming volumes of one namespace (the pod's; for a PersistentVolume, its claim's as external-provisioner names it) the node serves at once: one more is refused at publish/stage with ResourceExhausted while other namespaces still get theirs. Volumes that name no namespace (an administrator's static PVs) share one such bound. 0 is a quarter of --streaming-max-volumes.")
	flag.BoolVar(&o.events, "events", false, "Record dataset cache evictions, writable dataset volumes copied for want of overlayfs, streaming volumes staged for want of FUSE, and objects nothing could check (--unverifiable-objects), as Events on this node's Node object, and the write-back of volumes' outputs (started, failed and retried, finished, target refused) and the progress of the stagings volumes wait for (DatasetStaging after 20s, then at intervals doubling up to 5m; DatasetStaged) as Events on their pod or claim (needs API access: in-cluster, or --kubeconfig).")
	flag.BoolVar(&o.removeStartupTaint, "remove-startup-taint", false, "Remove the taint "+consts.StartupTaintKey+" (any effect; the administrator registers nodes with it) from this node's Node once the plugin listens on its socket and kubelet has registered it (the node's CSINode lists the driver), so that pods needing Cistern volumes are kept off the node until then. Only that taint, only this node (--node-id): deploy/csi's cistern-node-startup-taint policy admits nothing else. Needs API access (in-cluster, or --kubeconfig).")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig for --events, --peer-listen, --remove-startup-taint and the ServiceAccounts of datasets with roleFrom=serviceAccount; empty uses the in-cluster configuration.")
	flag.BoolVar(&o.showVersion, "version", false, "Print the version and exit.")
}

func bindDatasetFlags(cfg *datasource.Config, o *options) {
	flag.StringVar(&o.localSourceRoots, "local-source-roots", "", "Comma-separated node directories that file:// dataset sources may read; empty disables file:// sources.")
	flag.StringVar(&o.tenantEndpoints, "tenant-s3-endpoints", "", "Comma-separated S3 endpoints that inline volumes and VolumeManagers may name: host names, *.domain suffixes, CIDR blocks (AWS without an endpoint counts as s3.amazonaws.com). Empty refuses every tenant endpoint; \"*\" allows any; link-local and cloud metadata addresses are refused always.")
	flag.StringVar(&cfg.S3CABundleDir, "s3-ca-bundles", "", "Directory of CA bundles (PEM) that S3 datasets may name with the caBundle parameter to verify an https endpoint: a ConfigMap or Secret of the administrator's, mounted; empty: datasets may name none.")
	flag.StringVar(&cfg.STSEndpoint, "sts-endpoint", "", "STS that S3 datasets with credentials=webIdentity exchange the pod's ServiceAccount token at (AssumeRoleWithWebIdentity); empty: AWS STS of the dataset's region.")
	flag.StringVar(&cfg.WebIdentityAudience, "web-identity-audience", datasource.DefaultWebIdentityAudience, "Audience of the pod ServiceAccount tokens exchanged for web-identity credentials; the CSIDriver's tokenRequests must name it.")
	flag.StringVar(&o.webIdentityRoles, "web-identity-roles", "", "Comma-separated patterns (path.Match: * stops at /) of the role ARNs web-identity datasets may take, named by a volume's roleARN or a ServiceAccount's annotation; empty allows any, and the STS alone decides.")
	flag.BoolVar(&cfg.S3AllowPlainHTTP, "s3-allow-plain-http", false, "Allow plain http:// S3 endpoints other than loopback; without it they are refused.")
	flag.IntVar(&cfg.Concurrency, "staging-concurrency", 16, "Parallel reads from dataset sources, across all datasets staging on the node.")
	flag.Int64Var(&cfg.BandwidthBytesPerSec, "staging-bandwidth", 0, "Bytes per second that dataset staging on the node may use; 0 is unlimited.")
	flag.Float64Var(&cfg.LowWatermark, "cache-low-watermark", 0.10, "Fraction of a pool kept free: below it, unused cached datasets are evicted, least recently used first.")
	flag.Float64Var(&cfg.HighWatermark, "cache-high-watermark", 0.20, "Fraction of a pool that eviction frees up to.")
	flag.DurationVar(&cfg.ProgressInterval, "dataset-progress-interval", 5*time.Second, "How often a dataset being staged reports its progress to the StoragePool publisher (each report of a changed progress is one status write per staging pool).")
	flag.DurationVar(&cfg.AccessProofTTL, "dataset-access-ttl", datasource.DefaultAccessProofTTL, "How long a caller's full proof of access to a cached dataset (its own listing matching the cache) is remembered; within it a cache hit costs one pinned read. 0 lists on every hit.")
	flag.StringVar(&o.writableDatasets, "writable-datasets", "layer", "How a writable volume of a cached dataset gets its data: layer (an overlay on the cached tree, ready at once; a copy where overlayfs cannot be mounted) or copy (a full copy, as before).")
	flag.StringVar(&o.nfsServers, "nfs-servers", "", "Comma-separated NFS servers (host or host:port, as written in nfs:// URLs) that inline volumes may name; empty refuses nfs:// in inline volumes.")
	flag.StringVar(&o.unverifiable, "unverifiable-objects", string(datasource.RefuseUnverifiable), "What becomes of an S3 object nothing can check (a server that reports no checksum and no part size, with a multipart ETag that matches under no likely part size): refuse (its dataset's staging fails, a streaming read of it gets EIO) or serve (unchecked). Either is counted (cistern_dataset_unverifiable_objects_total) and, with --events, recorded as an Event on the node.")
	flag.UintVar(&o.nfsUID, "nfs-uid", datasource.NobodyID, "AUTH_UNIX uid the NFS client presents.")
	flag.UintVar(&o.nfsGID, "nfs-gid", datasource.NobodyID, "AUTH_UNIX gid the NFS client presents.")
}

func bindLimitFlags(lim *datasource.Limits) {
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
	flag.IntVar(&lim.ListingsPerSource, "max-concurrent-listings-per-source", def.ListingsPerSource, "Dataset listings under way against one source endpoint at once (however its URL is spelt: scheme, host and port); more wait.")
	flag.IntVar(&lim.ListingsPerNamespace, "max-concurrent-listings-per-namespace", 0, "Dataset listings under way for the callers of one namespace at once; more wait. 0 is a quarter of --max-concurrent-listings.")
	flag.Float64Var(&lim.ListingMinRate, "listing-min-rate", def.ListingMinRate, "Entries (keys, S3 common prefixes) a second a dataset listing must go through, in every --listing-rate-window; a slower one gives up its listing slot and fails (retried later).")
	flag.DurationVar(&lim.ListingRateWindow, "listing-rate-window", def.ListingRateWindow, "Window over which --listing-min-rate is measured: a listing that stalls loses its slot after at most this long.")
	flag.Int64Var(&lim.MaxGlobWork, "max-dataset-glob-work", def.MaxGlobWork, "Include/exclude matching one listing may do, in pattern bytes times key bytes; past it the dataset is refused.")
	flag.IntVar(&lim.MaxVersions, "max-dataset-versions", def.MaxVersions, "Ready versions of one dataset a pool keeps side by side, for callers whose listings of the source differ; past it the least recently used unused one is deleted (never one in use). Also the most stagings of one dataset under way at once on a pool.")
}

func bindPeerFlags(cfg *driver.PeerConfig, o *options) {
	flag.StringVar(&cfg.Listen, "peer-listen", "", "Address (host:port) of the peer port, which serves this node's S3 datasets to other node plugins (docs/datasets.md); empty: no peer fan-out. Needs API access (in-cluster, or --kubeconfig).")
	flag.StringVar(&o.peerAdvertise, "peer-advertise", "", "host:port at which other nodes reach the peer port (the pod IP and the port); published on this node's StoragePools.")
	flag.StringVar(&o.peerTokenFile, "peer-token-file", "/var/run/secrets/cistern-peer/token", "This node plugin's ServiceAccount token for the audience cistern-peer (a projected token kubelet keeps fresh).")
	flag.StringVar(&o.peerAccounts, "peer-service-accounts", "cistern-system/cistern-node", "Comma-separated namespace/name of the ServiceAccounts whose pod-bound tokens the peer port serves.")
	flag.Int64Var(&cfg.Server.BandwidthBytesPerSec, "peer-upload-bandwidth", 256<<20, "Bytes per second the peer port may send, across peers; 0 is unlimited.")
	flag.IntVar(&cfg.Server.MaxUploads, "peer-max-uploads", 8, "Requests for pieces the peer port answers at once (a batch of small entries counts as one); more wait briefly, then go to other peers or the source.")
	def := peer.DefaultReviewLimits
	flag.IntVar(&o.peerReviews.InFlight, "peer-max-token-reviews", def.InFlight, "TokenReviews of peers' tokens under way at once; requests with an unknown token beyond wait a second, then go to other peers or the source.")
	flag.IntVar(&o.peerReviews.PerAddressBurst, "peer-token-review-burst", def.PerAddressBurst, "TokenReviews one address may cause at once, charged before each review; then --peer-token-review-rate.")
	flag.Float64Var(&o.peerReviews.PerAddressRate, "peer-token-review-rate", def.PerAddressRate, "TokenReviews a second one address may cause after its burst; more are refused (429) without a review.")
}

// complete moves the parsed options into cfg.
func (o *options) complete(cfg *driver.Config) error {
	if o.inlinePools != "" {
		cfg.Inline.Pools = strings.Split(o.inlinePools, ",")
	}
	if o.localSourceRoots != "" {
		cfg.Datasets.LocalSourceRoots = strings.Split(o.localSourceRoots, ",")
	}
	allow, err := egress.ParseAllow(strings.Split(o.tenantEndpoints, ","))
	if err != nil {
		return fmt.Errorf("invalid --tenant-s3-endpoints: %w", err)
	}
	cfg.Datasets.TenantEndpoints = allow
	if cfg.Datasets.UnverifiableObjects, err = datasource.ParseUnverifiablePolicy(o.unverifiable); err != nil {
		return fmt.Errorf("invalid --unverifiable-objects: %w", err)
	}
	if o.nfsServers != "" {
		cfg.Datasets.NFSServers = strings.Split(o.nfsServers, ",")
	}
	uid, gid := uint32(o.nfsUID), uint32(o.nfsGID)
	cfg.Datasets.NFSUID, cfg.Datasets.NFSGID = &uid, &gid
	cfg.Writable.WriteBack.Uploader.NFSUID, cfg.Writable.WriteBack.Uploader.NFSGID = uid, gid
	if o.webIdentityRoles != "" {
		cfg.Datasets.WebIdentityRoles = strings.Split(o.webIdentityRoles, ",")
		for _, p := range cfg.Datasets.WebIdentityRoles {
			if _, err := path.Match(p, ""); err != nil || p == "" {
				return fmt.Errorf("invalid --web-identity-roles pattern %q", p)
			}
		}
	}
	switch o.writableDatasets {
	case "layer":
	case "copy":
		cfg.Writable.Copy = true
	default:
		return fmt.Errorf("invalid --writable-datasets %q: layer or copy", o.writableDatasets)
	}
	cfg.Mode = driver.Mode(o.mode)
	if o.removeStartupTaint && (cfg.NodeID == "" || cfg.Mode == driver.ModeController) {
		return fmt.Errorf("--remove-startup-taint needs --node-id and a mode that serves the node (all or node)")
	}
	cfg.DefaultVolumeSize = o.defaultSize
	return nil
}
