package realnode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testutil"
)

// NetnsNode is a node of its own on this machine, for suites that need the API server to reach
// Kubelet (exec, logs, port-forward) or more than one node: kubelet, containerd and its pods run
// in a network namespace joined to the host by a veth pair, and in a mount namespace where the
// paths a node has once (kubelet's root, the pools, the driver's state, containerd's and CNI's
// fixed directories) are bind mounts of the node's own directories. Everything the host has of it
// is the veth pair's host side, one route to its pod network, and directories under dir.
type NetnsNode struct {
	name string
	Dir  string
	// netns is the network namespace's name (/run/netns/<netns>); hostIf its veth on the host.
	netns, hostIf string
	// hostIP is the host's address on the link, nodeIP the node's (kubelet's --node-ip).
	HostIP, NodeIP string
	// PodSubnet and podGateway are the node's pod network (CNI ptp inside the namespace).
	PodSubnet, PodGateway string
	CgroupRoot            string
	// enter runs a command in the node's mount, network and PID namespaces, which holder (the
	// unshare that started the node's init, initPID on the host) holds.
	Enter   []string
	holder  *framework.Process
	initPID int
	// poolDev is the pool's loop device (major:minor); the volumes' loop devices are on it.
	poolDev string
}

// The node's fixed host paths, each a bind mount of a directory of the node in its mount
// namespace. deploy/csi names the first three; containerd's shims use /run/containerd and CNI's
// result cache /var/lib/cni whatever their configured roots.
// KubeletRootDir is kubelet's root directory as on a real node: deploy/csi's hostPaths name it.
const KubeletRootDir = "/var/lib/kubelet"

var nodePaths = []string{KubeletRootDir, "/mnt/cistern", "/var/lib/cistern", "/run/containerd", "/var/lib/cni"}

// sharedNodePaths are bind mounts made shared in the node: the driver container's mounts
// propagate back through kubelet's directory (Bidirectional), the pools' into it (HostToContainer).
var sharedNodePaths = []string{KubeletRootDir, "/mnt/cistern"}

// Addresses: node i's link is 10.246.<i>.0/24 (host .1, node .2) and its pods get
// 10.244.<120+i>.0/24 (TestNode uses .117, TestInstall .118); none is this machine's own.
func netnsNodeAddrs(i int) (hostIP, nodeIP, podSubnet, podGateway string) {
	return fmt.Sprintf("10.246.%d.1", i), fmt.Sprintf("10.246.%d.2", i),
		fmt.Sprintf("10.244.%d.0/24", 120+i), fmt.Sprintf("10.244.%d.1", 120+i)
}

// PrepareNodePaths creates the fixed host paths the nodes bind their directories over, and
// removes at the end those that did not exist. Call once, before the nodes.
func PrepareNodePaths(t *testing.T) {
	t.Helper()
	for _, p := range nodePaths {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			t.Cleanup(func() { _ = os.Remove(p) })
		}
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
	}
}

