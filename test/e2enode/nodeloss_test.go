package e2enode

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/cistern-csi/cistern/pkg/apis/data/v1alpha1"
	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/pkg/workloads/nodeloss"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/framework/realnode"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

const (
	// nodeLossGrace is the workload-controller's --node-loss-grace-period here, and
	// nodeMonitorGrace kube-controller-manager's --node-monitor-grace-period (how long before an
	// unreachable node's Ready turns Unknown): both short, so that the test waits little, and
	// above kubelet's lease renewal (10 s), so that a busy machine does not lose a node by chance.
	nodeLossGrace    = 20 * time.Second
	nodeMonitorGrace = "20s"
	// nodeLossTimeout bounds each wait for the group to come back on the other node.
	nodeLossTimeout = 4 * time.Minute
	nodeLossLWS     = "nl"
	// csiPodVolumes is where kubelet publishes a pod's CSI volumes, in each node.
	csiPodVolumes = realnode.KubeletRootDir + "/pods"
)

// nodeLossNode is one node of TestLWSNodeLoss: its namespaces, kubelet and Cistern's plugin.
type nodeLossNode struct {
	name    string
	netns   *realnode.NetnsNode
	kubelet *realnode.Kubelet
	cistern *realnode.CisternNode
	sidecar *framework.Process
}

