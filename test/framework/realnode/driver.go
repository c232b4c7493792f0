package realnode

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
	"syscall"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/hack/standins/registration"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil"
)

const PoolName = "fast"

// CisternNode is the driver's side of the node: its pool, state and process.
type CisternNode struct {
	bins        *Binaries
	nodeName    string
	kubeletRoot string
	Socket      string // the CSI socket, where kubelet expects a plugin's
	poolsConfig string
	stateDir    string
	driver      *framework.Process
	starts      int
	// registrar registers the driver with kubelet, as the registrar container would; it
	// outlives driver restarts.
	registrar   *framework.Process
	provisioner *framework.Process
	cp          *framework.ControlPlane
	provStarts  int
	// suite is the top-level test: processes restarted from a subtest must outlive it.
	suite *testing.T
	// metricsAddr serves the driver's /metrics.
	metricsAddr string
	// DriverArgs are more flags for the driver (e.g. --sts-endpoint), set before StartDriver.
	DriverArgs []string
	// keeper is the FUSE keeper (StartKeeper), KeeperSocket its socket.
	keeper       *framework.Process
	KeeperSocket string
	// enter, for a node in its own namespaces (NewNetnsCisternNode), runs the driver and the
	// registrar there; hostSocket is where the host reaches Socket (the provisioner dials it).
	enter      []string
	hostSocket string
}

// createPool makes a 2 GiB ext4 filesystem in a file and loop-mounts it at dir/pool: the pool
// has a filesystem of its own, as on a real node, and its capacity is independent of the disk.
func createPool(t *testing.T, dir string) string {
	t.Helper()
	img := filepath.Join(dir, "pool.img")
	mnt := filepath.Join(dir, "pool")
	testutil.FSImage(t, img, "ext4", 2<<30)
	testutil.LoopMount(t, img, mnt)
	// The suite's final cleanup unmounts it and detaches the loop device with everything else.
	return mnt
}

// Run runs a command and fails the test with its output when it fails (testutil.Run).
func Run(t *testing.T, name string, args ...string) {
	t.Helper()
	testutil.Run(t, append([]string{name}, args...)...)
}

// NewCisternNode prepares Cistern's driver for the node nodeName: a pool under dir, its pools
// config and state directory, kubelet's root kubeletRoot; StartDriver runs it.
func NewCisternNode(t *testing.T, bins *Binaries, dir, kubeletRoot, nodeName string) *CisternNode {
	t.Helper()
	pool := createPool(t, dir)
	n := &CisternNode{
		suite:       t,
		bins:        bins,
		nodeName:    nodeName,
		kubeletRoot: kubeletRoot,
		Socket:      filepath.Join(kubeletRoot, "plugins", consts.DriverName, "csi.sock"),
		poolsConfig: filepath.Join(dir, "pools.yaml"),
		stateDir:    filepath.Join(dir, "cistern-state"),
	}
	n.writeConfig(t, pool, filepath.Dir(n.Socket))
	return n
}

