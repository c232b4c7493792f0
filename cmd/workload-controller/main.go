// Command workload-controller runs the LeaderWorkerSet, NotebookValidationJob and VolumeManager
// controllers and their admission webhooks. See docs/workloads.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/logflags"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook/compare"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// The validation pods of notebook jobs with a golden notebook run this binary to compare.
	if len(os.Args) > 1 && os.Args[1] == compare.Command {
		os.Exit(compare.Main(os.Args[2:], os.Stdout, os.Stderr))
	}
	logCfg := logflags.Register(flag.CommandLine)
	var cfg workloads.Config
	var o options
	bindFlags(&cfg, &o)
	flag.Parse()
	if o.showVersion {
		fmt.Println(version)
		return
	}
	if err := logflags.Apply(logCfg); err != nil {
		klog.ErrorS(err, "Invalid logging flags")
		os.Exit(2)
	}
	logger := klog.Background()
	if err := o.complete(&cfg); err != nil {
		logger.Error(err, "Invalid flags")
		os.Exit(2)
	}

	restConfig, err := loadConfig(flag.Lookup("kubeconfig").Value.String())
	if err != nil {
		logger.Error(err, "loading kubeconfig")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	restConfig.QPS, restConfig.Burst = float32(o.qps), o.burst
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
