// Package logflags gives Cistern's commands the logging flags of Kubernetes components
// (k8s.io/component-base/logs): --logging-format=text|json, -v, --vmodule, --log-flush-frequency,
// plus klog's own flags (--logtostderr, --log_file, ...) as before, which the text format honours.
package logflags

import (
	"flag"

	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	// The json format, as kube components register it.
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"
)

// Register adds the logging flags to fs and returns the configuration they fill; pass it to
// Apply once fs is parsed.
func Register(fs *flag.FlagSet) *logsapi.LoggingConfiguration {
	// klog's flags but -v and --vmodule, which the configuration owns (same klog values).
	var klogFlags flag.FlagSet
	klog.InitFlags(&klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) {
		if f.Name != "v" && f.Name != "vmodule" && fs.Lookup(f.Name) == nil {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
	c := logsapi.NewLoggingConfiguration()
	logsapi.AddGoFlags(c, fs)
	return c
}

// Apply validates the parsed configuration and switches klog to its format and verbosity. A
// non-text format refuses klog's own flags set to anything but their defaults.
func Apply(c *logsapi.LoggingConfiguration) error {
	logs.InitLogs()
	return logsapi.ValidateAndApply(c, nil)
}
