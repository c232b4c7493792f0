package e2enode

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/registration"
	"github.com/cistern-csi/cistern/test/framework"
)

const poolName = "fast"

// cisternNode is the driver's side of the node: its pool, state and process.
type cisternNode struct {
	bins        *binaries
	nodeName    string
	kubeletRoot string
	socket      string // the CSI socket, where kubelet expects a plugin's
	poolsConfig string
	stateDir    string
	driver      *framework.Process
	starts      int
	provisioner *framework.Process
	cp          *framework.ControlPlane
	provStarts  int
	// suite is the top-level test: processes restarted from a subtest must outlive it.
	suite *testing.T
	// metricsAddr serves the driver's /metrics.
	metricsAddr string
}

// createPool makes a 2 GiB ext4 filesystem in a file and loop-mounts it at dir/pool: the pool
// has a filesystem of its own, as on a real node, and its capacity is independent of the disk.
func createPool(t *testing.T, dir string) string {
	t.Helper()
	img := filepath.Join(dir, "pool.img")
	mnt := filepath.Join(dir, "pool")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	run(t, "mkfs.ext4", "-q", "-F", img)
	run(t, "mount", "-o", "loop", img, mnt)
	// The suite's final cleanup unmounts it and detaches the loop device with everything else.
	return mnt
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func newCisternNode(t *testing.T, bins *binaries, dir, kubeletRoot, nodeName string) *cisternNode {
	t.Helper()
	pool := createPool(t, dir)
	n := &cisternNode{
		suite:       t,
		bins:        bins,
		nodeName:    nodeName,
		kubeletRoot: kubeletRoot,
		socket:      filepath.Join(kubeletRoot, "plugins", consts.DriverName, "csi.sock"),
		poolsConfig: filepath.Join(dir, "pools.yaml"),
		stateDir:    filepath.Join(dir, "cistern-state"),
	}
	cfg := fmt.Sprintf("pools:\n- name: %s\n  path: %s\n  labels: {media: ssd}\n", poolName, pool)
	if err := os.WriteFile(n.poolsConfig, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(n.socket), 0o750); err != nil {
		t.Fatal(err)
	}
	return n
}

// startDriver starts the driver in mode all, registering itself with kubelet.
func (n *cisternNode) startDriver(t *testing.T) {
	t.Helper()
	n.starts++
	if n.metricsAddr == "" {
		ports, err := freePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		n.metricsAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	}
	n.driver = framework.StartProcess(t, fmt.Sprintf("csi-driver-%d", n.starts), n.bins.driver,
		"--endpoint=unix://"+n.socket,
		"--node-id="+n.nodeName,
		"--tenant-s3-endpoints=*", // test S3 servers are on loopback; the closed default has its own test
		"--pools-config="+n.poolsConfig,
		"--state-dir="+n.stateDir,
		"--kubelet-registration-path="+n.socket,
		"--plugin-registration-dir="+filepath.Join(n.kubeletRoot, "plugins_registry"),
		"--kubelet-root="+n.kubeletRoot,
		"--pool-check-interval=2s",
		"--http-endpoint="+n.metricsAddr,
		"--v=3",
	)
	waitSocket(t, n.driver, n.socket)
}

// restartDriver stops the driver (SIGTERM, as a pod deletion would) and starts a new one.
// external-provisioner exits when it loses the driver's socket and its container is restarted;
// so is it here.
func (n *cisternNode) restartDriver() {
	n.driver.Stop()
	n.startDriver(n.suite)
	if n.provisioner != nil {
		select {
		case <-n.provisioner.Done():
		case <-time.After(10 * time.Second):
		}
		n.provisioner.Stop() // expected to have exited; marks it stopped
		n.startProvisioner(n.suite, n.cp)
	}
}

// startProvisioner runs external-provisioner next to the driver in node-deployment mode: it
// provisions only claims whose selected node is this one, as a DaemonSet would.
func (n *cisternNode) startProvisioner(t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	cmd := exec.Command(n.bins.provisioner,
		"--csi-address="+n.socket,
		"--kubeconfig="+cp.Kubeconfig,
		"--node-deployment=true",
		"--node-deployment-immediate-binding=false",
		"--strict-topology=true",
		"--extra-create-metadata=true",
		"--leader-election=false",
		"--timeout=60s",
		"--v=3",
	)
	cmd.Env = append(os.Environ(), "NODE_NAME="+n.nodeName)
	n.cp = cp
	n.provStarts++
	n.provisioner = framework.StartCommand(t, fmt.Sprintf("csi-provisioner-%d", n.provStarts), cmd)
}

func waitSocket(t *testing.T, p *framework.Process, socket string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if conn, err := net.Dial("unix", socket); err == nil {
			conn.Close()
			return
		}
		select {
		case <-p.Done():
			t.Fatalf("%v", errExited(p))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not listening after 1m (log: %s)", p.Name, socket, p.LogPath)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRegistered waits until kubelet has registered the driver: the CSINode lists it with our
// topology key, which kubelet writes only after NodeGetInfo through the registration socket.
func (n *cisternNode) waitRegistered(t *testing.T, cp *framework.ControlPlane) *storagev1.CSINode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var csiNode *storagev1.CSINode
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		cn, err := cp.Client.StorageV1().CSINodes().Get(ctx, n.nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, d := range cn.Spec.Drivers {
			if d.Name == consts.DriverName && d.NodeID == n.nodeName {
				csiNode = cn
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("driver not registered with kubelet (socket %s): %v; driver log: %s",
			registration.SocketPath(filepath.Join(n.kubeletRoot, "plugins_registry"), consts.DriverName), err, n.driver.LogPath)
	}
	return csiNode
}

// createStorageObjects creates the CSIDriver (no attach, pod info and both lifecycle modes) and
// a WaitForFirstConsumer StorageClass targeting the pool.
func createStorageObjects(t *testing.T, cp *framework.ControlPlane) (storageClass string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fsGroupPolicy := storagev1.FileFSGroupPolicy
	driver := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: consts.DriverName},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired: ptr.To(false),
			PodInfoOnMount: ptr.To(true),
			FSGroupPolicy:  &fsGroupPolicy,
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{
				storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral,
			},
		},
	}
	if _, err := cp.Client.StorageV1().CSIDrivers().Create(ctx, driver, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating CSIDriver: %v", err)
	}
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: "cistern-" + poolName},
		Provisioner:          consts.DriverName,
		Parameters:           map[string]string{"pool": poolName},
		VolumeBindingMode:    &wffc,
		AllowVolumeExpansion: ptr.To(true),
	}
	if _, err := cp.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating StorageClass: %v", err)
	}
	return sc.Name
}

func freePorts(n int) ([]int32, error) {
	var ports []int32
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, int32(l.Addr().(*net.TCPAddr).Port))
	}
	return ports, nil
}

func errExited(p *framework.Process) error {
	return fmt.Errorf("%s exited: %v (log: %s)", p.Name, p.Err(), p.LogPath)
}

// metric returns the value of an unlabelled counter or gauge from the driver's /metrics.
func (n *cisternNode) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + n.metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("driver metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && fields[0] == name {
			v, err := strconv.ParseFloat(fields[1], 64)
			if err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return v
		}
	}
	t.Fatalf("driver metrics have no %s", name)
	return 0
}
