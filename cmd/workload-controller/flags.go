package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/pkg/workloads/volumemanager"
)

// options are the flags that are not workloads.Config fields as they stand.
type options struct {
	lwsAPI, localRoots, nfsServers, maxCapacity string
	qps                                         float64
	burst                                       int
	podPlacement, certProvisioning, showVersion bool
}

// bindFlags registers every flag: the controller's straight into cfg, the others into o.
func bindFlags(cfg *workloads.Config, o *options) {
	// controller-runtime registers --kubeconfig on the default FlagSet when it is linked in;
	// defining it again panics.
	if flag.Lookup("kubeconfig") == nil {
		flag.String("kubeconfig", "", "kubeconfig file; in-cluster configuration when empty")
	}
	flag.Float64Var(&o.qps, "kube-api-qps", 50, "steady queries per second to the API server")
	flag.IntVar(&o.burst, "kube-api-burst", 100, "burst of queries to the API server")
	flag.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":8443", "metrics address; 0 disables")
	flag.BoolVar(&cfg.MetricsSecure, "metrics-secure", true, "serve metrics over HTTPS to authenticated callers allowed to GET /metrics; false serves them in the clear")
	flag.StringVar(&cfg.ProbeAddr, "health-probe-bind-address", ":8081", "healthz/readyz address; 0 disables")
	flag.BoolVar(&cfg.LeaderElection, "leader-elect", false, "elect a leader among replicas")
	flag.StringVar(&cfg.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader lease")
	flag.BoolVar(&cfg.DisableWebhooks, "disable-webhooks", false, "run without admission webhooks")
	flag.StringVar(&cfg.WebhookHost, "webhook-host", "", "address the webhook server listens on (and, with --webhook-self-register, the address the API server dials)")
	flag.IntVar(&cfg.WebhookPort, "webhook-port", 9443, "webhook server port")
	flag.StringVar(&cfg.WebhookCertDir, "webhook-cert-dir", os.TempDir()+"/cistern-workload-webhook", "directory for the serving certificate (tls.crt, tls.key)")
	flag.BoolVar(&o.certProvisioning, "webhook-cert-provisioning", true,
		"issue and renew the webhook certificate (--webhook-secret-name) and inject its CA into the webhook configurations; "+
			"false serves the certificate another issuer keeps in --webhook-cert-dir (cert-manager's Secret, mounted) and writes neither")
	flag.BoolVar(&cfg.WebhookSelfRegister, "webhook-self-register", false, "register URL-based webhook configurations for https://<webhook-host>:<webhook-port> (tests, demo)")
	flag.StringVar(&cfg.WebhookServiceName, "webhook-service-name", "cistern-workload-webhook", "Service in front of the webhook server")
	flag.StringVar(&cfg.WebhookServiceNamespace, "webhook-namespace", envOr("POD_NAMESPACE", "cistern-system"), "namespace of the webhook Service and certificate Secret")
	flag.StringVar(&cfg.WebhookSecretName, "webhook-secret-name", "cistern-workload-webhook-cert", "Secret holding the webhook CA and certificate")
	flag.DurationVar(&cfg.CertCheckInterval, "webhook-cert-check-interval", 0, "how often to check certificates for renewal (default 1h)")
	flag.BoolVar(&o.podPlacement, "pod-placement", true, "serve the pod placement webhook: pods whose claims or inline volumes name a Cistern dataset prefer the nodes that hold it (docs/datasets.md)")
	flag.BoolVar(&cfg.SnapshotContents, "snapshot-contents", false,
		"label the driver's hand-made VolumeSnapshotContents with the node their snapshot handle names, so that node's csi-snapshotter takes them; "+
			"needs the VolumeSnapshot CRDs (deploy/csi/snapshots turns it on)")
	flag.IntVar(&cfg.GroupWorkers, "group-workers", 8, "LeaderWorkerSet groups worked on at once")
	flag.BoolVar(&cfg.NodeLoss.Enabled, "release-claims-on-node-loss", true,
		"delete the claims of LeaderWorkerSet groups bound to volumes pinned to a lost node, so the groups start again elsewhere (docs/workloads.md, Node loss)")
	flag.DurationVar(&cfg.NodeLoss.GracePeriod, "node-loss-grace-period", 0,
		"how long a node may be not Ready before it counts as lost; 0 counts only a deleted Node")
	flag.StringVar(&o.lwsAPI, "leaderworkerset-api", "workloads.cistern.dev/v1alpha1",
		"group/version LeaderWorkerSet is served under; leaderworkerset.x-k8s.io/v1 runs this as the cluster's LeaderWorkerSet controller "+
			"(install deploy/csi/lws-upstream; refused when another controller serves that group)")
	flag.StringVar(&cfg.GitImage, "git-image", "alpine/git:2.49.1", "image of the notebook jobs' git-clone container (needs sh and git)")
	flag.StringVar(&cfg.CompareImage, "compare-image", envOr("COMPARE_IMAGE", "cistern/workload-controller:latest"),
		"image of the notebook jobs' golden-notebook comparison: this controller's own image (default $COMPARE_IMAGE)")
	flag.StringVar(&cfg.VolumeManager.StagerImage, "stager-image", os.Getenv("STAGER_IMAGE"),
		"image of the VolumeManager stager pods, run with --version once their volume is mounted (default $STAGER_IMAGE, else --compare-image: this controller's own image)")
	flag.StringVar(&cfg.VolumeManager.DriverName, "driver-name", consts.DriverName, "CSI driver of VolumeManager volumes")
	flag.StringVar(&o.localRoots, "local-source-roots", "", "comma-separated node directories a VolumeManager Local source may name (must match the driver's)")
	flag.StringVar(&o.nfsServers, "nfs-servers", "", "comma-separated NFS servers (host or host:port) a VolumeManager NFS source may name (must match the driver's); empty refuses NFS sources")
	flag.StringVar(&o.maxCapacity, "volumemanager-max-capacity", volumemanager.DefaultMaxCapacity.String(),
		"largest capacity a VolumeManager volume may ask for: with a writer access mode each of its pods gets a writable copy of this size on its node")
	flag.BoolVar(&cfg.VolumeManager.AllowControlPlane, "volumemanager-allow-control-plane", false,
		"let VolumeManagers whose tolerations allow it place stager pods and cached data on control-plane nodes "+
			"(labelled or tainted node-role.kubernetes.io/control-plane or master); off: those nodes are never chosen")
	flag.BoolVar(&o.showVersion, "version", false, "print the version and exit")
}

// complete moves the parsed options into cfg; its errors name the flag.
func (o *options) complete(cfg *workloads.Config) error {
	cfg.DisablePodPlacement = !o.podPlacement
	cfg.DisableWebhookCertProvisioning = !o.certProvisioning
	var err error
	if cfg.LeaderWorkerSetAPI, err = workloads.ParseLeaderWorkerSetAPI(o.lwsAPI); err != nil {
		return fmt.Errorf("--leaderworkerset-api: %w", err)
	}
	if o.localRoots != "" {
		cfg.VolumeManager.LocalSourceRoots = strings.Split(o.localRoots, ",")
	}
	if o.nfsServers != "" {
		cfg.VolumeManager.NFSServers = strings.Split(o.nfsServers, ",")
	}
	if cfg.VolumeManager.MaxCapacity, err = resource.ParseQuantity(o.maxCapacity); err != nil || cfg.VolumeManager.MaxCapacity.Sign() <= 0 {
		return fmt.Errorf("--volumemanager-max-capacity must be a positive quantity, not %q", o.maxCapacity)
	}
	return nil
}
