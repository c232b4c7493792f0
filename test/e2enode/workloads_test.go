package e2enode

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework/realnode"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

const lwsName = "ranks"

// startWorkloadController installs the workload CRDs and runs the workload-controller in the
// test process, its webhooks self-registered on loopback, notebook jobs cloning with the git
// image, until the test ends.
func startWorkloadController(t *testing.T, c *cluster) error {
	t.Helper()
	return runWorkloadController(t, c.cp, c.bins, nil)
}

// runWorkloadController is startWorkloadController for any control plane; configure, when set,
// changes the controller's configuration first.
func runWorkloadController(t *testing.T, cp *framework.ControlPlane, bins *realnode.Binaries, configure func(*workloads.Config)) error {
	t.Helper()
	// InstallCRDs logs through controller-runtime before the controller's Run sets its logger.
	crlog.SetLogger(klog.Background())
	root, err := realnode.RepoRoot()
	if err != nil {
		return err
	}
	if err := testutil.InstallCRDs(cp.Config, filepath.Join(root, "deploy", "csi", "crds")); err != nil {
		return fmt.Errorf("installing the workload CRDs: %w", err)
	}
	ports, err := realnode.FreePorts(1)
	if err != nil {
		return err
	}
	port := int(ports[0])
	certDir := t.TempDir()
	cfg := workloads.Config{
		RestConfig:  cp.Config,
		MetricsAddr: "0", ProbeAddr: "0",
		WebhookHost: "127.0.0.1", WebhookPort: port, WebhookCertDir: certDir, WebhookSelfRegister: true,
		WebhookServiceNamespace: "default", WebhookSecretName: "cistern-workload-webhook-cert",
		GitImage: bins.Images["git"].Ref, CompareImage: bins.Images["controller"].Ref,
		// TestNode and TestLWSNodeLoss each run one, in one test process.
		OneOfManyInProcess: true,
	}
	if configure != nil {
		configure(&cfg)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(1)))
	errc := make(chan error, 1)
	wctl, err := workloads.New(cfg)
	if err != nil {
		cancel()
		return err
	}
	go func() { errc <- wctl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-errc:
		case <-time.After(30 * time.Second):
			t.Log("workload-controller did not stop within 30s")
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("workload-controller exited: %w", err)
		default:
		}
		if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("workload-controller's webhook server not up on port %d", port)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkerLWS is a LeaderWorkerSet of one group, a leader and one worker, each with its own claim
// of class; every pod runs the checker image with args over its claim at /data and writes its
// results under /results, the host directory results.
type checkerLWS struct {
	name, ns, class, image, results string
	storage                         string // each claim's request
	exclusive                       bool   // the group on one node (exclusive-topology by hostname)
	args                            string // the checker's, as a YAML flow sequence's items
}

func (l checkerLWS) manifest() string {
	annotations := "{}"
	if l.exclusive {
		annotations = "{leaderworkerset.sigs.k8s.io/exclusive-topology: kubernetes.io/hostname}"
	}
	return fmt.Sprintf(`apiVersion: workloads.cistern.dev/v1alpha1
kind: LeaderWorkerSet
metadata:
  name: %[1]s
  namespace: %[2]s
  annotations: %[6]s
spec:
  replicas: 1
  leaderWorkerTemplate:
    size: 2
    volumeClaimTemplates:
    - metadata: {name: data}
      spec:
        accessModes: [ReadWriteOnce]
        storageClassName: %[3]s
        resources: {requests: {storage: %[7]s}}
    workerTemplate:
      spec:
        hostNetwork: true
        terminationGracePeriodSeconds: 5
        containers:
        - name: checker
          image: %[4]s
          imagePullPolicy: Never
          env:
          - name: POD_NAME
            valueFrom: {fieldRef: {fieldPath: metadata.name}}
          - name: POD_UID
            valueFrom: {fieldRef: {fieldPath: metadata.uid}}
          args: [%[8]s]
          volumeMounts:
          - {name: data, mountPath: /data}
          - {name: results, mountPath: /results}
        volumes:
        - name: results
          hostPath: {path: %[5]s, type: DirectoryOrCreate}
`, l.name, l.ns, l.class, l.image, l.results, annotations, l.storage, l.args)
}

// lwsManifest: every pod checks its claim (write, read back, fill to ENOSPC) and writes its
// results under its own name.
func lwsManifest(c *cluster) string {
	return checkerLWS{name: lwsName, ns: c.ns, class: c.storageClass, image: c.checkerImage, results: c.resultsDir,
		storage: "32Mi", args: "-out, /results/$(POD_NAME), -dir, /data, -write-read, -fill"}.manifest()
}

func testLeaderWorkerSet(t *testing.T, c *cluster) {
	framework.ApplyYAML(t, c.cp, lwsManifest(c))
	ctx := context.Background()
	pods := []string{lwsName + "-0", lwsName + "-0-1"} // the leader, then worker 1 of group 0
	for _, name := range pods {
		waitPodCreated(t, c, name)
		waitPodRunning(t, c.cp, c.ns, name)
		d := readResult(t, c.resultsDir, name).Dirs[0]
		if d.WriteRead == nil || !d.WriteRead.OK {
			t.Errorf("%s: write and read back failed: %+v", name, d.WriteRead)
		}
		if d.Fill == nil || !d.Fill.ENOSPC || d.Fill.Bytes > 32<<20 {
			t.Errorf("%s: filling its 32 MiB claim: %+v, want ENOSPC within 32 MiB", name, d.Fill)
		}
		claim, err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Get(ctx, "data-"+name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s: its claim: %v", name, err)
		} else if claim.Status.Phase != corev1.ClaimBound {
			t.Errorf("claim %s is %s", claim.Name, claim.Status.Phase)
		}
	}

	// Delete the LeaderWorkerSet and wait for its pods; the claims are retained (the default
	// policy), so delete them too.
	framework.Kubectl(t, c.cp, "delete", "leaderworkersets.workloads.cistern.dev", lwsName, "-n", c.ns, "--cascade=foreground", "--wait=true", "--timeout=120s")
	for _, name := range pods {
		deletePodAndWait(t, c.cp, c.ns, name)
		if err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Delete(ctx, "data-"+name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting claim data-%s: %v", name, err)
		}
	}
}

// waitPodCreated waits for a controller to create the pod.
func waitPodCreated(t *testing.T, c *cluster, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := c.cp.Client.CoreV1().Pods(c.ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("pod %s not created: %v", name, err)
	}
}
