// Command csi-driver is the Cistern CSI plugin: Identity, Controller and Node services over the
// node's storage pools, plus the StoragePoolController service, on one unix socket.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/driver"
	"github.com/cistern-csi/cistern/pkg/logflags"
	"github.com/cistern-csi/cistern/pkg/nodeevents"
	"github.com/cistern-csi/cistern/pkg/outputevents"
	"github.com/cistern-csi/cistern/pkg/peerdirectory"
	"github.com/cistern-csi/cistern/pkg/poolpublisher"
	"github.com/cistern-csi/cistern/pkg/sarole"
	"github.com/cistern-csi/cistern/pkg/securemetrics"
	"github.com/cistern-csi/cistern/pkg/startuptaint"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if run, ok := subcommands[firstArg()]; ok {
		run(os.Args[2:])
		return
	}
	cfg := driver.Config{VendorVersion: version}
	var o options
	logCfg := logflags.Register(flag.CommandLine)
	bindFlags(&cfg, &o)
	flag.Parse()
	if o.showVersion {
		fmt.Println(version)
		return
	}
	if err := logflags.Apply(logCfg); err != nil {
		exit(err, "Invalid logging flags")
	}
	if err := o.complete(&cfg); err != nil {
		exit(err, "Invalid flags")
	}
	if o.events {
		rec, err := eventRecorder(o.kubeconfig, cfg.NodeID)
		if err != nil {
			exit(err, "Cannot record Events")
		}
		defer rec.Stop()
		cfg.Datasets.OnEvict = rec.Evicted
		cfg.Datasets.OnUnverifiable = rec.Unverifiable
		cfg.Writable.OnCopy = rec.WritableCopied
		cfg.Streaming.OnFallback = rec.StreamingStaged
		cfg.Streaming.OnRefused = rec.StreamingRefused
		outputs, err := outputEvents(o.kubeconfig, cfg.NodeID)
		if err != nil {
			exit(err, "Cannot record Events")
		}
		defer outputs.Stop()
		cfg.Writable.WriteBack.OnEvent = outputs.Record
		cfg.Staging.OnEvent = outputs.Record
	}
	if cfg.Mode != driver.ModeController {
		serviceAccountRoles(&cfg, o.kubeconfig)
	}
	var inventory *peerdirectory.Inventory
	if cfg.Peers.Listen != "" {
		var err error
		if inventory, err = setupPeers(&cfg, &o); err != nil {
			exit(err, "Cannot serve peers")
		}
	}
	d, err := driver.New(cfg)
	if err != nil {
		exit(err, "Cannot start the driver")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.httpEndpoint != "" {
		go serveHTTP(ctx, o.httpEndpoint, d)
	}
	if o.metricsSecureAddress != "" {
		srv, err := secureMetrics(ctx, o.metricsSecureAddress, o.kubeconfig, cfg.NodeID, d)
		if err != nil {
			exit(err, "Cannot serve metrics", "address", o.metricsSecureAddress)
		}
		go func() {
			if err := srv.Serve(ctx); err != nil {
				klog.ErrorS(err, "Metrics endpoint failed", "address", o.metricsSecureAddress)
			}
		}()
	}
	if inventory != nil {
		go inventory.Run(ctx)
	}
	removeStartupTaint(ctx, &o, cfg, d)
	klog.InfoS("Starting Cistern CSI driver", "version", version, "driver", cfg.DriverName, "node", cfg.NodeID, "mode", cfg.Mode)
	if err := d.Run(ctx); err != nil {
		exit(err, "Driver stopped with an error")
	}
	klog.InfoS("Driver stopped")
}

// exit logs err and ends the process, flushing the log.
// subcommands run instead of the plugin when named first: the FUSE keeper's DaemonSet, and the
// check `helm test` runs.
var subcommands = map[string]func(args []string){"fuse-keeper": runKeeper, "check-install": runCheckInstall}

func firstArg() string {
	if len(os.Args) > 1 {
		return os.Args[1]
	}
	return ""
}

