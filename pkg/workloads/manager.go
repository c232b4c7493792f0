// Package workloads assembles the workload-controller: one controller-runtime manager running the
// LeaderWorkerSet, NotebookValidationJob and VolumeManager reconcilers and their webhooks, with
// self-managed webhook certificates. Each piece lives in its own subpackage.
package workloads

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	workloadsv1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/securemetrics"
	"github.com/cistern-csi/cistern/pkg/workloads/lws"
	"github.com/cistern-csi/cistern/pkg/workloads/nodeloss"
	"github.com/cistern-csi/cistern/pkg/workloads/nodevolume"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook"
	"github.com/cistern-csi/cistern/pkg/workloads/placement"
	"github.com/cistern-csi/cistern/pkg/workloads/snapshotnode"
	"github.com/cistern-csi/cistern/pkg/workloads/volumemanager"
	"github.com/cistern-csi/cistern/pkg/workloads/webhookcert"
)

// Permissions of the process as a whole (each reconciler lists its own):
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// Authenticating and authorizing metrics scrapers (MetricsSecure):
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations,verbs=get;update,resourceNames=cistern-workload-controller
// The webhook's certificate Secret: created once (create cannot be limited to a name), then read
// and renewed by name only; no other Secret of the namespace is readable.
// +kubebuilder:rbac:groups="",namespace=cistern-system,resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",namespace=cistern-system,resources=secrets,verbs=get;update,resourceNames=cistern-workload-webhook-cert
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=cistern-system,resources=leases,verbs=create
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=cistern-system,resources=leases,verbs=get;update,resourceNames=workload-controller.cistern.dev

// Config is everything the workload-controller needs; cmd/workload-controller fills it from flags.
type Config struct {
	// RestConfig reaches the API server.
	RestConfig *rest.Config

	// MetricsAddr and ProbeAddr: "0" disables.
	MetricsAddr, ProbeAddr string
	// OneOfManyInProcess lets a process run this controller again after an earlier one stopped
	// (test suites): controller-runtime keeps every controller name it registered for the
	// process's life and refuses a second "leaderworkerset" otherwise.
	OneOfManyInProcess bool
	// MetricsSecure serves metrics over HTTPS to callers that authenticate with a token and may
	// GET /metrics (TokenReview, SubjectAccessReview), as kubelet's and kube-rbac-proxy's do.
	MetricsSecure bool
	// LeaderElection with its lease in LeaderElectionNamespace.
	LeaderElection          bool
	LeaderElectionNamespace string

	// DisableWebhooks runs the reconcilers only.
	DisableWebhooks bool
	// WebhookHost and WebhookPort are where the webhook server listens.
	WebhookHost string
	WebhookPort int
	// WebhookCertDir receives the serving certificate (tls.crt, tls.key), or holds it when
	// DisableWebhookCertProvisioning.
	WebhookCertDir string
	// DisableWebhookCertProvisioning serves the certificate someone else keeps in WebhookCertDir
	// (cert-manager's Secret, mounted; the server reloads it on change) and touches neither the
	// certificate Secret nor the webhook configurations' caBundle, so the controller needs no
	// permission on them.
	DisableWebhookCertProvisioning bool
	// WebhookSelfRegister registers URL-based configurations for https://WebhookHost:WebhookPort
	// (tests, make demo); otherwise the configurations reach the server through
	// WebhookServiceNamespace/WebhookServiceName and only their caBundle is managed.
	WebhookSelfRegister     bool
	WebhookServiceName      string
	WebhookServiceNamespace string
	// WebhookSecretName holds the CA and serving certificate, in WebhookServiceNamespace.
	WebhookSecretName string
	// CertCheckInterval is how often certificates are checked for renewal.
	CertCheckInterval time.Duration

	// DisablePodPlacement leaves out the pod placement webhook (pods preferring the nodes that
	// hold their datasets).
	DisablePodPlacement bool

	// SnapshotContents runs the controller that labels the driver's hand-made
	// VolumeSnapshotContents with their snapshot's node, for that node's csi-snapshotter
	// (pkg/workloads/snapshotnode). It needs the VolumeSnapshot CRDs and the RBAC of
	// deploy/csi/snapshots, which turns it on.
	SnapshotContents bool

	// GroupWorkers is how many groups are worked on at once (worker StatefulSets, restarts).
	GroupWorkers int

	// NodeLoss says when LeaderWorkerSet claims pinned to a lost node are released
	// (pkg/workloads/nodeloss).
	NodeLoss NodeLossConfig

	// LeaderWorkerSetAPI is the group/version LeaderWorkerSet is served under:
	// workloads.cistern.dev/v1alpha1 (empty), or leaderworkerset.x-k8s.io/v1 to run as the drop-in
	// LeaderWorkerSet controller of the cluster (deploy/csi/lws-upstream), which refuses to start
	// when another controller serves that group (checkSoleLeaderWorkerSetController).
	LeaderWorkerSetAPI schema.GroupVersion

	// GitImage runs the git-clone init container of notebook jobs.
	GitImage string
	// CompareImage runs the golden-notebook comparison of notebook jobs: the workload-controller's
	// own image (its compare-notebook subcommand).
	CompareImage string
	// VolumeManager settings.
	VolumeManager volumemanager.Config
}

