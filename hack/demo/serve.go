package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testpeers"
)

const (
	mib       = int64(1) << 20
	namespace = "demo"
)

var demoNodes = []cluster.NodeSpec{
	{Name: "demo-node-1", Pools: []cluster.PoolSpec{
		{Name: "fast", Size: 1024 * mib, Labels: map[string]string{"media": "ssd"}},
		{Name: "bulk", Size: 512 * mib, Labels: map[string]string{"media": "hdd"}},
	}},
	{Name: "demo-node-2", Pools: []cluster.PoolSpec{
		{Name: "fast", Size: 1024 * mib, Labels: map[string]string{"media": "ssd"}},
	}},
}

// summary is what `up` shows; serve writes it once everything is in place.
type summary struct {
	Kubeconfig string
	Kubectl    string
	Namespace  string
	S3Endpoint string
	// Dataset is the report of the dataset check, or why there is none.
	Dataset []string
	// ScratchPV is the PV of the pool-targeted claim.
	ScratchPV string
	LogDir    string
	ReadyIn   string
	Warnings  []string
}

// progress appends one line to the progress file that `up` follows.
func (d demoDir) progress(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	logf("==> %s", line)
	f, err := os.OpenFile(d.progressFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err == nil {
		fmt.Fprintln(f, line)
		f.Close()
	}
}

// serve starts everything, reports progress, then waits for SIGTERM and stops it all.
func serve(d demoDir) error {
	s := &session{dir: string(d)}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	defer func() {
		d.progress("stopping")
		s.close()
		d.progress("stopped")
	}()

	var sum *summary
	if err := s.run(func() { sum = start(s, d) }); err != nil {
		d.progress("FAILED: %v", err)
		return err
	}
	sum.ReadyIn = time.Since(started).Round(time.Second).String()
	data, _ := json.MarshalIndent(sum, "", "  ")
	if err := os.WriteFile(d.summaryFile(), data, 0o644); err != nil {
		return err
	}
	d.progress("READY")
	<-ctx.Done()
	return nil
}

func start(tb framework.TB, d demoDir) *summary {
	sum := &summary{Namespace: namespace, LogDir: d.path("logs", "demo")}

	d.progress("building csi-driver, storagepool-sidecar, workload-controller")
	bins, err := cluster.BuildBinaries(cluster.BinDir())
	if err != nil {
		tb.Fatal(err)
	}

	d.progress("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler")
	cp := framework.StartControlPlane(tb, framework.Options{ControllerManager: true, Scheduler: true})
	data, err := os.ReadFile(cp.Kubeconfig)
	if err == nil {
		err = os.WriteFile(d.kubeconfig(), data, 0o600)
	}
	if err != nil {
		tb.Fatal(err)
	}
	sum.Kubeconfig = d.kubeconfig()
	sum.Kubectl = filepath.Join(cp.BinDir, "kubectl")

	var s3 *cluster.S3
	var sums map[string]string
	if bin := testpeers.VersitygwBinary(); bin != "" {
		d.progress("starting the S3 server (versitygw) with the sample dataset s3://datasets/sample/")
		s3 = cluster.StartS3(tb, bin, d.path("s3"))
		if sums, err = s3.SampleDataset(context.Background(), "datasets", "sample"); err != nil {
			tb.Fatal(err)
		}
		sum.S3Endpoint = s3.Endpoint
	} else {
		sum.Warnings = append(sum.Warnings, "no S3 server: versitygw is not built (make s3-tools)")
	}

	d.progress("installing deploy/csi (CRDs, RBAC, CSIDriver, DaemonSet, pools ConfigMap)")
	cluster.CreateNamespace(tb, cp)
	c := cluster.Start(tb, cp, cluster.Options{
		Nodes: demoNodes,
		Node: cluster.NodeOptions{
			Bins:                 bins,
			PoolCheckInterval:    2 * time.Second,
			CapacityPollInterval: 5 * time.Second,
			SidecarResync:        30 * time.Second,
		},
	})
	d.progress("two nodes running the driver, the external-provisioner and the storagepool-sidecar")

	framework.ApplyManifests(tb, cp, filepath.Join(cluster.DeployDir(), "examples", "storageclass-fast.yaml"))
	framework.ApplyYAML(tb, cp, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+namespace+"}\n")
	waitServiceAccount(tb, cp)

	d.progress("creating a claim on pool fast and a pod using it")
	framework.ApplyYAML(tb, cp, `
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: scratch, namespace: demo}
spec:
  storageClassName: cistern-fast
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 256Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: scratch-user, namespace: demo}
spec:
  containers:
  - {name: main, image: busybox:1.37, command: [sleep, infinity], volumeMounts: [{name: scratch, mountPath: /scratch}]}
  volumes:
  - {name: scratch, persistentVolumeClaim: {claimName: scratch}}
`)
	sum.ScratchPV = waitBound(tb, cp, "scratch").Name

	if s3 == nil {
		sum.Dataset = []string{"skipped: no S3 server"}
	} else {
		d.progress("staging s3://datasets/sample/ into a volume and verifying it")
		sum.Dataset = stageDataset(tb, d, cp, c, s3, sums)
	}

	d.progress("creating a LeaderWorkerSet with a claim template")
	framework.ApplyYAML(tb, cp, `
apiVersion: workloads.cistern.dev/v1alpha1
kind: LeaderWorkerSet
metadata: {name: llm, namespace: demo}
spec:
  replicas: 2
  leaderWorkerTemplate:
    size: 2
    workerTemplate:
      spec:
        containers:
        - {name: server, image: busybox:1.37, command: [sleep, infinity], volumeMounts: [{name: cache, mountPath: /cache}]}
    volumeClaimTemplates:
    - metadata: {name: cache}
      spec:
        storageClassName: cistern-fast
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 64Mi}}
`)
	waitLWS(tb, cp)
	return sum
}

func waitServiceAccount(tb framework.TB, cp *framework.ControlPlane) {
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		tb.Fatalf("namespace %s has no default ServiceAccount: %v", namespace, err)
	}
}

