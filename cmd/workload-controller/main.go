// Command workload-controller runs the LeaderWorkerSet, NotebookValidationJob and VolumeManager
// controllers and their admission webhooks. See docs/workloads.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook/compare"
	"github.com/cistern-csi/cistern/pkg/workloads/volumemanager"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// The validation pods of notebook jobs with a golden notebook run this binary to compare.
	if len(os.Args) > 1 && os.Args[1] == compare.Command {
		os.Exit(compare.Main(os.Args[2:], os.Stdout, os.Stderr))
	}
	klog.InitFlags(nil)
	var cfg workloads.Config
	var kubeconfig, localRoots, lwsAPI string
	var qps float64
	var burst int
	// controller-runtime registers --kubeconfig on the default FlagSet when it is linked in;
	// defining it again panics.
	if flag.Lookup("kubeconfig") == nil {
		flag.String("kubeconfig", "", "kubeconfig file; in-cluster configuration when empty")
	}
	flag.Float64Var(&qps, "kube-api-qps", 50, "steady queries per second to the API server")
	flag.IntVar(&burst, "kube-api-burst", 100, "burst of queries to the API server")
	flag.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":8443", "metrics address; 0 disables")
	flag.BoolVar(&cfg.MetricsSecure, "metrics-secure", true, "serve metrics over HTTPS to authenticated callers allowed to GET /metrics; false serves them in the clear")
	flag.StringVar(&cfg.ProbeAddr, "health-probe-bind-address", ":8081", "healthz/readyz address; 0 disables")
	flag.BoolVar(&cfg.LeaderElection, "leader-elect", false, "elect a leader among replicas")
	flag.StringVar(&cfg.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader lease")
	flag.BoolVar(&cfg.DisableWebhooks, "disable-webhooks", false, "run without admission webhooks")
	flag.StringVar(&cfg.WebhookHost, "webhook-host", "", "address the webhook server listens on (and, with --webhook-self-register, the address the API server dials)")
	flag.IntVar(&cfg.WebhookPort, "webhook-port", 9443, "webhook server port")
	flag.StringVar(&cfg.WebhookCertDir, "webhook-cert-dir", os.TempDir()+"/cistern-workload-webhook", "directory for the serving certificate")
	flag.BoolVar(&cfg.WebhookSelfRegister, "webhook-self-register", false, "register URL-based webhook configurations for https://<webhook-host>:<webhook-port> (tests, demo)")
	flag.StringVar(&cfg.WebhookServiceName, "webhook-service-name", "cistern-workload-webhook", "Service in front of the webhook server")
	flag.StringVar(&cfg.WebhookServiceNamespace, "webhook-namespace", envOr("POD_NAMESPACE", "cistern-system"), "namespace of the webhook Service and certificate Secret")
	flag.StringVar(&cfg.WebhookSecretName, "webhook-secret-name", "cistern-workload-webhook-cert", "Secret holding the webhook CA and certificate")
	flag.DurationVar(&cfg.CertCheckInterval, "webhook-cert-check-interval", 0, "how often to check certificates for renewal (default 1h)")
	podPlacement := flag.Bool("pod-placement", true, "serve the pod placement webhook: pods whose claims or inline volumes name a Cistern dataset prefer the nodes that hold it (docs/datasets.md)")
	flag.BoolVar(&cfg.SnapshotContents, "snapshot-contents", false,
		"label the driver's hand-made VolumeSnapshotContents with the node their snapshot handle names, so that node's csi-snapshotter takes them; "+
			"needs the VolumeSnapshot CRDs (deploy/csi/snapshots turns it on)")
	flag.IntVar(&cfg.GroupWorkers, "group-workers", 8, "LeaderWorkerSet groups worked on at once")
	flag.BoolVar(&cfg.NodeLoss.Enabled, "release-claims-on-node-loss", true,
		"delete the claims of LeaderWorkerSet groups bound to volumes pinned to a lost node, so the groups start again elsewhere (docs/workloads.md, Node loss)")
	flag.DurationVar(&cfg.NodeLoss.GracePeriod, "node-loss-grace-period", 0,
		"how long a node may be not Ready before it counts as lost; 0 counts only a deleted Node")
	flag.StringVar(&lwsAPI, "leaderworkerset-api", "workloads.cistern.dev/v1alpha1",
		"group/version LeaderWorkerSet is served under; leaderworkerset.x-k8s.io/v1 runs this as the cluster's LeaderWorkerSet controller "+
			"(install deploy/csi/lws-upstream; refused when another controller serves that group)")
	flag.StringVar(&cfg.GitImage, "git-image", "alpine/git:2.49.1", "image of the notebook jobs' git-clone container (needs sh and git)")
	flag.StringVar(&cfg.CompareImage, "compare-image", envOr("COMPARE_IMAGE", "cistern/workload-controller:latest"),
		"image of the notebook jobs' golden-notebook comparison: this controller's own image (default $COMPARE_IMAGE)")
	flag.StringVar(&cfg.VolumeManager.StagerImage, "stager-image", os.Getenv("STAGER_IMAGE"),
		"image of the VolumeManager stager pods, run with --version once their volume is mounted (default $STAGER_IMAGE, else --compare-image: this controller's own image)")
	flag.StringVar(&cfg.VolumeManager.DriverName, "driver-name", consts.DriverName, "CSI driver of VolumeManager volumes")
	flag.StringVar(&localRoots, "local-source-roots", "", "comma-separated node directories a VolumeManager Local source may name (must match the driver's)")
	var nfsServers string
	flag.StringVar(&nfsServers, "nfs-servers", "", "comma-separated NFS servers (host or host:port) a VolumeManager NFS source may name (must match the driver's); empty refuses NFS sources")
	maxCapacity := flag.String("volumemanager-max-capacity", volumemanager.DefaultMaxCapacity.String(),
		"largest capacity a VolumeManager volume may ask for: with a writer access mode each of its pods gets a writable copy of this size on its node")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	kubeconfig = flag.Lookup("kubeconfig").Value.String()
	cfg.DisablePodPlacement = !*podPlacement
	var err error
	if cfg.LeaderWorkerSetAPI, err = workloads.ParseLeaderWorkerSetAPI(lwsAPI); err != nil {
		klog.Background().Error(err, "--leaderworkerset-api")
		os.Exit(2)
	}
	if localRoots != "" {
		cfg.VolumeManager.LocalSourceRoots = strings.Split(localRoots, ",")
	}
	if nfsServers != "" {
		cfg.VolumeManager.NFSServers = strings.Split(nfsServers, ",")
	}
	if cfg.VolumeManager.MaxCapacity, err = resource.ParseQuantity(*maxCapacity); err != nil || cfg.VolumeManager.MaxCapacity.Sign() <= 0 {
		klog.Background().Error(err, "--volumemanager-max-capacity must be a positive quantity", "value", *maxCapacity)
		os.Exit(2)
	}
	logger := klog.Background()

	restConfig, err := loadConfig(kubeconfig)
	if err != nil {
		logger.Error(err, "loading kubeconfig")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	restConfig.QPS, restConfig.Burst = float32(qps), burst
	restConfig.UserAgent = "cistern-workload-controller/" + version
	cfg.RestConfig = restConfig
	c, err := workloads.New(cfg)
	if err != nil {
		logger.Error(err, "Invalid configuration")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Starting workload-controller", "version", version)
	if err := c.Run(ctx); err != nil {
		logger.Error(err, "workload-controller failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

func loadConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
