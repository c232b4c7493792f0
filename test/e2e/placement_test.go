package e2e_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/workloads/placement"
	"github.com/cistern-csi/cistern/pkg/workloads/volumemanager"
	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil/cacheondisk"
)

// startPlacementCluster starts simulated nodes with one fast pool of poolSize each, whose
// stand-in kubelet mounts pods' volumes, and returns a scenario in a fresh namespace.
// intervals are the components' check and poll intervals (zero: their defaults).
func startPlacementCluster(t testing.TB, prefix string, names []string, poolSize int64, intervals cluster.NodeOptions) *scenario {
	t.Helper()
	intervals.Bins = binaries(t)
	cp := framework.Shared(t)
	cluster.CreateNamespace(t, cp)
	var specs []cluster.NodeSpec
	for _, n := range names {
		specs = append(specs, cluster.NodeSpec{Name: n, Pools: []cluster.PoolSpec{{Name: "fast", Size: poolSize}}})
	}
	c := cluster.Start(t, cp, cluster.Options{
		Nodes:        specs,
		Node:         intervals,
		MountVolumes: true,
		// A VolumeManager's stager pods mount its claim and exit.
		RunsToCompletion: func(p *corev1.Pod) bool { return p.Labels[volumemanager.LabelStager] == "true" },
	})
	return &scenario{c: c, cp: cp, ns: newNamespace(t, cp, prefix, nil)}
}