// TestLWSNodeLoss: a LeaderWorkerSet group on claims of an S3 dataset (node-local volumes, pinned to
// the node that staged them) runs on one of two real kubelet nodes, each in its own network
// namespace with containerd and Cistern's node plugin; the group's pods write to their volumes.
// Then its node is lost, twice, as the node-loss policy (docs/workloads.md, "Node loss") defines
// it, and each time the group is Ready again on the other node on new claims whose data is the
// dataset exactly, fresh from the source (what the pods wrote stayed on the lost node):
//
//   - unreachable: the node's link is cut (kubelet and the pods keep running, unseen); its Ready
//     turns Unknown, the grace period passes, the claims are released; then the link comes back,
//     the node is Ready again and its kubelet tears down the pods the cluster no longer has;
//   - deleted: the other node's kubelet and plugin stop and its Node is deleted.
func TestLWSNodeLoss(t *testing.T) {
	requireMachine(t)
	lockHost(t)
	bins := realnode.FindBinaries(t)
	bins.RequireImages(t, "pause", "checker", "controller")
	root, err := realnode.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := netnsNodesDir(t, "cistern-nodeloss-")
	begin := time.Now()

	ca := realnode.NewNodeCA(t, dir)
	cp := framework.StartControlPlane(t, framework.Options{
		ControllerManager:     true,
		Scheduler:             true,
		APIServerArgs:         []string{"--client-ca-file=" + ca.CertFile},
		ControllerManagerArgs: []string{"--node-monitor-grace-period=" + nodeMonitorGrace, "--node-monitor-period=2s"},
	})
	serveKubernetesService(t, cp)
	ctx := context.Background()

	// The dataset on S3, which the nodes reach through the host, at a port of the kubernetes
	// Service address (their one route out).
	s3 := testpeers.StartS3(t, "")
	s3.Bucket(t, datasetBucket)
	files := uploadDataset(t, s3)
	ports, err := framework.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	s3Addr := net.JoinHostPort(framework.KubernetesServiceIP, fmt.Sprint(ports[0]))
	relayTCP(t, s3Addr, strings.TrimPrefix(s3.Endpoint, "http://"))

	init := filepath.Join(dir, "init")
	build := testutil.GoBuild(init, "./pause")
	build.Dir = filepath.Join(root, "hack", "images")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building hack/images/pause: %v\n%s", err, out)
	}
	realnode.CreateStorageObjects(t, cp)
	// Each node's storagepool-sidecar publishes its pools and what its cache holds, which the
	// VolumeManager waits for.
	sidecar := filepath.Join(dir, "storagepool-sidecar")
	if out, err := testutil.GoBuild(sidecar, "github.com/cistern-csi/cistern/cmd/storagepool-sidecar").CombinedOutput(); err != nil {
		t.Fatalf("building the storagepool-sidecar: %v\n%s", err, out)
	}
	var nodes []*nodeLossNode
	for i := range 2 {
		n := &nodeLossNode{name: fmt.Sprintf("cistern-nodeloss-%c", 'a'+i)}
		n.netns = realnode.StartNetnsNode(t, dir, i, n.name, k8sE2EPoolDir, 4<<30, init)
		cd := realnode.StartContainerd(t, bins, filepath.Join(n.netns.Dir, "containerd"), realnode.ContainerdOptions{
			// The VolumeManager's stager pods run the controller's image.
			Imported:  []string{"pause", "checker", "controller"},
			PodRoutes: []string{framework.KubernetesServiceIP + "/32"},
			Subnet:    n.netns.PodSubnet, Gateway: n.netns.PodGateway,
			LogName: "containerd-" + n.name, Enter: n.netns.Enter,
		})
		n.kubelet = realnode.StartKubeletWith(t, cp, ca, bins.Kubelet, realnode.KubeletOptions{
			NodeName: n.name, RootDir: realnode.KubeletRootDir, RuntimeSocket: cd.Socket, CgroupRoot: n.netns.CgroupRoot,
			LogName: "kubelet-" + n.name, Enter: n.netns.Enter, NodeIP: n.netns.NodeIP,
			Server: "https://" + net.JoinHostPort(framework.KubernetesServiceIP, "443"),
		})
		realnode.WaitNodeReady(t, cp, n.kubelet, n.name, 2*time.Minute)
		n.cistern = realnode.NewNetnsCisternNode(t, bins, n.netns, k8sE2EPoolDir)
		// The S3 server is plain HTTP, at an address that is not the node's loopback.
		n.cistern.DriverArgs = []string{"--s3-allow-plain-http"}
		n.cistern.StartDriver(t)
		n.cistern.StartProvisioner(t, cp)
		n.cistern.WaitRegistered(t, cp)
		n.sidecar = framework.StartProcess(t, "storagepool-sidecar-"+n.name, sidecar,
			"--kubeconfig="+cp.Kubeconfig, "--csi-address="+n.cistern.SocketForHost(), "--node-name="+n.name,
			"--resync-period=1m", "--v=3")
		nodes = append(nodes, n)
	}
	t.Logf("2 nodes Ready with Cistern's plugin %s after start", time.Since(begin).Round(time.Second))

	if err := runWorkloadController(t, cp, bins, func(c *workloads.Config) {
		c.NodeLoss = workloads.NodeLossConfig{Enabled: true, GracePeriod: nodeLossGrace}
	}); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(cp.Config, client.Options{Scheme: workloads.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	ns := framework.CreateNamespace(t, cp, "nodeloss")
	if _, err := cp.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: datasetSecret},
		StringData: map[string]string{"accessKeyID": s3.AccessKey, "secretAccessKey": s3.SecretKey},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc := nodeLossStorageClass(t, cp, ns, "http://"+s3Addr)
	results := filepath.Join(dir, "results")
	if err := os.Mkdir(results, 0o777); err != nil {
		t.Fatal(err)
	}
	framework.ApplyYAML(t, cp, nodeLossManifest(ns, sc, bins.Images["checker"].Ref, results))
	// Runs before the nodes stop: the live node's kubelet unmounts the group's volumes through
	// its driver.
	t.Cleanup(func() { removeGroup(t, cp, cl, ns, nodes) })

	g := &nodeLossGroup{t: t, cp: cp, cl: cl, ns: ns, results: results, files: files}
	first := g.waitOn(nodes[0].name, nodes[1].name)
	t.Logf("group Ready on %s %s after start", first.node, time.Since(begin).Round(time.Second))
	g.checkData(first)
	// The pods write to their volumes (the checker's heartbeat): data that is not the
	// dataset's, which a fresh claim does not have.
	g.waitWritten(first)
	lost, other := nodes[0], nodes[1]
	if first.node == other.name {
		lost, other = other, lost
	}
	// A VolumeManager copy of the same dataset on the group's node, which the VolumeManager
	// replaces by another node when that one is lost (docs/workloads.md, "Node replacement"): the
	// other node is cordoned while the copy is placed, so that both losses move it.
	cordon(t, cp, other.name, true)
	copies := &volumeManagerCopy{cl: cl, ns: ns}
	copies.create(t, "http://"+s3Addr)
	copyOn := copies.waitOn(t, lost.name)
	cordon(t, cp, other.name, false)
	t.Logf("VolumeManager copy Ready on %s", copyOn.node)

	t.Run("unreachable", func(t *testing.T) {
		g.t = t
		start := time.Now()
		lost.netns.Disconnect(t)
		connected := false
		// Before the group's removal: the node's kubelet must reach the cluster to unmount.
		t.Cleanup(func() {
			if !connected {
				lost.netns.Reconnect(t)
			}
		})
		waitNodeReady(t, cp, lost.name, corev1.ConditionUnknown)
		t.Logf("node %s unreachable: Ready=Unknown %s after its link was cut", lost.name, time.Since(start).Round(time.Second))
		back := g.waitOn(other.name)
		t.Logf("group Ready on %s %s after the link was cut", back.node, time.Since(start).Round(time.Second))
		g.checkFresh(first, back)
		g.checkReleased("Ready=Unknown", first)
		copyOn = copies.checkAfterLoss(t, copyOn, lost.name, other.name)

		// The node comes back: it is Ready again, and its kubelet tears down the pods the
		// cluster no longer has, unmounting their volumes through the driver.
		start = time.Now()
		lost.netns.Reconnect(t)
		connected = true
		waitNodeReady(t, cp, lost.name, corev1.ConditionTrue)
		waitUntainted(t, cp, lost.name)
		err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
			return len(lost.netns.MountsUnder(t, csiPodVolumes)) == 0, nil
		})
		if err != nil {
			t.Fatalf("node %s back: its kubelet left the lost pods' volumes mounted: %v", lost.name, lost.netns.MountsUnder(t, csiPodVolumes))
		}
		t.Logf("node %s back: Ready, untainted and its lost pods' volumes unmounted %s after its link came back", lost.name, time.Since(start).Round(time.Second))
		first = back
	})
	if t.Failed() {
		return
	}
	g.waitWritten(first)

	t.Run("deleted", func(t *testing.T) {
		g.t = t
		gone, survivor := other, lost
		start := time.Now()
		gone.kubelet.Stop()
		gone.cistern.Stop()
		gone.sidecar.Stop()
		if err := cp.Client.CoreV1().Nodes().Delete(ctx, gone.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		back := g.waitOn(survivor.name)
		t.Logf("group Ready on %s %s after node %s was deleted", back.node, time.Since(start).Round(time.Second), gone.name)
		g.checkFresh(first, back)
		g.checkReleased("(deleted)", first)
		copies.checkAfterLoss(t, copyOn, gone.name, survivor.name)
	})
}

