package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/test/framework"
)

// PoolSpec is one pool of a simulated node: an ext4 filesystem of Size bytes.
type PoolSpec struct {
	Name   string
	Size   int64
	Labels map[string]string
}

// NodeSpec is a simulated node.
type NodeSpec struct {
	Name  string
	Pools []PoolSpec
}

// Node is a simulated node with its components running.
type Node struct {
	Name string
	// Dir holds the node's pools, state, socket and the pools config.
	Dir    string
	Socket string
	// Pools maps pool name to its mount point.
	Pools       map[string]string
	PoolsConfig string
	// KubeletRoot stands for kubelet's root directory (the driver's --kubelet-root):
	// StageAndPublish mounts below it.
	KubeletRoot string
	// PeerAddress is the driver's peer port (loopback), MetricsAddress its /metrics.
	PeerAddress, MetricsAddress string

	Driver, Provisioner, Sidecar *framework.Process
}

// NodeOptions tunes the components for tests: short intervals make changes show quickly.
type NodeOptions struct {
	Bins Binaries
	// PoolCheckInterval is the driver's --pool-check-interval.
	PoolCheckInterval time.Duration
	// CapacityPollInterval is the provisioner's --capacity-poll-interval.
	CapacityPollInterval time.Duration
	// SidecarResync is the storagepool-sidecar's --resync-period.
	SidecarResync time.Duration
	// NoPeers starts the drivers without a peer port (no --peer-listen): no peer fan-out.
	NoPeers bool
}

// StartNode registers a Node and CSINode as kubelet and node-driver-registrar would, creates its
// pools, and starts the driver, the external-provisioner and the storagepool-sidecar for it. deploy/csi must be installed: the provisioner and sidecar run as
// its node ServiceAccount, and the provisioner owns its CSIStorageCapacity objects through the
// node's DaemonSet pod, as --capacity-ownerref-level=0 does in a real cluster.
func StartNode(t framework.TB, cp *framework.ControlPlane, spec NodeSpec, opts NodeOptions) *Node {
	t.Helper()
	dir := filepath.Join(t.TempDir(), spec.Name)
	n := &Node{
		Name:        spec.Name,
		Dir:         dir,
		Socket:      filepath.Join(dir, "csi", "csi.sock"),
		Pools:       map[string]string{},
		PoolsConfig: filepath.Join(dir, "pools.yaml"),
		KubeletRoot: filepath.Join(dir, "kubelet"),
	}
	for _, d := range []string{filepath.Dir(n.Socket), filepath.Join(dir, "state"), filepath.Join(dir, "pools")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	type poolEntry struct {
		Name   string            `json:"name"`
		Path   string            `json:"path"`
		Labels map[string]string `json:"labels,omitempty"`
	}
	var cfg struct {
		Pools []poolEntry `json:"pools"`
	}
	for _, p := range spec.Pools {
		mnt := MakePool(t, filepath.Join(dir, "pools"), p.Name, p.Size)
		n.Pools[p.Name] = mnt
		cfg.Pools = append(cfg.Pools, poolEntry{Name: p.Name, Path: mnt, Labels: p.Labels})
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.PoolsConfig, data, 0o644); err != nil {
		t.Fatal(err)
	}

	framework.CreateNode(t, cp, spec.Name, nil)

	// The node's components use a token bound to the DaemonSet pod scheduled to the node, as in
	// a cluster: deploy/csi's PersistentVolume policy checks the node named in it. The driver
	// also gets the pod's projected peer token, and serves peers on a loopback port of its own.
	pod := DaemonSetPod(t, cp, spec.Name)
	kubeconfig := framework.PodServiceAccountKubeconfig(t, cp, pod)
	peerToken := filepath.Join(dir, "peer-token")
	if err := os.WriteFile(peerToken, []byte(framework.PodServiceAccountToken(t, cp, pod, peer.Audience)), 0o600); err != nil {
		t.Fatal(err)
	}
	n.PeerAddress, n.MetricsAddress = framework.FreeAddr(t), framework.FreeAddr(t)
	peers := []string{"--peer-listen=" + n.PeerAddress, "--peer-advertise=" + n.PeerAddress, "--peer-token-file=" + peerToken}
	if opts.NoPeers {
		peers, n.PeerAddress = nil, ""
	}
	n.Driver = framework.StartCSIDriver(t, spec.Name+"-csi-driver", opts.Bins.Driver, n.Socket, append([]string{
		"--node-id=" + spec.Name,
		"--tenant-s3-endpoints=*", // test S3 servers are in test namespaces; the closed default has its own test
		"--mode=all",
		"--pools-config=" + n.PoolsConfig,
		"--state-dir=" + filepath.Join(dir, "state"),
		"--kubelet-root=" + n.KubeletRoot,
		"--pool-check-interval=" + orDefault(opts.PoolCheckInterval, 10*time.Second).String(),
		"--http-endpoint=" + n.MetricsAddress,
		"--kubeconfig=" + kubeconfig,
		"--v=3"}, peers...)...,
	)
	// Before anything else is stopped, release what the driver staged, so the pools unmount.
	t.Cleanup(func() {
		n.Driver.Stop()
		for _, mnt := range n.Pools {
			_ = ReleaseUnder(mnt)
		}
	})

	prov := exec.Command(opts.Bins.Provisioner,
		"--kubeconfig="+kubeconfig,
		"--csi-address="+n.Socket,
		"--node-deployment",
		"--enable-capacity",
		"--capacity-ownerref-level=0",
		"--strict-topology",
		"--extra-create-metadata",
		"--capacity-poll-interval="+orDefault(opts.CapacityPollInterval, time.Minute).String(),
		"--retry-interval-start=500ms",
		"--retry-interval-max=5s",
		"--v=4",
	)
	prov.Env = append(os.Environ(), "NODE_NAME="+spec.Name, "NAMESPACE="+Namespace, "POD_NAME="+pod.Name)
	n.Provisioner = framework.StartCommand(t, spec.Name+"-csi-provisioner", prov)

	n.Sidecar = framework.StartProcess(t, spec.Name+"-storagepool-sidecar", opts.Bins.Sidecar,
		"--kubeconfig="+kubeconfig,
		"--csi-address="+n.Socket,
		"--node-name="+spec.Name,
		"--resync-period="+orDefault(opts.SidecarResync, time.Minute).String(),
		"--v=3",
	)
	return n
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// DaemonSetPod waits for the node DaemonSet's pod on node (created by kube-controller-manager,
// scheduled by kube-scheduler, never run: no kubelet) and returns it once it is bound to the node.
func DaemonSetPod(t framework.TB, cp *framework.ControlPlane, node string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cistern-node"})
		if err != nil {
			return false, err
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.Spec.NodeName == node {
				pod = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("DaemonSet pod bound to node %s: %v", node, err)
	}
	return pod
}

// TopologyOf returns the node a PersistentVolume is pinned to by the driver's topology key.
func TopologyOf(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	var nodes []string
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == consts.TopologyKey && e.Operator == corev1.NodeSelectorOpIn {
				nodes = append(nodes, e.Values...)
			}
		}
	}
	return strings.Join(nodes, ",")
}