// NodeLossConfig says what counts as a lost node.
type NodeLossConfig struct {
	// Enabled releases the claims; off, groups pinned to a lost node wait for it.
	Enabled bool
	// GracePeriod is how long a node may be not Ready before it counts as lost; 0 counts only a
	// deleted Node.
	GracePeriod time.Duration
}

// Scheme holds every type the controller reads or writes, with LeaderWorkerSet under
// workloads.cistern.dev. The VolumeSnapshot types are known whether or not the cluster serves
// them: only reading them needs the CRDs.
func Scheme() *runtime.Scheme {
	return SchemeFor(workloadsv1alpha1.GroupVersion)
}

// SchemeFor is Scheme with LeaderWorkerSet served under lwsAPI.
func SchemeFor(lwsAPI schema.GroupVersion) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, datav1alpha1.AddToScheme, spapi.AddToScheme, snapv1.AddToScheme,
		func(s *runtime.Scheme) error { return workloadsv1alpha1.AddToSchemeWithLeaderWorkerSetAt(s, lwsAPI) },
	} {
		if err := add(s); err != nil {
			panic(err) // only on conflicting registrations: a programming error
		}
	}
	return s
}

func (c *Config) lwsAPI() schema.GroupVersion {
	if c.LeaderWorkerSetAPI.Empty() {
		return workloadsv1alpha1.GroupVersion
	}
	return c.LeaderWorkerSetAPI
}

func (c *Config) driverName() string {
	if c.VolumeManager.DriverName == "" {
		return consts.DriverName
	}
	return c.VolumeManager.DriverName
}

func (c *Config) validate() error {
	var errs []error
	if c.RestConfig == nil {
		errs = append(errs, errors.New("no API server configuration"))
	}
	if c.DisableWebhooks {
		return errors.Join(errs...)
	}
	if c.WebhookPort <= 0 || c.WebhookPort > 65535 {
		errs = append(errs, fmt.Errorf("webhook port %d out of range", c.WebhookPort))
	}
	if c.WebhookCertDir == "" {
		errs = append(errs, errors.New("webhook certificate directory not set"))
	}
	if c.DisableWebhookCertProvisioning && c.WebhookSelfRegister {
		errs = append(errs, errors.New("--webhook-self-register needs --webhook-cert-provisioning: it writes the CA into the configurations it registers"))
	}
	if !c.DisableWebhookCertProvisioning && (c.WebhookServiceNamespace == "" || c.WebhookSecretName == "") {
		errs = append(errs, errors.New("webhook namespace and certificate Secret name are required"))
	}
	if c.WebhookSelfRegister && c.WebhookHost == "" {
		errs = append(errs, errors.New("--webhook-self-register needs --webhook-host (the address the API server dials)"))
	}
	if !c.WebhookSelfRegister && c.WebhookServiceName == "" {
		errs = append(errs, errors.New("webhook Service name is required without --webhook-self-register"))
	}
	if c.GitImage == "" {
		errs = append(errs, errors.New("git image not set"))
	}
	if c.CompareImage == "" {
		errs = append(errs, errors.New("compare image not set"))
	}
	return errors.Join(errs...)
}