// nodeLossStorageClass creates the dataset's StorageClass, with credentials for staging at
// CreateVolume and NodeStageVolume, and endpoint as the nodes reach the S3 server.
func nodeLossStorageClass(t *testing.T, cp *framework.ControlPlane, ns, endpoint string) string {
	t.Helper()
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "cistern-dataset-nodeloss"},
		Provisioner: consts.DriverName,
		Parameters: map[string]string{
			"pool": realnode.PoolName, "source": "s3://" + datasetBucket + "/" + datasetPrefix,
			"endpoint": endpoint, "pathStyle": "true",
			"csi.storage.k8s.io/provisioner-secret-name":      datasetSecret,
			"csi.storage.k8s.io/provisioner-secret-namespace": ns,
			"csi.storage.k8s.io/node-stage-secret-name":       datasetSecret,
			"csi.storage.k8s.io/node-stage-secret-namespace":  ns,
		},
		VolumeBindingMode: &wffc,
	}
	if _, err := cp.Client.StorageV1().StorageClasses().Create(context.Background(), sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return sc.Name
}

// nodeLossManifest is a LeaderWorkerSet of one group, a leader and a worker on one node, each
// with its own claim of the dataset; every pod records the sha256 of each file on its claim under
// its name and UID, then writes to it every second.
func nodeLossManifest(ns, sc, image, results string) string {
	return checkerLWS{name: nodeLossLWS, ns: ns, class: sc, image: image, results: results, storage: "64Mi", exclusive: true,
		args: "-out, /results/$(POD_NAME)-$(POD_UID), -dir, /data, -hash, -heartbeat, 1s"}.manifest()
}

