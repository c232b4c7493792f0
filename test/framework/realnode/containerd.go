package realnode

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework"
)

// Containerd is a containerd with its CRI plugin, all of its state under dir.
type Containerd struct {
	dir     string
	Socket  string
	bins    *Binaries
	opts    ContainerdOptions
	process *framework.Process
}

// ContainerdOptions are what the install suite changes.
type ContainerdOptions struct {
	// registry, when set (host:port on loopback), is where every pull goes: its own name,
	// registry.k8s.io (the sidecars deploy/csi names) and any other registry, so that nothing
	// is ever fetched from elsewhere.
	Registry string
	// mirrored are the registries served by registry under their own names.
	Mirrored []string
	// registryVia is where containerd dials the registry, when it cannot at its address (a node
	// in its own network namespace reaches the host's loopback through a relay).
	RegistryVia string
	// podRoutes are extra destinations the pods reach through the host (the Service range).
	PodRoutes []string
	// imported are the images (names in images.json) imported rather than pulled; nil: all.
	Imported []string
	// subnet and gateway of the pod network; empty: podSubnet and podGateway.
	Subnet, Gateway string
	// logName names the process and its log; "containerd" when empty.
	LogName string
	// enter is the command prefix that runs containerd in its node's namespaces (netns_test.go).
	Enter []string
}

// criNamespace is the containerd namespace the CRI plugin (and so kubelet) uses.
const criNamespace = "k8s.io"

// containerdConfig follows what is known to work on this machine (see docs/testing.md): runc
// from our build, the sandbox image equal to our pause image, oom_score_adj never lowered
// (the host denies it), cgroupfs, the CNI configuration of podNetworkConflist.
func (c *Containerd) config(cniConfDir string) string {
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	return strings.Join([]string{
		`version = 3`,
		`root = ` + q(filepath.Join(c.dir, "root")),
		`state = ` + q(filepath.Join(c.dir, "state")),
		`[grpc]`,
		`  address = ` + q(c.Socket),
		`[ttrpc]`,
		`  address = ` + q(c.Socket+".ttrpc"),
		`[plugins]`,
		`  [plugins.'io.containerd.internal.v1.opt']`,
		`    path = ` + q(filepath.Join(c.dir, "opt")),
		`  [plugins.'io.containerd.nri.v1.nri']`,
		`    disable = true`,
		`  [plugins.'io.containerd.cri.v1.images']`,
		`    snapshotter = 'overlayfs'`,
		`    [plugins.'io.containerd.cri.v1.images'.pinned_images]`,
		`      sandbox = ` + q(c.bins.Images["pause"].Ref),
		`    [plugins.'io.containerd.cri.v1.images'.registry]`,
		`      config_path = ` + q(filepath.Join(c.dir, "certs.d")),
		`  [plugins.'io.containerd.cri.v1.runtime']`,
		`    restrict_oom_score_adj = true`,
		`    netns_mounts_under_state_dir = true`,
		`    [plugins.'io.containerd.cri.v1.runtime'.containerd]`,
		`      default_runtime_name = 'runc'`,
		`      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]`,
		`        runtime_type = 'io.containerd.runc.v2'`,
		`        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]`,
		`          BinaryName = ` + q(c.bins.runc),
		`          Root = ` + q(filepath.Join(c.dir, "runc")),
		`          SystemdCgroup = false`,
		`    [plugins.'io.containerd.cri.v1.runtime'.cni]`,
		`      bin_dirs = [` + q(c.bins.cniDir) + `]`,
		`      conf_dir = ` + q(cniConfDir),
		`  [plugins.'io.containerd.grpc.v1.cri']`,
		`    stream_server_address = '127.0.0.1'`,
		`    stream_server_port = '0'`,
		``,
	}, "\n")
}

// The pod network: each pod on it gets a veth pair to the host from the CNI ptp plugin, an
// address from host-local and a route to podSubnet only, via the host at podGateway (no default
// route, no masquerading). Test pods use the host network; the notebook validation pods, which the
// workload-controller builds, are on this one and fetch their repository from the test at
// PodGateway.
const (
	PodSubnet  = "10.244.117.0/24"
	PodGateway = "10.244.117.1"
)

