package e2e_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil"
)

// expansion: a claim of an expandable class (pool bulk) on node-a grows from 32Mi to 64Mi
// through the external-resizer stand-in (hack/standins/external-resizer, as the storage e2e
// suite runs it in the node pod: --node-deployment, the node's token, test/k8se2e/resizer's
// ClusterRole): ControllerExpandVolume, the PV's capacity, the claim's FileSystemResizePending,
// NodeResizePending and allocatedResources, under deploy/csi's node policies. Then what kubelet
// does: the volume staged (the driver grows ext4 offline at staging: online ext4 growth needs
// CAP_SYS_RESOURCE, not granted here) and NodeExpandVolume, and the filesystem has grown.
// Node-b's resizer runs too and leaves node-a's volume alone. The ClusterRole is removed at the
// end.
func (s *scenario) expansion(t *testing.T) {
	cs := s.cp.Client
	bin := filepath.Join(t.TempDir(), "csi-resizer")
	build := testutil.GoBuild(bin, "./hack/standins/external-resizer")
	build.Dir = framework.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the resizer stand-in: %v\n%s", err, out)
	}
	rbac := filepath.Join(framework.RepoRoot(), "test", "k8se2e", "resizer", "rbac.yaml")
	framework.ApplyManifests(t, s.cp, rbac)
	// The tests after this one see the node ServiceAccount of deploy/csi alone.
	t.Cleanup(func() { framework.Kubectl(t, s.cp, "delete", "--ignore-not-found", "-f", rbac) })
	for _, node := range []string{nodeA, nodeB} {
		kubeconfig := framework.PodServiceAccountKubeconfig(t, s.cp, cluster.DaemonSetPod(t, s.cp, node))
		cmd := exec.Command(bin, "--kubeconfig="+kubeconfig, "--csi-address="+s.c.Nodes[node].Socket,
			"--node-deployment", "--retry-interval-start=200ms", "--retry-interval-max=2s", "--v=4")
		cmd.Env = append(cmd.Environ(), "NODE_NAME="+node)
		framework.StartCommand(t, node+"-csi-resizer", cmd)
	}

	// node-a's bulk pool: the earlier scenarios leave its fast pool nearly full.
	framework.ApplyYAML(t, s.cp, `
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: cistern-bulk-expandable}
provisioner: cistern.csi.dev
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
parameters: {pool: bulk, csi.storage.k8s.io/fstype: ext4}
`)
	if _, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx(t), newClaim("grows", "cistern-bulk-expandable", "32Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(s.ns).Create(ctx(t), newPod("grows", "grows", map[string]string{corev1.LabelHostname: nodeA}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := boundPV(t, cs, s.ns, "grows")
	eventually(t, time.Minute, "claim grows has a capacity", func(ctx context.Context) error {
		pvc, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, "grows", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, ok := pvc.Status.Capacity[corev1.ResourceStorage]; !ok {
			return errorf("no status.capacity")
		}
		pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("64Mi")
		_, err = cs.CoreV1().PersistentVolumeClaims(s.ns).Update(ctx, pvc, metav1.UpdateOptions{})
		return err
	})
	want := resource.MustParse("64Mi")
	eventually(t, 2*time.Minute, "volume "+pv.Name+" expanded, node expansion pending", func(ctx context.Context) error {
		got, err := cs.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if q := got.Spec.Capacity[corev1.ResourceStorage]; q.Cmp(want) < 0 {
			return errorf("PV capacity %s", q.String())
		}
		pvc, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, "grows", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if st := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; st != corev1.PersistentVolumeClaimNodeResizePending {
			return errorf("allocatedResourceStatuses %v", pvc.Status.AllocatedResourceStatuses)
		}
		if q := pvc.Status.AllocatedResources[corev1.ResourceStorage]; q.Cmp(want) != 0 {
			return errorf("allocatedResources %v", pvc.Status.AllocatedResources)
		}
		for _, c := range pvc.Status.Conditions {
			if c.Type == corev1.PersistentVolumeClaimFileSystemResizePending && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errorf("conditions %v", pvc.Status.Conditions)
	})
	evs, err := cs.CoreV1().Events(s.ns).List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=grows,involvedObject.kind=PersistentVolumeClaim"})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]int{}
	for _, e := range evs.Items {
		reasons[e.Reason] += int(max(e.Count, 1))
	}
	if reasons["Resizing"] != 1 || reasons["FileSystemResizeRequired"] != 1 || reasons["VolumeResizeFailed"] != 0 {
		t.Errorf("claim events %v, want one Resizing and one FileSystemResizeRequired (node-b's resizer must not try)", reasons)
	}

	// kubelet's part, on node-a.
	got, err := cs.CoreV1().PersistentVolumes().Get(ctx(t), pv.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node := s.c.Nodes[nodeA]
	m, err := cluster.StageAndPublish(ctx(t), node.Socket, got, nil, node.KubeletRoot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Unmount(context.Background()) })
	if _, err := csi.NewNodeClient(csiConn(t, node.Socket)).NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{
		VolumeId: m.VolumeID, VolumePath: m.TargetPath, StagingTargetPath: m.StagingPath,
		CapacityRange: &csi.CapacityRange{RequiredBytes: want.Value()},
	}); err != nil {
		t.Fatalf("NodeExpandVolume: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(m.TargetPath, &st); err != nil {
		t.Fatal(err)
	}
	// ext4's metadata (inode tables, the journal) takes 15% of a 64 MiB device: the filesystem
	// holds more than the 32 MiB device it was made on could.
	if size := int64(st.Blocks) * st.Bsize; size <= 32<<20 {
		t.Errorf("filesystem of %d bytes after expansion to %d: not grown", size, want.Value())
	}
}