// nodeLossGroup is the test's LeaderWorkerSet group and what its pods must see.
type nodeLossGroup struct {
	t       *testing.T
	cp      *framework.ControlPlane
	cl      client.Client
	ns      string
	results string
	files   map[string]string
}

// groupState is the group Ready on one node: its pods (name -> UID) and their claims' volumes.
type groupState struct {
	node    string
	pods    map[string]string
	volumes map[string]string // claim -> PersistentVolume
}

// waitOn waits until the group is Ready on one of nodes: the LeaderWorkerSet counts it ready, its
// two pods run Ready there, and their claims are bound to volumes pinned to that node.
func (g *nodeLossGroup) waitOn(nodes ...string) groupState {
	g.t.Helper()
	var st groupState
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, nodeLossTimeout, true, func(ctx context.Context) (bool, error) {
		var err error
		if st, err = g.state(ctx); ctx.Err() != nil {
			return false, nil // keep what the group waited for before the deadline
		}
		last = err
		if last == nil && !slices.Contains(nodes, st.node) {
			last = fmt.Errorf("group on %s, want one of %v", st.node, nodes)
		}
		return last == nil, nil
	})
	if err != nil {
		// On one line: the make target keeps only the first line of each log.
		g.t.Fatalf("group not Ready on %v: %v; %s", nodes, last, strings.ReplaceAll(g.describe(), "\n", " | "))
	}
	return st
}

func (g *nodeLossGroup) state(ctx context.Context) (groupState, error) {
	st := groupState{pods: map[string]string{}, volumes: map[string]string{}}
	var lws v1alpha1.LeaderWorkerSet
	if err := g.cl.Get(ctx, client.ObjectKey{Namespace: g.ns, Name: nodeLossLWS}, &lws); err != nil {
		return st, err
	}
	if lws.Status.ReadyReplicas != 1 {
		return st, fmt.Errorf("LeaderWorkerSet: %d groups ready", lws.Status.ReadyReplicas)
	}
	pods, err := g.cp.Client.CoreV1().Pods(g.ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.SetNameLabelKey + "=" + nodeLossLWS})
	if err != nil {
		return st, err
	}
	if len(pods.Items) != 2 {
		return st, fmt.Errorf("%d pods, want 2", len(pods.Items))
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || !podReady(&p) {
			return st, fmt.Errorf("pod %s on %q: %s, ready %v, deleting %v", p.Name, p.Spec.NodeName, p.Status.Phase, podReady(&p), p.DeletionTimestamp != nil)
		}
		if st.node != "" && p.Spec.NodeName != st.node {
			return st, fmt.Errorf("pods on %s and %s", st.node, p.Spec.NodeName)
		}
		st.node = p.Spec.NodeName
		st.pods[p.Name] = string(p.UID)
		claim := "data-" + p.Name
		pvc, err := g.cp.Client.CoreV1().PersistentVolumeClaims(g.ns).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return st, err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return st, fmt.Errorf("claim %s %s", claim, pvc.Status.Phase)
		}
		pv, err := g.cp.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			return st, err
		}
		if pinned := nodeloss.PinnedNode(pv); pinned != st.node {
			return st, fmt.Errorf("claim %s on volume %s pinned to %q, its pod on %s", claim, pv.Name, pinned, st.node)
		}
		st.volumes[claim] = pv.Name
	}
	return st, nil
}

// resultName is where a pod of the group writes its results.
func resultName(pod, uid string) string { return pod + "-" + uid }

// checkData checks that each pod saw the dataset exactly, byte for byte.
func (g *nodeLossGroup) checkData(st groupState) {
	g.t.Helper()
	for pod, uid := range st.pods {
		d := readResult(g.t, g.results, resultName(pod, uid)).Dirs[0]
		if d.HashError != "" {
			g.t.Errorf("%s: reading its claim: %s", pod, d.HashError)
		}
		if !maps.Equal(d.Files, g.files) {
			g.t.Errorf("%s on %s sees data that is not the dataset's:\n got  %v\n want %v", pod, st.node, d.Files, g.files)
		}
	}
}