// metricsOptions serves metrics in the clear only when not MetricsSecure (tests, the demo).
func metricsOptions(cfg Config) metricsserver.Options {
	opts := metricsserver.Options{BindAddress: cfg.MetricsAddr}
	if cfg.MetricsSecure {
		opts.SecureServing = true
		opts.FilterProvider = securemetrics.WithAuthenticationAndAuthorization
	}
	return opts
}

// Controller is the workload-controller: its reconcilers and webhooks in one manager.
type Controller struct {
	cfg Config
}

// New checks cfg and returns the controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg}, nil
}

// Run runs the controller until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	cfg, restConfig := c.cfg, c.cfg.RestConfig
	logger := klog.FromContext(ctx)
	ctrl.SetLogger(logger)
	lwsAPI := cfg.lwsAPI()
	scheme := SchemeFor(lwsAPI)
	if lwsAPI != workloadsv1alpha1.GroupVersion {
		direct, err := client.New(restConfig, client.Options{Scheme: scheme})
		if err != nil {
			return err
		}
		peers, err := checkSoleLeaderWorkerSetController(ctx, direct, lwsAPI, webhookcert.ConfigurationName)
		if err != nil {
			return fmt.Errorf("refusing to serve LeaderWorkerSet as %s: %w", lwsAPI, err)
		}
		for _, p := range peers {
			logger.Info("LeaderWorkerSet admission webhook of a peer, not a controller", "webhook", p)
		}
		logger.Info("serving LeaderWorkerSet as the cluster's LeaderWorkerSet controller", "api", lwsAPI.String())
	}

	byObject := lws.CacheByObject()
	if cfg.SnapshotContents {
		maps.Copy(byObject, snapshotnode.CacheByObject())
	}
	opts := ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsOptions(cfg),
		HealthProbeBindAddress:  cfg.ProbeAddr,
		LeaderElection:          cfg.LeaderElection,
		LeaderElectionID:        "workload-controller.cistern.dev",
		LeaderElectionNamespace: cfg.LeaderElectionNamespace,
		Logger:                  logger,
		Cache:                   cache.Options{ByObject: byObject},
	}
	if cfg.OneOfManyInProcess {
		opts.Controller.SkipNameValidation = ptr.To(true)
	}
	var certs *webhookcert.CertProvisioner
	if !cfg.DisableWebhooks && !cfg.DisableWebhookCertProvisioning {
		var err error
		if certs, err = c.certProvisioner(scheme, lwsAPI); err != nil {
			return err
		}
		// The certificate must exist before the server starts, and the configurations must point
		// at it before anything is admitted.
		if err := certs.Ensure(ctx); err != nil {
			return err
		}
	}
	if !cfg.DisableWebhooks {
		opts.WebhookServer = webhookServer(cfg)
	}

	mgr, err := ctrl.NewManager(restConfig, opts)
	if err != nil {
		return err
	}
	if err := c.setupReconcilers(mgr); err != nil {
		return err
	}
	if !cfg.DisableWebhooks {
		if err := c.setupWebhooks(mgr, scheme, certs); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	logger.Info("starting the manager", "webhooks", !cfg.DisableWebhooks, "certProvisioning", certs != nil,
		"selfRegister", cfg.WebhookSelfRegister, "snapshotContents", cfg.SnapshotContents)
	return mgr.Start(ctx)
}

// webhookServer serves the webhooks with the tls.crt and tls.key of WebhookCertDir, which
// controller-runtime's certificate watcher reloads when they change: the provisioner's files, or
// a mounted Secret that cert-manager renews.
func webhookServer(cfg Config) webhook.Server {
	return webhook.NewServer(webhook.Options{Host: cfg.WebhookHost, Port: cfg.WebhookPort, CertDir: cfg.WebhookCertDir,
		CertName: webhookcert.CertKey, KeyName: webhookcert.KeyKey})
}

