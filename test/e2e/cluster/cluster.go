package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/cistern-csi/cistern/pkg/workloads/webhookcert"
	"github.com/cistern-csi/cistern/test/framework"
)

// Cluster is deploy/csi installed on a control plane, with simulated nodes running the node
// components, and the workload-controller.
type Cluster struct {
	CP    *framework.ControlPlane
	Nodes map[string]*Node
	// NodeNames in the order they were given.
	NodeNames  []string
	Controller *framework.Process
	// ControllerMetrics is the workload-controller's metrics URL (HTTPS, token required).
	ControllerMetrics string
}

// Options for Start.
type Options struct {
	Nodes []NodeSpec
	Node  NodeOptions
	// MountVolumes makes the nodes' stand-in kubelet stage and publish each pod's Cistern
	// volumes before it reports the pod Running (MountingKubelet); otherwise pods are reported
	// Running at once and tests mount what they need themselves (StageAndPublish).
	MountVolumes bool
	// RunsToCompletion, with MountVolumes, says which pods' containers exit at once with success
	// (a VolumeManager's stager pods): they are reported Succeeded once their volumes are mounted,
	// and the volumes are then unpublished, as kubelet does for a finished pod.
	RunsToCompletion func(*corev1.Pod) bool
}

// CreateNamespace creates the install namespace, so that a server-side dry run of deploy/csi
// can check its namespaced objects (a dry-run Namespace is not there for them).
func CreateNamespace(t framework.TB, cp *framework.ControlPlane) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", Namespace, err)
	}
}

// Install applies deploy/csi (CRDs, RBAC, CSIDriver, DaemonSet, ...) as an administrator would.
func Install(t framework.TB, cp *framework.ControlPlane) {
	t.Helper()
	framework.ApplyManifests(t, cp, DeployDir())
}

// Start installs deploy/csi and starts the nodes and the controller.
func Start(t framework.TB, cp *framework.ControlPlane, opts Options) *Cluster {
	t.Helper()
	ForgetWebhooks(t, cp)
	Install(t, cp)
	c := &Cluster{CP: cp, Nodes: map[string]*Node{}}
	for _, spec := range opts.Nodes {
		c.Nodes[spec.Name] = StartNode(t, cp, spec, opts.Node)
		c.NodeNames = append(c.NodeNames, spec.Name)
	}
	c.Controller, c.ControllerMetrics = startController(t, cp, opts.Node.Bins.Controller)
	// The node DaemonSet's own pods are left alone: their components run as local processes.
	pods := fields.OneTermNotEqualSelector("metadata.namespace", Namespace)
	if opts.MountVolumes {
		c.MountingKubelet(t, pods, opts.RunsToCompletion)
	} else {
		framework.FakeKubelet(t, cp.Client, pods, c.NodeNames...)
	}
	return c
}

// ForgetWebhooks deletes the webhook configurations a previous cluster's controller registered
// by URL on this control plane: applied over them, deploy/csi's Service-based ones would name
// both a URL and a Service. This cluster's controller registers its own.
func ForgetWebhooks(t framework.TB, cp *framework.ControlPlane) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := cp.Client.AdmissionregistrationV1()
	for _, err := range []error{
		api.MutatingWebhookConfigurations().Delete(ctx, webhookcert.ConfigurationName, metav1.DeleteOptions{}),
		api.ValidatingWebhookConfigurations().Delete(ctx, webhookcert.ConfigurationName, metav1.DeleteOptions{}),
	} {
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("deleting the webhook configurations of an earlier cluster: %v", err)
		}
	}
}

// startController runs the workload-controller as its ServiceAccount, its webhooks served on
// loopback and registered by URL (no Service can reach a process outside the cluster).
func startController(t framework.TB, cp *framework.ControlPlane, bin string) (*framework.Process, string) {
	t.Helper()
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := framework.FreeAddr(t)
	certDir := filepath.Join(t.TempDir(), "webhook-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := framework.StartProcess(t, "workload-controller", bin,
		"--kubeconfig="+framework.ServiceAccountKubeconfig(t, cp, Namespace, ControllerServiceAccount),
		"--metrics-bind-address="+metricsAddr,
		"--metrics-secure",
		"--health-probe-bind-address=0",
		"--webhook-host=127.0.0.1",
		fmt.Sprintf("--webhook-port=%d", port),
		"--webhook-cert-dir="+certDir,
		"--webhook-self-register",
		"--webhook-namespace="+Namespace,
		"--v=2",
	)
	if err := p.WaitListening(fmt.Sprintf("127.0.0.1:%d", port), 2*time.Minute); err != nil {
		t.Fatalf("workload-controller webhook server: %v", err)
	}
	return p, "https://" + metricsAddr + "/metrics"
}