// StartNetnsNode creates node i's namespaces, link, directories and pool (an ext4 filesystem of
// poolSize bytes on a loop device, mounted at poolPath in the node). Its cleanup, registered
// before any process of the node starts and so run after they stop, kills what is left in the
// node's cgroups and namespaces, stops its init (the kernel kills whatever else is in the node's
// PID namespace), then removes the network namespace and detaches the loop devices.
//
// init is the path of the node's PID 1, a static program that reaps orphans (hack/images/pause).
func StartNetnsNode(t *testing.T, dir string, i int, name, poolPath string, poolSize int64, init string) *NetnsNode {
	t.Helper()
	n := &NetnsNode{name: name, Dir: filepath.Join(dir, name),
		netns: fmt.Sprintf("cistern-k8se2e-%d", i), hostIf: fmt.Sprintf("ck8se2e%d", i)}
	n.HostIP, n.NodeIP, n.PodSubnet, n.PodGateway = netnsNodeAddrs(i)
	if err := os.MkdirAll(n.Dir, 0o750); err != nil {
		t.Fatal(err)
	}

	// A namespace left by an interrupted run of this suite (the host lock says none runs now).
	if _, err := os.Stat(filepath.Join("/run/netns", n.netns)); err == nil {
		t.Logf("removing network namespace %s left by an earlier run", n.netns)
		_ = exec.Command("ip", "netns", "del", n.netns).Run()
	}
	Run(t, "ip", "netns", "add", n.netns)
	// Deleting the namespace deletes the veth pair, and the host route with it.
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", n.netns).CombinedOutput(); err != nil {
			t.Logf("cleanup: deleting network namespace %s: %v: %s", n.netns, err, out)
		}
	})
	Run(t, "ip", "link", "add", n.hostIf, "type", "veth", "peer", "name", "eth0", "netns", n.netns)
	Run(t, "ip", "addr", "add", n.HostIP+"/24", "dev", n.hostIf)
	Run(t, "ip", "link", "set", n.hostIf, "up")
	Run(t, "ip", "-n", n.netns, "addr", "add", n.NodeIP+"/24", "dev", "eth0")
	Run(t, "ip", "-n", n.netns, "link", "set", "eth0", "up")
	Run(t, "ip", "-n", n.netns, "link", "set", "lo", "up")
	// The node reaches the host (the API server through the kubernetes Service address, see
	// serveKubernetesService) and nothing else; the host reaches its pods (webhooks).
	Run(t, "ip", "-n", n.netns, "route", "add", framework.KubernetesServiceIP+"/32", "via", n.HostIP)
	Run(t, "ip", "route", "add", n.PodSubnet, "via", n.NodeIP)

	// Loop devices go last, once no mount namespace holds their filesystems: the volumes'
	// (backed by files in the pool) before the pool's.
	t.Cleanup(func() { n.detachLoops(t) })
	n.CgroupRoot = OwnCgroupRoot(t, "cistern-k8se2e-"+name)
	n.startNamespaces(t, init)
	t.Cleanup(func() { n.killLeftovers(t) })

	for _, p := range nodePaths {
		src := filepath.Join(n.Dir, "paths", strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "-"))
		if err := os.MkdirAll(src, 0o750); err != nil {
			t.Fatal(err)
		}
		// A mount the host has at p (a killed install run's bind of /var/lib/kubelet onto itself)
		// would sit under the node's own: container runtimes check the lower one's propagation
		// and refuse Bidirectional mounts. Unmounted in the node only: its namespace is a slave.
		n.run(t, "sh", "-c", "! mountpoint -q "+p+" || umount -R "+p)
		n.run(t, "mount", "--bind", src, p)
	}
	for _, p := range sharedNodePaths {
		n.run(t, "mount", "--make-rshared", p)
	}

	img := filepath.Join(n.Dir, "pool.img")
	testutil.FSImage(t, img, "ext4", poolSize)
	n.run(t, "mkdir", "-p", poolPath)
	n.run(t, "mount", "-o", "loop", img, poolPath)
	for dev := range LoopDevicesUnder(t, n.Dir) {
		out, err := exec.Command("lsblk", "-dno", "MAJ:MIN", dev).Output()
		if err != nil {
			t.Fatalf("lsblk %s: %v", dev, err)
		}
		n.poolDev = strings.TrimSpace(string(out))
	}
	return n
}

