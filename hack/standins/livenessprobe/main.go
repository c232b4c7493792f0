// Command livenessprobe is a stand-in for the upstream sidecar of that name (see hack/standins):
// GET /healthz on --http-endpoint (or :--health-port) calls the CSI driver's Probe over
// --csi-address with --probe-timeout and answers 200 when the driver is ready, 500 otherwise,
// so that kubelet's liveness probe of the driver container goes through the CSI socket. A lost
// connection is re-established for the next probe.
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

	"github.com/kubernetes-csi/csi-lib-utils/connection"
	csirpc "github.com/kubernetes-csi/csi-lib-utils/rpc"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "standin"

func main() {
	klog.InitFlags(nil)
	csiAddress := flag.String("csi-address", "/run/csi/socket", "Path of the CSI driver socket inside this container.")
	probeTimeout := flag.Duration("probe-timeout", time.Second, "Timeout of one Probe call.")
	healthPort := flag.Int("health-port", 9808, "Port of /healthz when --http-endpoint is empty.")
	httpEndpoint := flag.String("http-endpoint", "", "Address of /healthz, e.g. :9808; overrides --health-port.")
	showVersion := flag.Bool("version", false, "Print the version and exit.")
	flag.Parse()
	if *showVersion {
		fmt.Println(os.Args[0], version)
		return
	}
	addr := *httpEndpoint
	if addr == "" {
		addr = fmt.Sprintf(":%d", *healthPort)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, *csiAddress, addr, *probeTimeout); err != nil {
		klog.ErrorS(err, "livenessprobe failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

func run(ctx context.Context, csiAddress, addr string, probeTimeout time.Duration) error {
	conn, err := connection.Connect(ctx, csiAddress, nil,
		connection.WithTimeout(0),
		connection.OnConnectionLoss(func(ctx context.Context) bool {
			klog.FromContext(ctx).Info("Lost the connection to the CSI driver; reconnecting")
			return true
		}))
	if err != nil {
		return fmt.Errorf("connecting to the CSI driver at %s: %w", csiAddress, err)
	}
	defer conn.Close()
	mux := http.NewServeMux()
	mux.Handle("/healthz", probeHandler(conn, probeTimeout))
	hs := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = hs.Close()
	}()
	klog.InfoS("Serving /healthz", "address", addr, "csiAddress", csiAddress)
	if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// probeHandler answers from one CSI Probe per request.
func probeHandler(conn *grpc.ClientConn, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		ready, err := csirpc.Probe(ctx, conn)
		switch {
		case err != nil:
			klog.ErrorS(err, "Health check failed")
			http.Error(w, err.Error(), http.StatusInternalServerError)
		case !ready:
			klog.InfoS("Driver reports not ready")
			http.Error(w, "driver is not ready", http.StatusInternalServerError)
		default:
			fmt.Fprintln(w, "ok")
		}
	})
}
