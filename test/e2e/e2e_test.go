package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
)

const (
	mib = int64(1) << 20
	// The fast pool of node-a is too small for claimFitsOnlyB; node-b's is not. Only node-a
	// has a bulk pool. node-b's fast pool keeps the scenarios' claims (fits-only-b's 300 MiB, the
	// LWS claims wherever the scheduler puts them) and still has room above the cache watermark
	// for the datasets the later scenarios stage there.
	nodeA = "node-a"
	nodeB = "node-b"
)

var nodes = []cluster.NodeSpec{
	{Name: nodeA, Pools: []cluster.PoolSpec{
		{Name: "fast", Size: 256 * mib, Labels: map[string]string{"media": "ssd"}},
		{Name: "bulk", Size: 512 * mib, Labels: map[string]string{"media": "hdd"}},
	}},
	{Name: nodeB, Pools: []cluster.PoolSpec{
		{Name: "fast", Size: 768 * mib, Labels: map[string]string{"media": "ssd"}},
	}},
}

// TestE2E installs deploy/csi, starts two simulated nodes and runs every scenario against them,
// in order: later ones see the volumes earlier ones made, as in a real cluster.
func TestE2E(t *testing.T) {
	b := binaries(t)
	cp := framework.Shared(t)
	cluster.CreateNamespace(t, cp)
	deployDryRun(t, cp)
	c := cluster.Start(t, cp, cluster.Options{
		Nodes: nodes,
		Node: cluster.NodeOptions{
			Bins:                 b,
			PoolCheckInterval:    time.Second,
			CapacityPollInterval: 2 * time.Second,
			SidecarResync:        5 * time.Second,
		},
	})
	// The example class, exactly as users get it.
	framework.ApplyManifests(t, cp, filepath.Join(cluster.DeployDir(), "examples", "storageclass-fast.yaml"))
	framework.ApplyYAML(t, cp, `
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: cistern-bulk}
provisioner: cistern.csi.dev
volumeBindingMode: WaitForFirstConsumer
parameters: {pool: bulk}
`)
	ns := framework.CreateNamespace(t, cp, "e2e")
	// Pods are refused until kube-controller-manager has made the namespace's ServiceAccount.
	eventually(t, time.Minute, "ServiceAccount default in "+ns, func(ctx context.Context) error {
		_, err := cp.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	s := &scenario{c: c, cp: cp, ns: ns}

	t.Run("PoolTargetedClaimPinnedToNode", s.poolTargetedClaim)
	t.Run("WaitForFirstConsumerFollowsScheduler", s.followsScheduler)
	t.Run("TooLargeClaimPendingResourceExhausted", s.tooLarge)
	t.Run("CapacityObjectsMatchPools", s.capacityMatchesPools)
	t.Run("StoragePoolObjects", s.storagePools)
	t.Run("PoolShrinkPropagates", s.poolShrink)
	t.Run("LeaderWorkerSetClaims", s.leaderWorkerSet)
	t.Run("DatasetStagedOnNode", s.dataset)
	t.Run("DatasetFanOut", s.datasetFanOut)
	t.Run("DatasetFanOutStartingTogether", s.datasetFanOutTogether)
	t.Run("PeerPortServesOnlyNodePlugins", s.peerPort)
	t.Run("VolumeManagerReplicas", s.volumeManager)
	t.Run("NodeServiceAccountLeastPrivilege", s.rbac)
	t.Run("NodeEventsRoleNamespaced", s.nodeEventsRole)
	t.Run("WorkloadControllerSecretsByName", s.controllerRBAC)
	t.Run("ControllerMetricsNeedAuthorization", s.controllerMetrics)
	// Last: it grants the node ServiceAccount the resizer's ClusterRole while it runs.
	t.Run("ClaimExpandedThroughResizer", s.expansion)
}

type scenario struct {
	c  *cluster.Cluster
	cp *framework.ControlPlane
	ns string
}

// poolTargetedClaim: a claim of class cistern-fast (pool: fast) used by a pod that must run on
// node-a gets a volume in node-a's fast pool, and its PV is pinned to node-a by the topology key.
func (s *scenario) poolTargetedClaim(t *testing.T) {
	cs := s.cp.Client
	if _, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx(t), newClaim("pinned", "cistern-fast", "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := newPod("pinned", "pinned", map[string]string{corev1.LabelHostname: nodeA})
	if _, err := cs.CoreV1().Pods(s.ns).Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := boundPV(t, cs, s.ns, "pinned")
	if got := cluster.TopologyOf(pv); got != nodeA {
		t.Errorf("PV %s pinned to %q, want %q", pv.Name, got, nodeA)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != consts.DriverName || !strings.HasPrefix(pv.Spec.CSI.VolumeHandle, "fast-") {
		t.Fatalf("PV %s: CSI source %+v, want a %s volume in pool fast", pv.Name, pv.Spec.CSI, consts.DriverName)
	}
	img := filepath.Join(s.c.Nodes[nodeA].Pools["fast"], ".cistern", "volumes", pv.Spec.CSI.VolumeHandle+".img")
	if _, err := os.Stat(img); err != nil {
		t.Errorf("volume image not in node-a's fast pool: %v", err)
	}
	if got := scheduledNode(t, cs, s.ns, "pinned"); got != nodeA {
		t.Errorf("pod on %s, want %s", got, nodeA)
	}
}

// followsScheduler: with no node constraint, the scheduler picks the node from the
// CSIStorageCapacity objects (only node-b's fast pool holds 300Mi; only node-a has a bulk
// pool), and the volume is provisioned on whatever node it picked.
func (s *scenario) followsScheduler(t *testing.T) {
	cs := s.cp.Client
	for _, tc := range []struct{ name, class, size, want string }{
		{"fits-only-b", "cistern-fast", "300Mi", nodeB},
		{"bulk-only-a", "cistern-bulk", "100Mi", nodeA},
	} {
		if _, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx(t), newClaim(tc.name, tc.class, tc.size), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Pods(s.ns).Create(ctx(t), newPod(tc.name, tc.name, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ name, want string }{{"fits-only-b", nodeB}, {"bulk-only-a", nodeA}} {
		pv := boundPV(t, cs, s.ns, tc.name)
		node := scheduledNode(t, cs, s.ns, tc.name)
		if node != tc.want {
			t.Errorf("%s: scheduler chose %s, want %s (the only node with room)", tc.name, node, tc.want)
		}
		if got := cluster.TopologyOf(pv); got != node {
			t.Errorf("%s: PV pinned to %q but the pod runs on %q", tc.name, got, node)
		}
	}
}

// tooLarge: a claim no pool can hold. Marked for node-a as the scheduler would, node-a's
// provisioner tries, the driver answers ResourceExhausted, and the claim stays Pending with that
// event (the provisioner hands it back to the scheduler instead of giving up).
func (s *scenario) tooLarge(t *testing.T) {
	cs := s.cp.Client
	claim := newClaim("too-large", "cistern-fast", "4Gi")
	claim.Annotations = map[string]string{"volume.kubernetes.io/selected-node": nodeA}
	if _, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx(t), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "ResourceExhausted event on claim too-large", func(ctx context.Context) error {
		events, err := cs.CoreV1().Events(s.ns).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.kind": "PersistentVolumeClaim", "involvedObject.name": "too-large"}.String(),
		})
		if err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.Reason == "ProvisioningFailed" && strings.Contains(e.Message, "ResourceExhausted") {
				t.Logf("event: %s: %s", e.Reason, e.Message)
				return nil
			}
		}
		return errorf("%d events, none ProvisioningFailed with ResourceExhausted", len(events.Items))
	})
	pvc, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx(t), "too-large", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending {
		t.Errorf("claim too-large is %s, want Pending", pvc.Status.Phase)
	}
}

// capacityObjects returns the CSIStorageCapacity of class for node, if any.
func (s *scenario) capacityObject(ctx context.Context, class, node string) (*storagev1.CSIStorageCapacity, error) {
	list, err := s.cp.Client.StorageV1().CSIStorageCapacities(cluster.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i, c := range list.Items {
		if c.StorageClassName == class && c.NodeTopology != nil && c.NodeTopology.MatchLabels[consts.TopologyKey] == node {
			return &list.Items[i], nil
		}
	}
	return nil, errorf("no CSIStorageCapacity for class %s on node %s", class, node)
}

// capacityMatchesPools: every (node, class) has a CSIStorageCapacity equal to what the node's
// driver reports for that class's pool (0 where the node has no such pool), owned by the node's
// DaemonSet pod.
func (s *scenario) capacityMatchesPools(t *testing.T) {
	classes := map[string]map[string]string{"cistern-fast": {"pool": "fast"}, "cistern-bulk": {"pool": "bulk"}}
	for _, node := range s.c.NodeNames {
		conn := csiConn(t, s.c.Nodes[node].Socket)
		for class, params := range classes {
			eventually(t, time.Minute, "capacity of "+class+" on "+node, func(ctx context.Context) error {
				obj, err := s.capacityObject(ctx, class, node)
				if err != nil {
					return err
				}
				want, err := getCapacity(ctx, conn, params, consts.TopologyKey, node)
				if err != nil {
					return err
				}
				if obj.Capacity == nil || obj.Capacity.Value() != want.AvailableCapacity {
					return errorf("CSIStorageCapacity %s has %v, driver reports %d", obj.Name, obj.Capacity, want.AvailableCapacity)
				}
				if want.MaximumVolumeSize != nil && (obj.MaximumVolumeSize == nil || obj.MaximumVolumeSize.Value() != want.MaximumVolumeSize.Value) {
					return errorf("CSIStorageCapacity %s maximumVolumeSize %v, driver reports %d", obj.Name, obj.MaximumVolumeSize, want.MaximumVolumeSize.Value)
				}
				if len(obj.OwnerReferences) != 1 || obj.OwnerReferences[0].Kind != "Pod" {
					return errorf("CSIStorageCapacity %s owners %v, want the node's DaemonSet pod", obj.Name, obj.OwnerReferences)
				}
				return nil
			})
		}
	}
	if obj, err := s.capacityObject(ctx(t), "cistern-bulk", nodeB); err == nil && obj.Capacity != nil && obj.Capacity.Value() != 0 {
		t.Errorf("node-b has no bulk pool, but CSIStorageCapacity says %s", obj.Capacity)
	}
}

// poolShrink: something else filling node-b's fast filesystem shows, within the driver's pool
// check and the provisioner's poll interval, in CSIStorageCapacity and in the StoragePool.
func (s *scenario) poolShrink(t *testing.T) {
	before, err := s.capacityObject(ctx(t), "cistern-fast", nodeB)
	if err != nil || before.Capacity == nil {
		t.Fatalf("capacity of cistern-fast on node-b: %v", err)
	}
	filler := filepath.Join(s.c.Nodes[nodeB].Pools["fast"], "filler")
	const fill = 96 * mib
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filler) })
	// Written, not fallocated: ext4 reserves blocks for an fallocated file too, but writing makes
	// no assumption about the filesystem.
	buf := make([]byte, mib)
	for range fill / mib {
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "CSIStorageCapacity of node-b shrinking", func(ctx context.Context) error {
		now, err := s.capacityObject(ctx, "cistern-fast", nodeB)
		if err != nil {
			return err
		}
		if drop := before.Capacity.Value() - now.Capacity.Value(); drop < fill-4*mib {
			return errorf("capacity %s -> %s, dropped %d MiB, want about %d", before.Capacity, now.Capacity, drop/mib, fill/mib)
		}
		return nil
	})
	eventually(t, time.Minute, "StoragePool of node-b's fast pool shrinking", func(ctx context.Context) error {
		now, err := s.capacityObject(ctx, "cistern-fast", nodeB)
		if err != nil {
			return err
		}
		pool, err := s.storagePool(ctx, "fast", nodeB)
		if err != nil {
			return err
		}
		avail, _, _ := unstructuredString(pool.Object, "status", "capacity", "available")
		q, err := resource.ParseQuantity(avail)
		if err != nil {
			return errorf("StoragePool %s status.capacity.available %q: %v", pool.GetName(), avail, err)
		}
		if diff := q.Value() - now.Capacity.Value(); diff > 8*mib || diff < -8*mib { // the driver keeps 1% of a pool free
			return errorf("StoragePool %s available %s, CSIStorageCapacity %s", pool.GetName(), &q, now.Capacity)
		}
		return nil
	})
}

// podNodes returns the pods of the test namespace matching selector, by name.
func (s *scenario) podNodes(ctx context.Context, selector string) (map[string]*corev1.Pod, error) {
	pods, err := s.cp.Client.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	m := map[string]*corev1.Pod{}
	for i := range pods.Items {
		m[pods.Items[i].Name] = &pods.Items[i]
	}
	return m, nil
}