// waitWritten waits for each pod's first write to its claim (the checker's heartbeat).
func (g *nodeLossGroup) waitWritten(st groupState) {
	g.t.Helper()
	for pod, uid := range st.pods {
		var hb struct {
			Seq int64 `json:"seq"`
			OK  bool  `json:"ok"`
		}
		readJSON(g.t, filepath.Join(g.results, resultName(pod, uid)+".heartbeat.json"), &hb)
		if !hb.OK {
			g.t.Errorf("%s could not write to its claim: %+v", pod, hb)
		}
	}
}

// checkFresh checks that the group came back as new pods on new claims, whose data is the
// dataset's alone: not what the pods before wrote on the lost node.
func (g *nodeLossGroup) checkFresh(before, after groupState) {
	g.t.Helper()
	for pod, uid := range after.pods {
		if before.pods[pod] == uid {
			g.t.Errorf("pod %s is the one before the loss (UID %s)", pod, uid)
		}
	}
	for claim, pv := range after.volumes {
		if before.volumes[claim] == pv {
			g.t.Errorf("claim %s still on volume %s of the lost node %s", claim, pv, before.node)
		}
	}
	g.checkData(after)
}

// checkReleased checks that the controller released each claim of the group before the loss
// once, with a NodeLost Event on it that says why.
func (g *nodeLossGroup) checkReleased(why string, before groupState) {
	g.t.Helper()
	events, err := g.cp.Client.EventsV1().Events(g.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		g.t.Fatal(err)
	}
	released := map[string]int{}
	for _, e := range events.Items {
		if e.Reason == "NodeLost" && e.Regarding.Kind == "PersistentVolumeClaim" && strings.Contains(e.Note, "node "+before.node+" is lost "+"("+strings.Trim(why, "()")) {
			released[e.Regarding.Name]++
		}
	}
	for claim := range before.volumes {
		if released[claim] != 1 {
			g.t.Errorf("claim %s: %d NodeLost Events for node %s (%s), want 1; all: %v", claim, released[claim], before.node, why, released)
		}
	}
}

func (g *nodeLossGroup) describe() string {
	var b strings.Builder
	pods, _ := g.cp.Client.CoreV1().Pods(g.ns).List(context.Background(), metav1.ListOptions{})
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s on %q: %s\n%s", p.Name, p.Spec.NodeName, p.Status.Phase, describe(g.cp, g.ns, "Pod", p.Name, &p))
	}
	claims, _ := g.cp.Client.CoreV1().PersistentVolumeClaims(g.ns).List(context.Background(), metav1.ListOptions{})
	for _, c := range claims.Items {
		fmt.Fprintf(&b, "claim %s: %s on %q (deleting %v)\n%s", c.Name, c.Status.Phase, c.Spec.VolumeName, c.DeletionTimestamp != nil,
			describe(g.cp, g.ns, "PersistentVolumeClaim", c.Name, nil))
	}
	return b.String()
}

// waitNodeReady waits until node's Ready condition has status want.
func waitNodeReady(t *testing.T, cp *framework.ControlPlane, node string, want corev1.ConditionStatus) {
	t.Helper()
	var last corev1.ConditionStatus
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = c.Status
			}
		}
		return last == want, nil
	})
	if err != nil {
		t.Fatalf("node %s: Ready=%s, want %s", node, last, want)
	}
}

// waitUntainted waits until kube-controller-manager has taken the not-ready and unreachable
// taints off node, so that pods can go there again.
func waitUntainted(t *testing.T, cp *framework.ControlPlane, node string) {
	t.Helper()
	var taints []corev1.Taint
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		taints = n.Spec.Taints
		for _, tt := range taints {
			if tt.Key == corev1.TaintNodeUnreachable || tt.Key == corev1.TaintNodeNotReady {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("node %s still tainted: %v", node, taints)
	}
}

// removeGroup deletes the LeaderWorkerSet and the VolumeManager and waits for its pods to go and for every live node's
// kubelet to unmount their volumes, while the drivers still run.
func removeGroup(t *testing.T, cp *framework.ControlPlane, cl client.Client, ns string, nodes []*nodeLossNode) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lws := &v1alpha1.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: nodeLossLWS}}
	if err := cl.Delete(ctx, lws, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil && !apierrors.IsNotFound(err) {
		t.Logf("cleanup: deleting the LeaderWorkerSet: %v", err)
	}
	vm := &datav1alpha1.VolumeManager{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "copies"}}
	if err := cl.Delete(ctx, vm); err != nil && !apierrors.IsNotFound(err) {
		t.Logf("cleanup: deleting the VolumeManager: %v", err)
	}
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) > 0 {
			return false, nil
		}
		for _, n := range nodes {
			if _, err := cp.Client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{}); err == nil && len(n.netns.MountsUnder(t, csiPodVolumes)) > 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("cleanup: the group's pods or their mounts are still there: %v", err)
	}
}

