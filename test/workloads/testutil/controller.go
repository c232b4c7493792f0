package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/test/framework"
)

// ControllerNamespace and ControllerSA are where the controller's ServiceAccount lives, as in
// deploy/csi/workload-controller.
const (
	ControllerNamespace = "cistern-system"
	ControllerSA        = "cistern-workload-controller"
)

// SelfRegisterRBAC is what --webhook-self-register needs beyond the installed RBAC: creating the
// webhook configurations (in a cluster they come with the manifests).
const SelfRegisterRBAC = `apiVersion: rbac.authorization.k8s.io/v1
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

// ControllerConfig is the controller's configuration for a test: webhooks self-registered on a
// free loopback port, no metrics or probes. mod adjusts it.
func ControllerConfig(mod func(*workloads.Config)) (workloads.Config, error) {
	port, err := framework.FreePort()
	if err != nil {
		return workloads.Config{}, err
	}
	certDir, err := os.MkdirTemp("", "workload-webhook-")
	if err != nil {
		return workloads.Config{}, err
	}
	wc := workloads.Config{
		MetricsAddr: "0", ProbeAddr: "0",
		WebhookHost: "127.0.0.1", WebhookPort: port, WebhookCertDir: certDir, WebhookSelfRegister: true,
		WebhookServiceNamespace: ControllerNamespace, WebhookSecretName: "cistern-workload-webhook-cert",
		GitImage: "registry.invalid/git:test", CompareImage: "registry.invalid/workload-controller:test", GroupWorkers: 4,
	}
	if mod != nil {
		mod(&wc)
	}
	return wc, nil
}

// StartController runs the controller in this process until the test binary exits, and returns
// once its webhook server answers (or with the error it exited with).
func StartController(cfg *rest.Config, wc workloads.Config) error {
	ctrlCfg := rest.CopyConfig(cfg)
	ctrlCfg.QPS, ctrlCfg.Burst = 200, 400
	logger := klog.Background().V(1)
	ctx := klog.NewContext(context.Background(), logger)
	wc.RestConfig = ctrlCfg
	c, err := workloads.New(wc)
	if err != nil {
		return err
	}
	var runErr error
	exited := make(chan struct{})
	go func() {
		runErr = c.Run(ctx)
		close(exited)
	}()
	// Ready when the webhook server answers.
	err = framework.WaitListening(fmt.Sprintf("127.0.0.1:%d", wc.WebhookPort), 60*time.Second, exited)
	if errors.Is(err, framework.ErrExited) {
		return fmt.Errorf("controller exited: %w", runErr)
	}
	return err
}

// ControlPlane is the control plane the workload suites run on (framework.RunShared): the
// controller needs kube-controller-manager (StatefulSets, garbage collection, the PV binder) and
// kube-scheduler beside the API server.
var ControlPlane = framework.Options{ControllerManager: true, Scheduler: true}
