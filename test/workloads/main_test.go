// Package workloads_test runs the workload-controller against a real control plane:
// kube-apiserver with etcd, kube-controller-manager (whose StatefulSet controller creates the pods
// and claims, whose garbage collector and PV binder do their real work) and kube-scheduler. The
// controller runs in the test process with its webhooks self-registered on a loopback address.
// No kubelet runs: fakeKubelet plays its part for pods bound to the test's nodes.
package workloads_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

func TestMain(m *testing.M) {
	os.Exit(framework.RunShared(m, framework.Options{ControllerManager: true, Scheduler: true}))
}

var (
	setupOnce sync.Once
	setupErr  error
	// cl is an admin client with the controller's scheme.
	cl client.Client
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// setup installs the CRDs and starts one controller for the whole package.
func setup(t *testing.T) *framework.ControlPlane {
	t.Helper()
	cp := framework.Shared(t)
	setupOnce.Do(func() {
		setupErr = errors.New("setup did not finish")
		c, err := client.New(cp.Config, client.Options{Scheme: workloads.Scheme()})
		if err != nil {
			setupErr = err
			return
		}
		if err := testutil.InstallCRDs(cp.Config, filepath.Join(repoRoot(), "deploy", "csi", "crds")); err != nil {
			setupErr = err
			return
		}
		cl = c
		// The controller runs as its ServiceAccount with the RBAC of deploy/, so the manifests
		// are tested along with the code.
		if err := installRBAC(t, cp); err != nil {
			setupErr = err
			return
		}
		setupErr = startController(framework.ServiceAccountConfig(t, cp, controllerNamespace, controllerSA))
	})
	if setupErr != nil {
		t.Fatalf("setup: %v", setupErr)
	}
	return cp
}

const (
	controllerNamespace = "cistern-system"
	controllerSA        = "cistern-workload-controller"
)

// selfRegisterRBAC is what --webhook-self-register needs beyond the installed RBAC: creating the
// webhook configurations (in a cluster they come with the manifests).
const selfRegisterRBAC = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: test-webhook-self-register}
rules:
- apiGroups: [admissionregistration.k8s.io]
  resources: [mutatingwebhookconfigurations, validatingwebhookconfigurations]
  verbs: [create, get, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: test-webhook-self-register}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: test-webhook-self-register}
subjects: [{kind: ServiceAccount, name: cistern-workload-controller, namespace: cistern-system}]
`

// installRBAC applies deploy/csi/workload-controller's RBAC and ServiceAccount (everything but
// the Deployment) into cistern-system.
func installRBAC(t *testing.T, cp *framework.ControlPlane) error {
	dir := filepath.Join(repoRoot(), "deploy", "csi", "workload-controller")
	framework.ApplyYAML(t, cp, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+controllerNamespace+"}\n")
	framework.ApplyManifests(t, cp, filepath.Join(dir, "rbac", "role.yaml"))
	b, err := os.ReadFile(filepath.Join(dir, "deployment.yaml"))
	if err != nil {
		return err
	}
	var keep []string
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if !strings.Contains(doc, "\nkind: Deployment\n") {
			keep = append(keep, doc)
		}
	}
	framework.ApplyYAML(t, cp, strings.Join(keep, "\n---\n"))
	framework.ApplyYAML(t, cp, selfRegisterRBAC)
	return nil
}

// startController runs the controller in this process until the test binary exits.
func startController(cfg *rest.Config) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	ctrlCfg := rest.CopyConfig(cfg)
	ctrlCfg.QPS, ctrlCfg.Burst = 200, 400
	certDir, err := os.MkdirTemp("", "workload-webhook-")
	if err != nil {
		return err
	}
	wc := workloads.Config{
		RestConfig:  ctrlCfg,
		MetricsAddr: "0", ProbeAddr: "0",
		WebhookHost: "127.0.0.1", WebhookPort: port, WebhookCertDir: certDir, WebhookSelfRegister: true,
		WebhookServiceNamespace: controllerNamespace, WebhookSecretName: "cistern-workload-webhook-cert",
		GitImage: "registry.invalid/git:test", GroupWorkers: 4,
	}
	wc.VolumeManager.LocalSourceRoots = []string{"/srv/datasets"}
	logger := klog.Background().V(1)
	ctx := klog.NewContext(context.Background(), logger)
	errc := make(chan error, 1)
	wctl, err := workloads.New(wc)
	if err != nil {
		return err
	}
	go func() { errc <- wctl.Run(ctx) }()
	// Ready when the webhook server answers TLS.
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-errc:
			return fmt.Errorf("controller exited: %w", err)
		default:
		}
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("webhook server did not start on port %d", port)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// eventually polls cond every 200ms until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not after %s: %v", what, timeout, err)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