// volumeManagerCopy is the test's VolumeManager: one read-only copy of the dataset on one node.
type volumeManagerCopy struct {
	cl client.Client
	ns string
}

// copyState is where the copy is Ready, and the claim pods mount it by.
type copyState struct{ node, claim string }

func (v *volumeManagerCopy) create(t *testing.T, endpoint string) {
	t.Helper()
	capacity := resource.MustParse("64Mi")
	vm := &datav1alpha1.VolumeManager{
		ObjectMeta: metav1.ObjectMeta{Namespace: v.ns, Name: "copies"},
		Spec: datav1alpha1.VolumeManagerSpec{VolumeConfigs: []datav1alpha1.VolumeConfig{{
			ID: "model", Replicas: 1, SourceType: datav1alpha1.SourceS3,
			SourceURL: "s3://" + datasetBucket + "/" + datasetPrefix, AccessMode: corev1.ReadOnlyMany, Capacity: &capacity,
			Options: map[string]string{"endpoint": endpoint, "pathStyle": "true", "secretName": datasetSecret}}}},
	}
	if err := v.cl.Create(context.Background(), vm); err != nil {
		t.Fatal(err)
	}
}

// waitOn waits until the VolumeManager is Running with its copy Ready on one of nodes.
func (v *volumeManagerCopy) waitOn(t *testing.T, nodes ...string) copyState {
	t.Helper()
	var st copyState
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, nodeLossTimeout, true, func(ctx context.Context) (bool, error) {
		var vm datav1alpha1.VolumeManager
		if err := v.cl.Get(ctx, client.ObjectKey{Namespace: v.ns, Name: "copies"}, &vm); err != nil {
			return false, nil
		}
		last = fmt.Sprintf("%s (%s) %+v", vm.Status.State, vm.Status.Message, vm.Status.Volumes)
		if vm.Status.State != datav1alpha1.StateRunning || len(vm.Status.Volumes) != 1 {
			return false, nil
		}
		vol := vm.Status.Volumes[0]
		if len(vol.Nodes) != 1 || vol.Nodes[0].State != datav1alpha1.NodeReady || !slices.Contains(nodes, vol.Nodes[0].Name) ||
			vol.VolumeSource.PersistentVolumeClaim == nil {
			return false, nil
		}
		st = copyState{node: vol.Nodes[0].Name, claim: vol.VolumeSource.PersistentVolumeClaim.ClaimName}
		return true, nil
	})
	if err != nil {
		t.Fatalf("VolumeManager not Running with its copy on %v: %s", nodes, last)
	}
	return st
}

// checkAfterLoss checks the copy after node lost is lost: moved to other, on a new claim, if it
// was on lost; else where it was.
func (v *volumeManagerCopy) checkAfterLoss(t *testing.T, before copyState, lost, other string) copyState {
	t.Helper()
	if before.node != lost {
		after := v.waitOn(t, before.node)
		if after != before {
			t.Errorf("VolumeManager copy on %s, not on the lost node %s, changed: %+v", before.node, lost, after)
		}
		return after
	}
	start := time.Now()
	after := v.waitOn(t, other)
	if after.claim == before.claim {
		t.Errorf("VolumeManager copy moved to %s on the claim it had on the lost node (%s)", other, before.claim)
	}
	t.Logf("VolumeManager copy Ready on %s, claim %s, %s after the group", after.node, after.claim, time.Since(start).Round(time.Second))
	return after
}

// cordon marks node unschedulable, or schedulable again.
func cordon(t *testing.T, cp *framework.ControlPlane, node string, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
	if _, err := cp.Client.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