// newNamespace creates a namespace with labels and waits for its default ServiceAccount.
func newNamespace(t testing.TB, cp *framework.ControlPlane, prefix string, labels map[string]string) string {
	t.Helper()
	ns := framework.CreateNamespace(t, cp, prefix)
	if len(labels) > 0 {
		obj, err := cp.Client.CoreV1().Namespaces().Get(ctx(t), ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(obj.Labels, labels)
		if _, err := cp.Client.CoreV1().Namespaces().Update(ctx(t), obj, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Pods are refused until kube-controller-manager has made the namespace's ServiceAccount.
	eventually(t, time.Minute, "ServiceAccount default in "+ns, func(ctx context.Context) error {
		_, err := cp.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	return ns
}

// datasetClass creates a WaitForFirstConsumer class of the fast pool with an S3 source at
// url, whose node-stage secret (in ns) holds the server's credentials, and returns the
// dataset's ID as the driver computes it.
func datasetClass(t testing.TB, cp *framework.ControlPlane, ns, name, url string, s3 *cluster.S3) string {
	t.Helper()
	parameters := map[string]string{"pool": "fast", "source": url, "endpoint": s3.Endpoint, "pathStyle": "true",
		"csi.storage.k8s.io/node-stage-secret-name": "s3", "csi.storage.k8s.io/node-stage-secret-namespace": ns}
	p, err := yaml.Marshal(parameters)
	if err != nil {
		t.Fatal(err)
	}
	framework.ApplyYAML(t, cp, fmt.Sprintf(`
apiVersion: v1
kind: Secret
metadata: {name: s3, namespace: %s}
stringData: {accessKeyID: %s, secretAccessKey: %s}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: %s}
provisioner: cistern.csi.dev
volumeBindingMode: WaitForFirstConsumer
parameters:
%s`, ns, s3.AccessKey, s3.SecretKey, name, indent(string(p))))
	v, err := params.Parse(parameters, params.StorageClass)
	if err != nil {
		t.Fatal(err)
	}
	return v.Dataset.ID()
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n  ") + "\n"
}

// typedStoragePool is the StoragePool of pool on node as its Go type.
func (s *scenario) typedStoragePool(ctx context.Context, pool, node string) (*spapi.StoragePool, error) {
	u, err := s.storagePool(ctx, pool, node)
	if err != nil {
		return nil, err
	}
	var sp spapi.StoragePool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &sp); err != nil {
		return nil, err
	}
	return &sp, nil
}

// waitInventory waits until the fast pool's StoragePool on node lists exactly the datasets its
// cache holds on disk, and check says the disk holds what the test expects.
func (s *scenario) waitInventory(t testing.TB, node, what string, check func(disk map[string]cacheondisk.Dataset) error) {
	t.Helper()
	eventually(t, 3*time.Minute, "StoragePool fast of "+node+": "+what, func(ctx context.Context) error {
		disk, err := cacheondisk.Read(s.c.Nodes[node].Pools["fast"])
		if err != nil {
			return err
		}
		if err := check(disk); err != nil {
			return err
		}
		sp, err := s.typedStoragePool(ctx, "fast", node)
		if err != nil {
			return err
		}
		return cacheondisk.Matches(sp, disk)
	})
}

// runningPod creates a pod using claim (created with class) and waits until the stand-in kubelet
// has mounted its volume and reported it Running.
func (s *scenario) runningPod(t testing.TB, name, class string, nodeSelector map[string]string) *corev1.Pod {
	t.Helper()
	s.createClaimAndPod(t, name, class, "64Mi", nodeSelector)
	return s.waitRunning(t, name, 3*time.Minute)
}

func (s *scenario) createClaimAndPod(t testing.TB, name, class, size string, nodeSelector map[string]string) {
	t.Helper()
	cs := s.cp.Client
	if _, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx(t), newClaim(name, class, size), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(s.ns).Create(ctx(t), newPod(name, name, nodeSelector), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (s *scenario) waitRunning(t testing.TB, name string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, timeout, "pod "+name+" Running", func(ctx context.Context) error {
		p, err := s.cp.Client.CoreV1().Pods(s.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return errorf("phase %q on node %q", p.Status.Phase, p.Spec.NodeName)
		}
		pod = p
		return nil
	})
	return pod
}

// verifyPublished checks the files the pod's claim shows against the source.
func (s *scenario) verifyPublished(t testing.TB, pod *corev1.Pod, sums map[string]string) {
	t.Helper()
	pv := boundPV(t, s.cp.Client, s.ns, pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName)
	if err := cluster.VerifyFiles(s.c.PublishedPath(pod, pv.Name), sums); err != nil {
		t.Errorf("pod %s on %s: %v", pod.Name, pod.Spec.NodeName, err)
	}
}

// dataTerms returns the preferred terms the placement webhook added to a pod.
func dataTerms(pod *corev1.Pod) []corev1.PreferredSchedulingTerm {
	var out []corev1.PreferredSchedulingTerm
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		for _, term := range a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			if e := term.Preference.MatchExpressions; len(e) == 1 && e[0].Key == consts.TopologyKey {
				out = append(out, term)
			}
		}
	}
	return out
}

// deleteAll deletes the namespace's pods (the stand-in kubelet unpublishes them first) and
// claims, and waits until their volumes are gone.
func (s *scenario) deleteAll(t testing.TB) {
	t.Helper()
	cs := s.cp.Client
	if err := cs.CoreV1().Pods(s.ns).DeleteCollection(ctx(t), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "pods of "+s.ns+" gone", func(ctx context.Context) error {
		pods, err := cs.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) > 0 {
			return errorf("%v pods left (%v)", len(pods.Items), err)
		}
		return nil
	})
	claims, err := cs.CoreV1().PersistentVolumeClaims(s.ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().PersistentVolumeClaims(s.ns).DeleteCollection(ctx(t), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "volumes of "+s.ns+" deleted", func(ctx context.Context) error {
		for _, c := range claims.Items {
			if c.Spec.VolumeName == "" {
				continue
			}
			if _, err := cs.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return errorf("PV %s still there (%v)", c.Spec.VolumeName, err)
			}
		}
		return nil
	})
}

// TestPlacement runs pods with dataset claims on three simulated nodes whose stand-in kubelet
// mounts their volumes: once one node holds the dataset, pods that need it land there without
// any node affinity of their own; a pod whose dataset no node holds still schedules; and each
// node's StoragePool lists what its cache holds on disk, after staging and after an eviction.
func TestPlacement(t *testing.T) {
	const warmNode = "placement-b"
	names := []string{"placement-a", warmNode, "placement-c"}
	s := startPlacementCluster(t, "placement", names, 512*mib, cluster.NodeOptions{
		PoolCheckInterval:    time.Second,
		CapacityPollInterval: 2 * time.Second,
		SidecarResync:        5 * time.Second,
	})
	s3, sums := s3Server(t)
	id := datasetClass(t, s.cp, s.ns, "cistern-placement", "s3://datasets/sample/", s3)
	datasetClass(t, s.cp, s.ns, "cistern-placement-cold", "s3://datasets/sample/train/", s3)
	coldSums := map[string]string{}
	for rel, sum := range sums {
		if rest, ok := strings.CutPrefix(rel, "train/"); ok {
			coldSums[rest] = sum
		}
	}

	ok := t.Run("a pod pinned to a node stages the dataset there, and the StoragePool shows it", func(t *testing.T) {
		pod := s.runningPod(t, "warm", "cistern-placement", map[string]string{corev1.LabelHostname: warmNode})
		s.verifyPublished(t, pod, sums)
		s.waitInventory(t, warmNode, "the dataset Ready", func(disk map[string]cacheondisk.Dataset) error {
			if d, ok := disk[id]; !ok || !d.Ready {
				return errorf("dataset %s not ready on disk: %v", id, disk)
			}
			return nil
		})
	})
	ok = ok && t.Run("pods with claims of the dataset land on the node that holds it", func(t *testing.T) {
		for i := range 3 {
			name := fmt.Sprintf("placed-%d", i)
			pod := s.runningPod(t, name, "cistern-placement", nil)
			if pod.Spec.NodeName != warmNode {
				t.Errorf("pod %s on %s, want %s (the node holding the dataset)", name, pod.Spec.NodeName, warmNode)
			}
			want := []corev1.PreferredSchedulingTerm{placement.Term([]string{warmNode})}
			if got := dataTerms(pod); !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("pod %s: placement terms %+v, want %+v", name, got, want)
			}
			s.verifyPublished(t, pod, sums)
		}
	})
	ok = ok && t.Run("a pod whose dataset no node holds still schedules and runs", func(t *testing.T) {
		pod := s.runningPod(t, "cold", "cistern-placement-cold", nil)
		if got := dataTerms(pod); len(got) > 0 {
			t.Errorf("pod cold: placement terms %+v, want none (no node holds its dataset)", got)
		}
		s.verifyPublished(t, pod, coldSums)
	})
	ok = ok && t.Run("a pod whose warm node has no room for its copy goes to a node with room", func(t *testing.T) {
		// The warm node's pool holds four 64Mi volumes: a 320Mi copy no longer fits there, and
		// CSIStorageCapacity says so; the scheduler's volume binding filters the node out before
		// any score, the webhook's preference included.
		const size = 320 * mib
		eventually(t, time.Minute, "CSIStorageCapacity of the warm node below the claim", func(ctx context.Context) error {
			obj, err := s.capacityObject(ctx, "cistern-placement", warmNode)
			if err != nil {
				return err
			}
			if obj.Capacity == nil || obj.Capacity.Value() >= size {
				return errorf("capacity %v", obj.Capacity)
			}
			return nil
		})
		s.createClaimAndPod(t, "roomy", "cistern-placement", "320Mi", nil)
		pod := s.waitRunning(t, "roomy", 3*time.Minute)
		if pod.Spec.NodeName == warmNode {
			t.Errorf("pod roomy on %s, which has no room for its 320Mi claim", warmNode)
		}
		if want := []corev1.PreferredSchedulingTerm{placement.Term([]string{warmNode})}; !equality.Semantic.DeepEqual(dataTerms(pod), want) {
			t.Errorf("pod roomy: placement terms %+v, want %+v", dataTerms(pod), want)
		}
		s.verifyPublished(t, pod, sums)
	})
	ok = ok && t.Run("the inventory matches the disk after the pods go and after an eviction", func(t *testing.T) {
		s.deleteAll(t)
		s.waitInventory(t, warmNode, "the dataset Ready and unused", func(disk map[string]cacheondisk.Dataset) error {
			sp, err := s.typedStoragePool(context.Background(), "fast", warmNode)
			if err != nil {
				return err
			}
			for _, d := range sp.Status.Cache.Datasets {
				if d.ID == id && d.References == 0 {
					return nil
				}
			}
			return errorf("dataset %s not listed without references: %+v", id, sp.Status.Cache.Datasets)
		})
		// Something else fills the pool below the low watermark (10% free): the driver's periodic
		// check (every minute) evicts the unused dataset.
		fillPool(t, s.c.Nodes[warmNode].Pools["fast"], 16*mib)
		s.waitInventory(t, warmNode, "the dataset evicted", func(disk map[string]cacheondisk.Dataset) error {
			if _, ok := disk[id]; ok {
				return errorf("dataset %s still on disk", id)
			}
			return nil
		})
	})
	if !ok {
		t.Log("a step failed; the steps after it need its outcome and did not run")
	}
}

// fillPool writes a file into pool that leaves about free bytes free, removed at the end.
func fillPool(t testing.TB, pool string, free int64) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(pool, &st); err != nil {
		t.Fatal(err)
	}
	size := int64(st.Bavail)*st.Bsize - free
	if size <= 0 {
		return
	}
	path := filepath.Join(pool, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}