func waitBound(tb framework.TB, cp *framework.ControlPlane, claim string) *corev1.PersistentVolume {
	var pv *corev1.PersistentVolume
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pvc, err := cp.Client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claim, metav1.GetOptions{})
		if err != nil || pvc.Status.Phase != corev1.ClaimBound {
			return false, nil
		}
		pv, err = cp.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		tb.Fatalf("claim %s/%s not bound: %v", namespace, claim, err)
	}
	return pv
}

func waitLWS(tb framework.TB, cp *framework.ControlPlane) {
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pvcs, err := cp.Client.CoreV1().PersistentVolumeClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		bound := 0
		for _, p := range pvcs.Items {
			if strings.HasPrefix(p.Name, "cache-llm") && p.Status.Phase == corev1.ClaimBound {
				bound++
			}
		}
		return bound == 4, nil
	})
	if err != nil {
		tb.Fatalf("LeaderWorkerSet llm: claims not all bound: %v", err)
	}
}

// stageDataset provisions a dataset claim, then stages and publishes it on its node as kubelet
// would, and checks every file against the source. It stays published until the demo stops.
func stageDataset(tb framework.TB, d demoDir, cp *framework.ControlPlane, c *cluster.Cluster, s3 *cluster.S3, sums map[string]string) []string {
	framework.ApplyYAML(tb, cp, fmt.Sprintf(`
apiVersion: v1
kind: Secret
metadata: {name: sample-s3, namespace: demo}
stringData: {accessKeyID: %[1]s, secretAccessKey: %[2]s}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: cistern-sample}
provisioner: cistern.csi.dev
volumeBindingMode: WaitForFirstConsumer
parameters:
  pool: fast
  source: s3://datasets/sample/
  endpoint: %[3]s
  pathStyle: "true"
  csi.storage.k8s.io/node-stage-secret-name: sample-s3
  csi.storage.k8s.io/node-stage-secret-namespace: demo
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: sample, namespace: demo}
spec:
  storageClassName: cistern-sample
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 64Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: sample-reader, namespace: demo}
spec:
  containers:
  - {name: main, image: busybox:1.37, command: [sleep, infinity], volumeMounts: [{name: data, mountPath: /data}]}
  volumes:
  - {name: data, persistentVolumeClaim: {claimName: sample}}
`, s3.AccessKey, s3.SecretKey, s3.Endpoint))
	pv := waitBound(tb, cp, "sample")
	node := cluster.TopologyOf(pv)
	n, ok := c.Nodes[node]
	if !ok {
		tb.Fatalf("dataset volume pinned to unknown node %q", node)
	}
	secret, err := cp.Client.CoreV1().Secrets(namespace).Get(context.Background(), "sample-s3", metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	secrets := map[string]string{}
	for k, v := range secret.Data {
		secrets[k] = string(v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	begin := time.Now()
	// A failure here is shown on its screen; the rest of the demo stands without it.
	m, err := cluster.StageAndPublish(ctx, n.Socket, pv, secrets, n.KubeletRoot)
	if err != nil {
		return []string{fmt.Sprintf("claim demo/sample -> %s on %s: staging FAILED: %v", pv.Name, node, err)}
	}
	tb.Cleanup(func() { _ = m.Unmount(context.Background()) })
	took := time.Since(begin).Round(time.Millisecond)
	if err := cluster.VerifyFiles(m.TargetPath, sums); err != nil {
		return []string{fmt.Sprintf("claim demo/sample -> %s on %s: the staged files do NOT match the source: %v", pv.Name, node, err)}
	}
	files := make([]string, 0, len(sums))
	for rel := range sums {
		files = append(files, rel)
	}
	sort.Strings(files)
	report := []string{
		fmt.Sprintf("claim demo/sample -> %s on %s, staged and published in %s (NodeStageVolume + NodePublishVolume, as kubelet)", pv.Name, node, took),
		"published at " + m.TargetPath,
	}
	for _, f := range files {
		report = append(report, fmt.Sprintf("  %-24s sha256 %s…  matches the S3 object", f, sums[f][:16]))
	}
	return report
}