// writeConfig writes the driver's pools config, one pool at poolPath, and makes the directory of
// its socket, socketDir as the test sees it.
func (c *CisternNode) writeConfig(t *testing.T, poolPath, socketDir string) {
	t.Helper()
	cfg := fmt.Sprintf("pools:\n- name: %s\n  path: %s\n  labels: {media: ssd}\n", PoolName, poolPath)
	if err := os.WriteFile(c.poolsConfig, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(socketDir, 0o750); err != nil {
		t.Fatal(err)
	}
}

// NewNetnsCisternNode prepares Cistern's driver for the netns node n, as its DaemonSet pod would
// run there: in the node's namespaces, with the node's own paths (kubelet's root, the state
// directory) and its pool mounted at poolPath (StartNetnsNode). The provisioner runs on the host
// and reaches the driver's socket through the node's directory.
func NewNetnsCisternNode(t *testing.T, bins *Binaries, n *NetnsNode, poolPath string) *CisternNode {
	t.Helper()
	c := &CisternNode{
		suite:       t,
		bins:        bins,
		nodeName:    n.name,
		kubeletRoot: KubeletRootDir,
		Socket:      filepath.Join(KubeletRootDir, "plugins", consts.DriverName, "csi.sock"),
		poolsConfig: filepath.Join(n.Dir, "pools.yaml"),
		stateDir:    "/var/lib/cistern/state",
		enter:       n.Enter,
	}
	c.hostSocket = n.HostPath(t, c.Socket)
	c.writeConfig(t, poolPath, filepath.Dir(c.hostSocket))
	return c
}

// SocketForHost is where a process on the host reaches the driver's socket.
func (n *CisternNode) SocketForHost() string {
	if n.hostSocket != "" {
		return n.hostSocket
	}
	return n.Socket
}

// StartDriver starts the driver in mode all and, the first time, the registrar next to it.
func (n *CisternNode) StartDriver(t *testing.T) {
	t.Helper()
	n.starts++
	if n.metricsAddr == "" {
		ports, err := FreePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		n.metricsAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	}
	args := []string{
		"--node-id=" + n.nodeName,
		"--tenant-s3-endpoints=*", // test S3 servers are on loopback; the closed default has its own test
		"--pools-config=" + n.poolsConfig,
		"--state-dir=" + n.stateDir,
		"--kubelet-root=" + n.kubeletRoot,
		"--pool-check-interval=2s",
		"--http-endpoint=" + n.metricsAddr,
		"--v=3",
	}
	args = append(args, n.DriverArgs...)
	if n.enter == nil {
		n.driver = framework.StartCSIDriver(t, fmt.Sprintf("csi-driver-%d", n.starts), n.bins.driver, n.Socket, args...)
	} else {
		n.driver = n.startInNode(t, fmt.Sprintf("csi-driver-%s-%d", n.nodeName, n.starts),
			append([]string{n.bins.driver, "--endpoint=unix://" + n.Socket}, args...))
	}
	if n.registrar == nil {
		args := []string{n.bins.registrar,
			"--csi-address=" + n.Socket,
			"--kubelet-registration-path=" + n.Socket,
			"--plugin-registration-path=" + filepath.Join(n.kubeletRoot, "plugins_registry"),
			"--v=3",
		}
		name := "node-driver-registrar"
		if n.enter != nil {
			name += "-" + n.nodeName
		}
		all := append(append([]string{}, n.enter...), args...)
		n.registrar = framework.StartCommand(n.suite, name, exec.Command(all[0], all[1:]...))
	}
}

// startInNode starts the driver in the node's namespaces and waits for its socket.
func (n *CisternNode) startInNode(t *testing.T, name string, args []string) *framework.Process {
	t.Helper()
	_ = os.Remove(n.hostSocket) // a previous run's (a restart)
	all := append(append([]string{}, n.enter...), args...)
	p := framework.StartCommand(t, name, exec.Command(all[0], all[1:]...))
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		select {
		case <-p.Done():
			return false, ErrExited(p)
		default:
		}
		c, err := net.Dial("unix", n.hostSocket)
		if err == nil {
			c.Close()
		}
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("%s: not listening on %s: %v; last lines of %s:\n%s", name, n.hostSocket, err, p.LogPath, framework.Tail(p.LogPath, 20))
	}
	return p
}

// Stop stops the node's driver, registrar and provisioner, as when the node goes away with its
// DaemonSet pod. The test's cleanup stops them too.
func (n *CisternNode) Stop() {
	for _, p := range []*framework.Process{n.provisioner, n.registrar, n.driver} {
		if p != nil {
			p.Stop()
		}
	}
}

// RestartDriver stops the driver (SIGTERM, as a pod deletion would) and starts a new one.
// external-provisioner exits when it loses the driver's socket and its container is restarted;
// so is it here.
func (n *CisternNode) RestartDriver() {
	n.driver.Stop()
	n.StartDriver(n.suite)
	if n.provisioner != nil {
		select {
		case <-n.provisioner.Done():
		case <-time.After(10 * time.Second):
		}
		n.provisioner.Stop() // expected to have exited; marks it stopped
		n.StartProvisioner(n.suite, n.cp)
	}
}

// KillDriver kills the driver (SIGKILL: a crash, an OOM kill, a container killed) and starts a
// new one, as kubelet restarts a container; the provisioner is restarted as in RestartDriver.
func (n *CisternNode) KillDriver() {
	_ = syscall.Kill(n.driver.Pid(), syscall.SIGKILL)
	<-n.driver.Done()
	n.RestartDriver() // the process is gone: Stop only marks it stopped
}