// certProvisioner is the webhooks' certificate provisioner: the serving certificate for the
// Service's names (or the self-registered host) and the webhook configurations pointing at it.
func (c *Controller) certProvisioner(scheme *runtime.Scheme, lwsAPI schema.GroupVersion) (*webhookcert.CertProvisioner, error) {
	cfg := c.cfg
	direct, err := client.New(cfg.RestConfig, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	certs := &webhookcert.CertProvisioner{
		Client: direct, Namespace: cfg.WebhookServiceNamespace, SecretName: cfg.WebhookSecretName,
		CertDir: cfg.WebhookCertDir, SelfRegister: cfg.WebhookSelfRegister, Interval: cfg.CertCheckInterval,
		LeaderWorkerSetAPI: lwsAPI,
	}
	if !cfg.DisablePodPlacement {
		certs.PodPlacement = &webhookcert.PodPlacement{InstallNamespace: cfg.WebhookServiceNamespace, DriverName: cfg.driverName()}
	}
	if cfg.WebhookSelfRegister {
		certs.Hosts = []string{cfg.WebhookHost}
		certs.ClientConfig = webhookcert.URLClientConfig(net.JoinHostPort(cfg.WebhookHost, strconv.Itoa(cfg.WebhookPort)))
	} else {
		svc := cfg.WebhookServiceName + "." + cfg.WebhookServiceNamespace + ".svc"
		certs.Hosts = []string{svc, svc + ".cluster.local"}
	}
	return certs, nil
}

// setupReconcilers adds every controller to mgr.
func (c *Controller) setupReconcilers(mgr ctrl.Manager) error {
	cfg := c.cfg
	if err := (&lws.LeaderWorkerSetReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("leaderworkerset")}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&lws.PodReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("leaderworkerset-pod")}).SetupWithManager(mgr, cfg.GroupWorkers); err != nil {
		return err
	}
	if err := (&notebook.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Images: notebook.Images{Git: cfg.GitImage, Compare: cfg.CompareImage}}).SetupWithManager(mgr); err != nil {
		return err
	}
	vmCfg := cfg.VolumeManager
	if vmCfg.StagerImage == "" {
		vmCfg.StagerImage = cfg.CompareImage // the controller's own image
	}
	if err := (&volumemanager.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorder("volumemanager"), Config: vmCfg}).SetupWithManager(mgr); err != nil {
		return err
	}
	if cfg.NodeLoss.Enabled {
		if err := (&nodeloss.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("nodeloss"),
			DriverName: cfg.driverName(), GracePeriod: cfg.NodeLoss.GracePeriod}).SetupWithManager(mgr); err != nil {
			return err
		}
	}
	if cfg.SnapshotContents {
		if err := (&snapshotnode.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("snapshotnode"),
			DriverName: cfg.driverName()}).SetupWithManager(mgr); err != nil {
			return err
		}
	}
	return nil
}

// setupWebhooks registers the admission webhooks and the certificate provisioner (nil when the
// certificate is provisioned by someone else) with mgr.
func (c *Controller) setupWebhooks(mgr ctrl.Manager, scheme *runtime.Scheme, certs *webhookcert.CertProvisioner) error {
	if err := lws.RegisterWebhooks(mgr.GetWebhookServer(), scheme); err != nil {
		return err
	}
	notebook.RegisterWebhooks(mgr.GetWebhookServer())
	nodevolume.Register(mgr.GetWebhookServer(), scheme, mgr.GetAPIReader(), c.cfg.driverName())
	if !c.cfg.DisablePodPlacement {
		placement.Register(mgr.GetWebhookServer(), scheme, mgr.GetAPIReader(), c.cfg.driverName())
	}
	if certs != nil {
		if err := mgr.Add(certs); err != nil {
			return err
		}
	}
	return mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker())
}