func podNetworkConflist(ipamDir, subnet, gateway string, routes []string) string {
	var rs []string
	for _, r := range routes {
		rs = append(rs, fmt.Sprintf(`{"dst": %q}`, r))
	}
	return fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "cistern-e2e", "plugins": [
  {"type": "ptp", "ipMasq": false, "mtu": 1500,
   "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [%s]}}
]}`, ipamDir, subnet, gateway, strings.Join(rs, ", "))
}

// writeRegistryHosts points every registry at the loopback one (containerd's hosts.toml): the
// mirrored names and the registry's own address to it, any other name (_default) to a port
// where nothing listens, so that a pull never leaves the machine.
func (c *Containerd) writeRegistryHosts() error {
	server := "http://" + c.opts.Registry
	if c.opts.RegistryVia != "" {
		server = "http://" + c.opts.RegistryVia
	}
	hosts := map[string]string{"_default": "http://127.0.0.1:1", c.opts.Registry: server}
	for _, m := range c.opts.Mirrored {
		hosts[m] = server
	}
	for name, server := range hosts {
		dir := filepath.Join(c.dir, "certs.d", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		toml := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", server, server)
		if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(toml), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// keepIPForward restores the host's net.ipv4.ip_forward after the test: the ptp plugin turns it
// on when it sets up a pod.
func keepIPForward(t *testing.T) {
	const path = "/proc/sys/net/ipv4/ip_forward"
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(path, before, 0o644); err != nil {
			t.Logf("cleanup: restoring %s: %v", path, err)
		}
	})
}

// StartContainerd starts containerd in dir and imports the test images. Its cleanup kills every
// container it runs before stopping it, so that no shim or mount outlives the test.
func StartContainerd(t *testing.T, bins *Binaries, dir string, opts ContainerdOptions) *Containerd {
	t.Helper()
	if opts.Subnet == "" {
		opts.Subnet, opts.Gateway = PodSubnet, PodGateway
	}
	c := &Containerd{dir: dir, Socket: filepath.Join(dir, "containerd.sock"), bins: bins, opts: opts}
	if opts.Registry != "" {
		if err := c.writeRegistryHosts(); err != nil {
			t.Fatal(err)
		}
	}
	cniConfDir := filepath.Join(dir, "cni", "net.d")
	if err := os.MkdirAll(cniConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cniConfDir, "10-pods.conflist"), []byte(podNetworkConflist(filepath.Join(dir, "cni", "ipam"), opts.Subnet, opts.Gateway, opts.PodRoutes)), 0o644); err != nil {
		t.Fatal(err)
	}
	keepIPForward(t)
	configPath := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(configPath, []byte(c.config(cniConfDir)), 0o644); err != nil {
		t.Fatal(err)
	}

	args := append(slices.Clone(opts.Enter), bins.containerd, "--config", configPath, "--log-level", "info")
	cmd := exec.Command(args[0], args[1:]...)
	// The shim is found on PATH.
	cmd.Env = append(os.Environ(), "PATH="+bins.shimDir+":"+os.Getenv("PATH"))
	name := opts.LogName
	if name == "" {
		name = "containerd"
	}
	c.process = framework.StartCommand(t, name, cmd)
	// Runs before the process is stopped (cleanups run in reverse).
	t.Cleanup(func() {
		defer LogDuration(t, "killing containers", time.Now())
		c.killContainers(t)
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		if conn, err := net.Dial("unix", c.Socket); err == nil {
			conn.Close()
			if _, err := c.Ctr(ctx, "version"); err == nil {
				break
			}
		}
		select {
		case <-c.process.Done():
			t.Fatalf("containerd exited: %v (log: %s)", c.process.Err(), c.process.LogPath)
		case <-ctx.Done():
			t.Fatalf("containerd not ready: %v (log: %s)", ctx.Err(), c.process.LogPath)
		case <-time.After(100 * time.Millisecond):
		}
	}
	for name, im := range bins.Images {
		if opts.Imported != nil && !slices.Contains(opts.Imported, name) {
			continue
		}
		if out, err := c.Ctr(ctx, "images", "import", im.Tarball); err != nil {
			t.Fatalf("importing %s: %v\n%s", im.Tarball, err, out)
		}
	}
	return c
}

// Ctr runs ctr against this containerd in the CRI namespace and returns its stdout; stderr
// (where it also warns, e.g. about cgroup v1) goes into the error.
func (c *Containerd) Ctr(ctx context.Context, args ...string) (string, error) {
	args = append([]string{"--address", c.Socket, "--namespace", criNamespace}, args...)
	cmd := exec.CommandContext(ctx, c.bins.ctr, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args[4:], " "), err, stderr.String())
	}
	return string(out), nil
}

// killContainers force-deletes every task (SIGKILL, then delete) and container left in the CRI
// namespace: what kubelet did not tear down because the test failed, or because it was stopped
// before it collected the sandboxes of deleted pods.
func (c *Containerd) killContainers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := c.Ctr(ctx, "tasks", "list", "--quiet"); err == nil && strings.TrimSpace(out) != "" {
		if out, err := c.Ctr(ctx, append([]string{"tasks", "delete", "--force"}, strings.Fields(out)...)...); err != nil {
			t.Logf("cleanup: deleting tasks: %v: %s", err, out)
		}
	}
	if out, err := c.Ctr(ctx, "containers", "list", "--quiet"); err == nil && strings.TrimSpace(out) != "" {
		if out, err := c.Ctr(ctx, append([]string{"containers", "delete"}, strings.Fields(out)...)...); err != nil {
			t.Logf("cleanup: deleting containers: %v: %s", err, out)
		}
	}
}
