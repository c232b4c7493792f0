// Command node-driver-registrar is a stand-in for the upstream sidecar of that name (see
// hack/standins): it asks the CSI driver for its name over --csi-address, then serves kubelet's
// plugin Registration API on <--plugin-registration-path>/<driver>-reg.sock with
// --kubelet-registration-path as the endpoint kubelet dials (hack/standins/registration).
// /healthz on --http-endpoint answers 200 while the socket exists and
// kubelet has not refused the registration. SIGTERM removes the socket, which deregisters the
// driver.
//
// Unlike upstream, a refused registration is offered again after a backoff instead of exiting.
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
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/hack/standins/registration"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "standin"

func main() {
	klog.InitFlags(nil)
	csiAddress := flag.String("csi-address", "/run/csi/socket", "Path of the CSI driver socket inside this container.")
	kubeletPath := flag.String("kubelet-registration-path", "", "Path of the CSI driver socket on the host, as kubelet dials it.")
	pluginDir := flag.String("plugin-registration-path", "/registration", "kubelet's plugins_registry directory inside this container.")
	httpEndpoint := flag.String("http-endpoint", "", "Address of the /healthz server, e.g. :9810; empty: none.")
	timeout := flag.Duration("timeout", time.Second, "Timeout of the GetPluginInfo call.")
	mode := flag.String("mode", "registration", "Only \"registration\" is implemented by this stand-in.")
	showVersion := flag.Bool("version", false, "Print the version and exit.")
	flag.Parse()
	if *showVersion {
		fmt.Println(os.Args[0], version)
		return
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, *csiAddress, *kubeletPath, *pluginDir, *httpEndpoint, *mode, *timeout); err != nil {
		klog.ErrorS(err, "node-driver-registrar failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

func run(ctx context.Context, csiAddress, kubeletPath, pluginDir, httpEndpoint, mode string, timeout time.Duration) error {
	if mode != "registration" {
		return fmt.Errorf("--mode=%s is not implemented by this stand-in", mode)
	}
	if kubeletPath == "" {
		return errors.New("--kubelet-registration-path is required")
	}
	driverName, err := driverName(ctx, csiAddress, timeout)
	if err != nil {
		return err
	}
	klog.InfoS("CSI driver found", "driver", driverName, "csiAddress", csiAddress)
	srv, err := registration.New(registration.Config{DriverName: driverName, Endpoint: kubeletPath, Dir: pluginDir})
	if err != nil {
		return err
	}
	if httpEndpoint != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if _, err := os.Stat(srv.SocketPath()); err != nil {
				http.Error(w, fmt.Sprintf("registration socket: %v", err), http.StatusInternalServerError)
				return
			}
			if _, lastErr := srv.Registered(); lastErr != "" {
				http.Error(w, "kubelet refused the registration: "+lastErr, http.StatusInternalServerError)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		hs := &http.Server{Addr: httpEndpoint, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "health server failed")
			}
		}()
		defer hs.Close()
	}
	return srv.Run(ctx)
}

// driverName asks the driver for its name, waiting for its socket as upstream does.
func driverName(ctx context.Context, csiAddress string, timeout time.Duration) (string, error) {
	conn, err := connection.Connect(ctx, csiAddress, nil, connection.WithTimeout(0))
	if err != nil {
		return "", fmt.Errorf("connecting to the CSI driver at %s: %w", csiAddress, err)
	}
	defer conn.Close()
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	name, err := csirpc.GetDriverName(callCtx, conn)
	if err != nil {
		return "", fmt.Errorf("GetPluginInfo: %w", err)
	}
	return name, nil
}