func exit(err error, msg string, kv ...any) {
	klog.ErrorS(err, msg, kv...)
	klog.FlushAndExit(klog.ExitFlushTimeout, 1)
}

// serviceAccountRoles lets datasets with roleFrom=serviceAccount read their pod's ServiceAccount
// through the API; a node plugin without API access refuses them with a message that says so.
func serviceAccountRoles(cfg *driver.Config, kubeconfig string) {
	_, client, err := kubeClient(kubeconfig)
	if err != nil {
		klog.InfoS("No API access: datasets that take their role from a ServiceAccount are refused", "err", err)
		return
	}
	cfg.Datasets.ServiceAccountRoles = sarole.Reader{Client: client.CoreV1()}
}

// removeStartupTaint, with --remove-startup-taint, removes the node's startup taint in the
// background once d serves and kubelet has registered it (pkg/startuptaint).
func removeStartupTaint(ctx context.Context, o *options, cfg driver.Config, d *driver.Driver) {
	if !o.removeStartupTaint {
		return
	}
	_, client, err := kubeClient(o.kubeconfig)
	if err != nil {
		exit(err, "Cannot remove the startup taint")
	}
	go func() {
		if err := startuptaint.Run(ctx, client, cfg.NodeID, cfg.DriverName, d.Ready()); err != nil && ctx.Err() == nil {
			klog.ErrorS(err, "Startup taint not removed", "node", cfg.NodeID)
		}
	}()
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

// outputEvents records the write-back's Events on the pods and claims whose outputs they are,
// and the progress of the stagings their volumes wait for.
func outputEvents(kubeconfig, node string) (*outputevents.Recorder, error) {
	_, client, err := kubeClient(kubeconfig)
	if err != nil {
		return nil, err
	}
	return outputevents.New(client, node, "cistern-csi-driver"), nil
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
func setupPeers(cfg *driver.Config, o *options) (*peerdirectory.Inventory, error) {
	if cfg.NodeID == "" || o.peerAdvertise == "" {
		return nil, errors.New("--peer-listen needs --node-id and --peer-advertise")
	}
	rc, client, err := kubeClient(o.kubeconfig)
	if err != nil {
		return nil, err
	}
	spClient, err := poolpublisher.NewClient(rc)
	if err != nil {
		return nil, err
	}
	cert, hash, err := peer.SelfSigned(cfg.NodeID)
	if err != nil {
		return nil, err
	}
	cfg.Peers.Server.Cert = cert
	cfg.Peers.Server.Auth = &peer.TokenReviewer{Client: client.AuthenticationV1().TokenReviews(),
		ServiceAccounts: strings.Split(o.peerAccounts, ","), Limits: o.peerReviews}
	self := poolpublisher.LabelValue(cfg.NodeID)
	// Requests name versions bound to the asking node and this one, by the names the
	// StoragePools publish (peer.BindVersion).
	cfg.Peers.Server.Self, cfg.Peers.Server.NodeName = self, poolpublisher.LabelValue
	inventory := peerdirectory.New(spClient, cfg.NodeID, peer.Peer{Node: self, Address: o.peerAdvertise, CertHash: hash})
	token := &peer.TokenFile{Path: o.peerTokenFile}
	if cfg.Datasets.Peers, err = peer.NewNetwork(peer.NetworkConfig{Self: self, Directory: inventory, Token: token.Token}); err != nil {
		return nil, err
	}
	return inventory, nil
}

// secureMetrics serves /metrics over HTTPS to callers the API server authorises (securemetrics).
func secureMetrics(ctx context.Context, addr, kubeconfig, node string, d *driver.Driver) (*securemetrics.Server, error) {
	rc, _, err := kubeClient(kubeconfig)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	d.Metrics().RegisterToServer(mux, "/metrics")
	host := node
	if host == "" {
		host = "cistern-node"
	}
	return securemetrics.New(ctx, addr, host, rc, mux)
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