// StartKeeper starts the FUSE keeper (csi-driver fuse-keeper) beside the driver, as its own
// DaemonSet runs it, and names its socket to the driver from its next start on. The keeper
// outlives the driver's restarts; the test's cleanup stops it.
func (n *CisternNode) StartKeeper(t *testing.T) {
	t.Helper()
	if n.enter != nil {
		t.Fatal("StartKeeper: not for a node in its own namespaces")
	}
	n.KeeperSocket = filepath.Join(n.stateDir, "fuse-keeper", "keeper.sock")
	n.startKeeper(t)
	n.DriverArgs = append(n.DriverArgs, "--fuse-keeper="+n.KeeperSocket)
}

// DriverLog is the current driver process's log.
func (n *CisternNode) DriverLog() string { return n.driver.LogPath }

// RestartKeeper stops the keeper (SIGTERM, as its pod's deletion does: it lets go of what it
// held) and starts a new one on the same socket.
func (n *CisternNode) RestartKeeper(t *testing.T) {
	t.Helper()
	n.keeper.Stop()
	n.startKeeper(t)
}

func (n *CisternNode) startKeeper(t *testing.T) {
	t.Helper()
	_ = os.Remove(n.KeeperSocket) // the last keeper's: its absence says the new one is not up
	n.keeper = framework.StartProcess(n.suite, "fuse-keeper", n.bins.driver, "fuse-keeper", "--socket="+n.KeeperSocket, "--v=2")
	p := n.keeper
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		select {
		case <-p.Done():
			return false, ErrExited(p)
		default:
		}
		_, err := os.Stat(n.KeeperSocket)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("fuse-keeper: no socket at %s: %v; last lines of %s:\n%s", n.KeeperSocket, err, p.LogPath, framework.Tail(p.LogPath, 20))
	}
}

// StartProvisioner runs external-provisioner next to the driver in node-deployment mode: it
// provisions only claims whose selected node is this one, as a DaemonSet would.
func (n *CisternNode) StartProvisioner(t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	cmd := exec.Command(n.bins.provisioner,
		"--csi-address="+n.SocketForHost(),
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
	name := fmt.Sprintf("csi-provisioner-%d", n.provStarts)
	if n.enter != nil {
		name = fmt.Sprintf("csi-provisioner-%s-%d", n.nodeName, n.provStarts)
	}
	n.provisioner = framework.StartCommand(t, name, cmd)
}

// WaitRegistered waits until kubelet has registered the driver: the CSINode lists it with our
// topology key, which kubelet writes only after NodeGetInfo through the registration socket.
func (n *CisternNode) WaitRegistered(t *testing.T, cp *framework.ControlPlane) *storagev1.CSINode {
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
		t.Fatalf("driver not registered with kubelet (socket %s): %v; registrar log: %s, driver log: %s",
			registration.SocketPath(filepath.Join(n.kubeletRoot, "plugins_registry"), consts.DriverName), err, n.registrar.LogPath, n.driver.LogPath)
	}
	return csiNode
}

// CreateStorageObjects creates the CSIDriver (no attach, pod info, both lifecycle modes, and the
// pod's ServiceAccount token for web-identity S3 credentials, as deploy/csi's) and a
// WaitForFirstConsumer StorageClass targeting the pool.
func CreateStorageObjects(t *testing.T, cp *framework.ControlPlane) (storageClass string) {
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
			TokenRequests: []storagev1.TokenRequest{{Audience: consts.DefaultWebIdentityAudience}},
		},
	}
	if _, err := cp.Client.StorageV1().CSIDrivers().Create(ctx, driver, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating CSIDriver: %v", err)
	}
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: "cistern-" + PoolName},
		Provisioner:          consts.DriverName,
		Parameters:           map[string]string{"pool": PoolName},
		VolumeBindingMode:    &wffc,
		AllowVolumeExpansion: ptr.To(true),
	}
	if _, err := cp.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating StorageClass: %v", err)
	}
	return sc.Name
}

// FreePorts is framework.FreePorts as the kubelet configuration's int32.
func FreePorts(n int) ([]int32, error) {
	ports, err := framework.FreePorts(n)
	out := make([]int32, len(ports))
	for i, p := range ports {
		out[i] = int32(p)
	}
	return out, err
}

// ErrExited says that p exited, and where its log is.
func ErrExited(p *framework.Process) error {
	return fmt.Errorf("%s exited: %v (log: %s)", p.Name, p.Err(), p.LogPath)
}

// Metric returns the value of an unlabelled counter or gauge from the driver's /metrics.
func (n *CisternNode) Metric(t *testing.T, name string) float64 {
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
