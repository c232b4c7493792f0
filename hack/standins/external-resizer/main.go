// Command csi-resizer is a stand-in for kubernetes-csi/external-resizer (see hack/standins): it
// asks the CSI driver over --csi-address for its name and its EXPAND_VOLUME controller
// capability, then expands the volumes of the driver's claims whose request grew
// (hack/standins/resizer): ControllerExpandVolume, the PersistentVolume's capacity, the claim's
// status and Events; kubelet's NodeExpandVolume finishes a claim that needs it. It takes
// upstream's flags, and --node-deployment (with NODE_NAME) as external-resizer's pull request
// #573 proposes it: in the node pod of a driver of node-local volumes, each node expands only
// the volumes whose node affinity matches it, without leader election.
//
// Not implemented: VolumeAttributesClass modifications, CSI migration, Secrets of
// csi.storage.k8s.io/controller-expand-secret-*, the in-use tracking of offline-only drivers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/kubernetes-csi/csi-lib-utils/leaderelection"
	csirpc "github.com/kubernetes-csi/csi-lib-utils/rpc"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/hack/standins/resizer"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "standin"

type options struct {
	kubeconfig, master, csiAddress, httpEndpoint string
	timeout, resync, retryStart, retryMax        time.Duration
	workers                                      int
	qps                                          float64
	burst                                        int
	nodeDeployment                               bool
	leaderElection                               bool
	leNamespace                                  string
	leLease, leRenew, leRetry                    time.Duration
}

func main() {
	var o options
	fs := flag.CommandLine
	klog.InitFlags(fs)
	showVersion := bindFlags(fs, &o)
	flag.Parse()
	if *showVersion {
		fmt.Println(os.Args[0], version)
		return
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, o); err != nil {
		klog.ErrorS(err, "csi-resizer failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

// bindFlags defines upstream's flags (and --node-deployment) on fs, into o; it returns --version.
func bindFlags(fs *flag.FlagSet, o *options) *bool {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path of a kubeconfig; empty: in-cluster.")
	fs.StringVar(&o.master, "master", "", "API server URL, overriding the kubeconfig's.")
	fs.StringVar(&o.csiAddress, "csi-address", "/run/csi/socket", "Path of the CSI driver socket.")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "Timeout of each CSI call.")
	fs.DurationVar(&o.resync, "resync-period", 10*time.Minute, "Resync period of the informers.")
	fs.IntVar(&o.workers, "workers", 10, "Claims expanded at once.")
	fs.DurationVar(&o.retryStart, "retry-interval-start", time.Second, "First retry interval of a failed expansion; it doubles with each failure.")
	fs.DurationVar(&o.retryMax, "retry-interval-max", 5*time.Minute, "Longest retry interval of a failed expansion.")
	fs.Float64Var(&o.qps, "kube-api-qps", 5, "QPS of the API server client.")
	fs.IntVar(&o.burst, "kube-api-burst", 10, "Burst of the API server client.")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "Address of /healthz (and the leader election check), e.g. :8080; empty: none.")
	fs.BoolVar(&o.nodeDeployment, "node-deployment", false, "Expand only the volumes whose node affinity matches the node NODE_NAME names.")
	fs.BoolVar(&o.leaderElection, "leader-election", false, "Enable leader election.")
	fs.StringVar(&o.leNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease; default: the pod's.")
	fs.DurationVar(&o.leLease, "leader-election-lease-duration", 15*time.Second, "Leader election lease duration.")
	fs.DurationVar(&o.leRenew, "leader-election-renew-deadline", 10*time.Second, "Leader election renew deadline.")
	fs.DurationVar(&o.leRetry, "leader-election-retry-period", 5*time.Second, "Leader election retry period.")
	fs.Bool("handle-volume-inuse-error", true, "Accepted for upstream's manifests; this stand-in does not track in-use claims.")
	return fs.Bool("version", false, "Print the version and exit.")
}

func run(ctx context.Context, o options) error {
	node := ""
	if o.nodeDeployment {
		if o.leaderElection {
			return errors.New("--node-deployment and --leader-election exclude each other")
		}
		if node = os.Getenv("NODE_NAME"); node == "" {
			return errors.New("--node-deployment needs NODE_NAME")
		}
	}
	config, err := restConfig(o)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	conn, err := connection.Connect(ctx, o.csiAddress, nil, connection.WithTimeout(0))
	if err != nil {
		return fmt.Errorf("connecting to the CSI driver at %s: %w", o.csiAddress, err)
	}
	defer conn.Close()
	driver, err := checkDriver(ctx, conn, o.timeout)
	if err != nil {
		return err
	}
	klog.InfoS("CSI driver found", "driver", driver, "csiAddress", o.csiAddress, "node", node)
	ctrl, err := resizer.New(resizer.Config{
		Client: client, DriverName: driver, Expander: csi.NewControllerClient(conn),
		Timeout: o.timeout, NodeName: node, ResyncPeriod: o.resync, RetryStart: o.retryStart, RetryMax: o.retryMax,
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	runCtrl := func(ctx context.Context) {
		if err := ctrl.Run(ctx, o.workers); err != nil && !errors.Is(err, context.Canceled) {
			klog.ErrorS(err, "resizer stopped")
		}
	}
	var le interface{ Run() error }
	if o.leaderElection {
		l := leaderelection.NewLeaderElection(client, "external-resizer-"+sanitize(driver), runCtrl)
		if o.leNamespace != "" {
			l.WithNamespace(o.leNamespace)
		}
		l.WithLeaseDuration(o.leLease)
		l.WithRenewDeadline(o.leRenew)
		l.WithRetryPeriod(o.leRetry)
		l.WithContext(ctx)
		if o.httpEndpoint != "" {
			l.PrepareHealthCheck(mux, leaderelection.DefaultHealthCheckTimeout)
		}
		le = l
	}
	if o.httpEndpoint != "" {
		hs := &http.Server{Addr: o.httpEndpoint, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "health server failed")
			}
		}()
		defer hs.Close()
	}
	if le != nil {
		return le.Run()
	}
	runCtrl(ctx)
	return nil
}

func restConfig(o options) (*rest.Config, error) {
	var config *rest.Config
	var err error
	if o.kubeconfig != "" || o.master != "" {
		config, err = clientcmd.BuildConfigFromFlags(o.master, o.kubeconfig)
	} else {
		config, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API server configuration: %w", err)
	}
	config.QPS, config.Burst = float32(o.qps), o.burst
	config.UserAgent = "csi-resizer-standin/" + version
	return config, nil
}

// checkDriver returns the driver's name once it says it has a controller service that expands
// volumes, as external-resizer requires before it starts.
func checkDriver(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) (string, error) {
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	name, err := csirpc.GetDriverName(callCtx, conn)
	if err != nil {
		return "", fmt.Errorf("GetPluginInfo: %w", err)
	}
	caps, err := csirpc.GetControllerCapabilities(callCtx, conn)
	if err != nil {
		return "", fmt.Errorf("ControllerGetCapabilities: %w", err)
	}
	if !caps[csi.ControllerServiceCapability_RPC_EXPAND_VOLUME] {
		return "", fmt.Errorf("driver %s has no EXPAND_VOLUME controller capability", name)
	}
	return name, nil
}

// sanitize makes a driver name a valid Lease name, as upstream's lock names are.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b)
}
