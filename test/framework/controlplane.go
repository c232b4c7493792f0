package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Options selects what StartControlPlane runs next to etcd and kube-apiserver.
type Options struct {
	// ControllerManager starts kube-controller-manager: ServiceAccounts and their tokens, the
	// kube-root-ca.crt ConfigMap, StatefulSets, PV/PVC binding, attach/detach, garbage collection,
	// namespace deletion. Without it, pods are refused for want of a default ServiceAccount.
	ControllerManager bool
	// Scheduler starts kube-scheduler, so pods get a node.
	Scheduler bool

	// Controllers replaces kube-controller-manager's --controllers (default: DefaultControllers).
	Controllers []string
	// Extra flags, appended last so they override the defaults.
	APIServerArgs         []string
	ControllerManagerArgs []string
	SchedulerArgs         []string
}

// DefaultControllers runs every controller a real cluster runs ("*"), and names the ones tests
// rely on so that a change of upstream defaults cannot silently drop them.
var DefaultControllers = []string{
	"*",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"root-ca-certificate-publisher-controller",
	"statefulset-controller",
	"persistentvolume-binder-controller",
	"persistentvolume-attach-detach-controller",
	"garbage-collector-controller",
	"namespace-controller",
}

// ControlPlane is a running etcd + kube-apiserver (+ controller manager and scheduler).
type ControlPlane struct {
	// Kubeconfig is the path of a kubeconfig for the admin user (group system:masters).
	Kubeconfig string
	// Config and Client are for the admin user.
	Config *rest.Config
	Client kubernetes.Interface
	// URL is kube-apiserver's address, https://127.0.0.1:<port>.
	URL string
	// BinDir holds the Kubernetes binaries (kubectl, ...).
	BinDir string
	// Dir holds the data and credentials; LogDir the components' logs.
	Dir    string
	LogDir string

	caCert []byte
	procs  []*Process
}

const (
	startTimeout  = 3 * time.Minute
	startAttempts = 3
	// apiTimeout bounds one helper's calls to the API server.
	apiTimeout = 30 * time.Second
)

// StartControlPlane starts a control plane for one test and stops it when the test ends.
func StartControlPlane(t TB, opts Options) *ControlPlane {
	t.Helper()
	binDir := BinDir(t)
	logDir := LogDir(t)
	dataDir := t.TempDir() // before the Stop cleanup, so it is removed after the processes stop
	begin := time.Now()
	cp, err := start(binDir, dataDir, logDir, opts)
	if err != nil {
		t.Fatalf("starting control plane: %v", err)
	}
	t.Cleanup(cp.Stop)
	t.Logf("control plane (%s) ready in %s; KUBECONFIG=%s", cp.components(), time.Since(begin).Round(time.Millisecond), cp.Kubeconfig)
	return cp
}

// start retries when a port picked as free was taken before the component bound it.
func start(binDir, dataDir, logDir string, opts Options) (*ControlPlane, error) {
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		dir := filepath.Join(dataDir, fmt.Sprintf("attempt-%d", attempt))
		if err = os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		var cp *ControlPlane
		cp, err = startOnce(binDir, dir, logDir, opts)
		if err == nil {
			return cp, nil
		}
		if !errors.Is(err, errPortInUse) {
			return nil, err
		}
	}
	return nil, err
}

func startOnce(binDir, dir, logDir string, opts Options) (_ *ControlPlane, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()

	cp := &ControlPlane{BinDir: binDir, Dir: dir, LogDir: logDir}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	creds, err := writeCredentials(dir)
	if err != nil {
		return nil, err
	}
	cp.caCert = creds.caCert

	etcdURL, err := cp.startEtcd(ctx)
	if err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(ctx, etcdURL, creds, opts.APIServerArgs); err != nil {
		return nil, err
	}
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return nil, err
	}
	if opts.ControllerManager {
		controllers := opts.Controllers
		if len(controllers) == 0 {
			controllers = DefaultControllers
		}
		if err := cp.startControllerManager(ctx, creds, controllers, opts.ControllerManagerArgs); err != nil {
			return nil, err
		}
	}
	if opts.Scheduler {
		if err := cp.startScheduler(ctx, creds, opts.SchedulerArgs); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// Stop stops the components in reverse order of start. The test cleanup calls it; call it
// directly only to test what happens when the control plane goes away.
func (cp *ControlPlane) Stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		cp.procs[i].Stop()
	}
}

func (cp *ControlPlane) components() string {
	names := make([]string, len(cp.procs))
	for i, p := range cp.procs {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}