// startNamespaces starts the process that holds the node's mount and PID namespaces, inside its
// network namespace: init, the node's PID 1 (hack/images/pause, which reaps orphans), so that
// privileged host-PID pods that enter /proc/1/ns/mnt, as e2e.test's host-exec pods do, find the
// node's mounts, and so that when it stops the kernel kills everything left in the node. The
// mount namespace is a slave of the host's (the host's mounts reach it, none of its own leave
// it), with /proc of the node's PID namespace. The node's processes enter the namespaces through
// nsenter. Not `ip netns exec`, which gives each command a mount namespace of its own and a /sys
// without the host's cgroups.
func (n *NetnsNode) startNamespaces(t *testing.T, init string) {
	t.Helper()
	n.holder = framework.StartProcess(t, "namespaces-"+n.name, "nsenter", "--net=/run/netns/"+n.netns, "--",
		"unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "slave", "--", init)
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	// unshare forks the node's init; nsenter enters the namespaces of that child.
	parent := n.holder.Pid()
	deadline := time.Now().Add(30 * time.Second)
	for {
		children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", parent, parent))
		if f := strings.Fields(string(children)); len(f) == 1 {
			pid, _ := strconv.Atoi(f[0])
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
			ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
			if err == nil && ns != self && exe == init {
				n.initPID = pid
				break
			}
		}
		select {
		case <-n.holder.Done():
			t.Fatalf("%v", ErrExited(n.holder))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: no init in its namespaces after 30s (log: %s)", n.name, n.holder.LogPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.Enter = []string{"nsenter", "--target", strconv.Itoa(n.initPID), "--mount", "--net", "--pid", "--"}
}

// Run runs a command in the node's namespaces and fails the test when it fails.
func (n *NetnsNode) run(t *testing.T, args ...string) {
	t.Helper()
	all := append(append([]string{}, n.Enter...), args...)
	Run(t, all[0], all[1:]...)
}

// killLeftovers kills what the node's kubelet and containerd left once they are stopped: the
// processes in the node's pod cgroups (containers kubelet did not tear down) and in its mount
// namespace (containerd's shims), except the node's init and its holder; stopping init then
// takes whatever is left in the node's PID namespace.
func (n *NetnsNode) killLeftovers(t *testing.T) {
	for _, pid := range cgroupPIDs(n.CgroupRoot) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if n.initPID == 0 {
		return
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", n.initPID))
	if err != nil {
		return
	}
	// The scan reads every host process's namespace link, and the kernel may hold that read for
	// as long as the process is stuck (an exec from a dead FUSE mount of another test): give up
	// after a while rather than leave the rest of the cleanup, init's stop included, undone.
	// The goroutine may outlive the test, so it reports on a channel, never through t.
	done := make(chan []int, 1)
	go func() {
		var killed []int
		defer func() { done <- killed }()
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == n.initPID || pid == n.holder.Pid() {
				continue
			}
			if other, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && other == ns {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				killed = append(killed, pid)
			}
		}
	}()
	select {
	case killed := <-done:
		if len(killed) > 0 {
			t.Logf("cleanup: node %s: killed processes %v left in its mount namespace", n.name, killed)
		}
	case <-time.After(30 * time.Second):
		t.Logf("cleanup: node %s: the scan for processes left in its mount namespace is stuck in /proc; stopping its init instead", n.name)
	}
}

// cgroupPIDs lists the processes in the cgroup root (cgroup v1: every hierarchy; v2: the one).
func cgroupPIDs(root string) []int {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + root)
	dirs = append(dirs, "/sys/fs/cgroup"+root)
	seen := map[int]bool{}
	var pids []int
	for _, d := range dirs {
		_ = filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// DetachLoops detaches, in order, the loop devices kubelet attached over the volumes' block
// devices (it holds each mapped block volume open with one), the volumes' loop devices (backed by
// files on the pool's device), and the pool's.
func (n *NetnsNode) detachLoops(t *testing.T) {
	if n.poolDev != "" {
		loops := loopBackings(t)
		var volumes []string
		for dev, back := range loops {
			if back.dev == n.poolDev {
				volumes = append(volumes, dev)
			}
		}
		for _, vol := range volumes {
			var st unix.Stat_t
			if err := unix.Stat(vol, &st); err != nil {
				continue
			}
			node := loopBacking{dev: fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)), ino: strconv.FormatUint(st.Ino, 10)}
			for dev, back := range loops {
				if back == node {
					detachLoop(t, dev)
				}
			}
		}
		for _, vol := range volumes {
			detachLoop(t, vol)
		}
	}
	DetachLoops(t, n.Dir)
}

// loopBacking is what a loop device's backing file is on: device (major:minor) and inode.
type loopBacking struct{ dev, ino string }

// loopBackings lists every loop device with its backing file's device and inode, as the kernel
// reports them whatever mount namespace attached it.
func loopBackings(t *testing.T) map[string]loopBacking {
	out, err := exec.Command("losetup", "-l", "-n", "-O", "NAME,BACK-MAJ:MIN,BACK-INO").Output()
	if err != nil {
		t.Logf("cleanup: losetup: %v", err)
	}
	loops := map[string]loopBacking{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 {
			loops[f[0]] = loopBacking{dev: f[1], ino: f[2]}
		}
	}
	return loops
}

func detachLoop(t *testing.T, dev string) {
	if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
		t.Logf("cleanup: detaching %s: %v: %s", dev, err, out)
	}
}

// HostPath is where the host sees path, a path of the node under one of its fixed node paths
// (each a bind mount of a directory under the node's Dir): a unix socket the node's driver
// listens on is reached from the host there.
func (n *NetnsNode) HostPath(t *testing.T, path string) string {
	t.Helper()
	for _, p := range nodePaths {
		if rel, err := filepath.Rel(p, path); err == nil && !strings.HasPrefix(rel, "..") {
			return filepath.Join(n.Dir, "paths", strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "-"), rel)
		}
	}
	t.Fatalf("node %s: %s is under none of the node paths %v", n.name, path, nodePaths)
	return ""
}

// Disconnect takes the host's side of the node's link down: the node, its kubelet and its pods
// keep running but reach nothing (an unreachable node, as a network partition makes one).
// Reconnect brings it back.
func (n *NetnsNode) Disconnect(t *testing.T) {
	t.Helper()
	Run(t, "ip", "link", "set", n.hostIf, "down")
}

// Reconnect brings the node's link up again, with the host's route to its pods (the kernel
// drops a route through a link that goes down).
func (n *NetnsNode) Reconnect(t *testing.T) {
	t.Helper()
	Run(t, "ip", "link", "set", n.hostIf, "up")
	if out, err := exec.Command("ip", "route", "replace", n.PodSubnet, "via", n.NodeIP, "dev", n.hostIf, "onlink").CombinedOutput(); err != nil {
		t.Fatalf("node %s: restoring the route to its pods: %v: %s", n.name, err, out)
	}
}

// MountsUnder lists the mount points under dir (a path of the node) in the node's mount
// namespace.
func (n *NetnsNode) MountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", n.initPID))
	if err != nil {
		t.Fatalf("node %s: its mounts: %v", n.name, err)
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		// ID parent major:minor root mountpoint ...
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mounts = append(mounts, f[4])
		}
	}
	return mounts
}

// Mountinfo returns the node's mount table (/proc/<pid>/mountinfo of its mount namespace). It
// takes no testing.T: a goroutine watching the node's mounts while a test runs may call it.
func (n *NetnsNode) Mountinfo() ([]byte, error) {
	return os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", n.initPID))
}
