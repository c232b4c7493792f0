package e2enode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework/realnode"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
)

// What the install suite finds through the environment; hack/make/70-e2enode.mk sets them.
const (
	// ReleaseImagesEnv is the images.json of `make images` (cistern/node, cistern/workload-controller).
	ReleaseImagesEnv = "CISTERN_IMAGES"
	// RegistryBinEnv is hack/images/registry, built by make.
	RegistryBinEnv = "CISTERN_REGISTRY_BIN"

	installNamespace = "cistern-system"
	// The pool, under the DaemonSet's /mnt/cistern hostPath; the overlay's ConfigMap names it.
	installPoolDir = "/mnt/cistern/e2e-install-fast"
	installTimeout = 5 * time.Minute
	// installCgroupRoot is kubelet's --cgroup-root (ownCgroupRoot).
	installCgroupRoot = "cistern-e2einstall"
	// The pod network. Not TestNode's subnet: a host route of a pod address another node suite
	// on this machine also hands out goes with that suite's pod (seen: a pod here losing its
	// route).
	installPodSubnet  = "10.244.118.0/24"
	installPodGateway = "10.244.118.1"
)

// install is the node TestInstall runs deploy/csi on.
type install struct {
	cp         *framework.ControlPlane
	bins       *realnode.Binaries
	dir        string
	registry   string // host:port of the loopback registry
	release    map[string]realnode.ImageEntry
	overlay    string
	examples   string // the overlay of deploy/csi/examples
	resultsDir string
	ns         string
	// podUIDs are the pods of the install seen running, whose cgroups must go with them.
	podUIDs map[string]bool
	// helm installs charts/cistern with the helm command instead of applying the kustomize
	// overlay (install_helm_test.go).
	helm *helmInstall
	// s3Endpoint and exampleData are the examples' S3 server (a pod) and dataset, once they ran.
	s3Endpoint  string
	exampleData *dataset
}

// TestInstall installs Cistern as the README tells users, twice on one real kubelet node whose
// containerd pulls every image from a registry on loopback: deploy/csi with kustomize, then, once
// that is uninstalled, charts/cistern with helm (install_helm_test.go). The node, its control
// plane, containerd and the registry are shared; each install runs every scenario and must
// leave nothing behind. See docs/testing.md ("Install suite").
func TestInstall(t *testing.T) {
	in, cd, nb := startInstallNode(t)
	t.Run("kustomize", func(t *testing.T) { in.scenarios(t, cd, nb, nil) })
	t.Run("helm", func(t *testing.T) { in.scenarios(t, cd, nb, newHelmInstall(t)) })
}

// startInstallNode starts the node the install suite installs on: a control plane, containerd
// pulling from the loopback registry (which also serves the node image under a second tag for
// the upgrade), kubelet.
func startInstallNode(t *testing.T) (*install, *realnode.Containerd, *v1alpha1.NotebookValidationJob) {
	requireMachine(t)
	lockHost(t)
	bins := realnode.FindBinaries(t)
	bins.RequireImages(t, "csi-provisioner", "node-driver-registrar", "livenessprobe", "versitygw")
	in := &install{bins: bins, release: releaseImages(t)}
	registryBin := os.Getenv(RegistryBinEnv)
	if _, err := os.Stat(registryBin); registryBin == "" || err != nil {
		realnode.Unavailable(t, "%s=%q: the registry is not built; run `make e2e-install`", RegistryBinEnv, registryBin)
	}

	dir, err := os.MkdirTemp("", "cistern-e2einstall-")
	if err != nil {
		t.Fatal(err)
	}
	in.dir = dir
	prepareInstallHost(t, dir)

	// The node image also under a second tag, for the upgrade; the notebook example's image and
	// the controller's git image are the stand-ins (hack/images/papermill, hack/images/git).
	nb := exampleNotebook(t)
	in.registry = startRegistry(t, registryBin, []string{
		in.nodeRef() + "=" + in.nodeRef() + "-next",
		in.release["workload-controller"].Ref + "=" + in.release["workload-controller"].Ref + "-next",
		bins.Images["papermill"].Ref + "=" + nb.Spec.PodConfig.ContainerImage,
		bins.Images["git"].Ref + "=" + installGitImage,
	}, filepath.Join(filepath.Dir(bins.Images["pause"].Tarball), "images.json"), os.Getenv(ReleaseImagesEnv))

	ca := realnode.NewNodeCA(t, dir)
	in.cp = framework.StartControlPlane(t, framework.Options{
		ControllerManager: true,
		Scheduler:         true,
		// Webhook Services are reached at an endpoint of the Service (see docs/testing.md).
		APIServerArgs: []string{"--client-ca-file=" + ca.CertFile, "--enable-aggregator-routing=true"},
	})
	serveKubernetesService(t, in.cp)
	// Names of Services for the quick start's class, which names its S3 server so.
	serveClusterDNS(t, in.cp)
	cd := realnode.StartContainerd(t, bins, filepath.Join(dir, "containerd"), realnode.ContainerdOptions{
		Registry: in.registry,
		Mirrored: []string{"registry.k8s.io", "docker.io", "quay.io"},
		// ClusterIPs, as kube-proxy serves them to pods: through the host (serveClusterIP).
		PodRoutes: []string{framework.ServiceClusterIPRange},
		Imported:  []string{"pause"}, // containerd's sandbox image, as a node image preloads it
		Subnet:    installPodSubnet,
		Gateway:   installPodGateway,
	})
	// Its own cgroup tree: a kubelet kills the pods of any other kubelet's tree it shares as
	// orphans, and node suites of older checkouts do not take the node lock.
	k := realnode.StartKubeletWith(t, in.cp, ca, bins.Kubelet, realnode.KubeletOptions{
		NodeName: nodeName, RootDir: realnode.KubeletRootDir, RuntimeSocket: cd.Socket,
		CgroupRoot: realnode.OwnCgroupRoot(t, installCgroupRoot), ClusterDNS: installClusterDNS,
	})
	realnode.WaitNodeReady(t, in.cp, k, nodeName, 2*time.Minute)
	in.overlay = filepath.Join(dir, "overlay")
	return in, cd, nb
}

// scenarios installs with kustomize, or with helm when h is set, runs every scenario and
// uninstalls. Each install has its own results directory and namespace.
func (in *install) scenarios(t *testing.T, cd *realnode.Containerd, nb *v1alpha1.NotebookValidationJob, h *helmInstall) {
	in.helm, in.podUIDs, in.examples, in.exampleData = h, map[string]bool{}, "", nil
	in.resultsDir = filepath.Join(in.dir, "results-"+filepath.Base(t.Name()))
	if err := os.Mkdir(in.resultsDir, 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(in.resultsDir, 0o1777); err != nil {
		t.Fatal(err)
	}
	logs := framework.LogDir(t)

	t.Run("apply", func(t *testing.T) {
		if in.helm != nil {
			in.helm.install(t, in)
			return
		}
		in.writeOverlay(t, in.nodeRef())
		out := framework.Kubectl(t, in.cp, "apply", "--server-side", "-k", in.overlay)
		t.Logf("kubectl apply --server-side -k overlay:\n%s", out)
	})
	t.Run("node-pod", func(t *testing.T) { in.waitNodePodReady(t, "", 0) })
	t.Run("registration", func(t *testing.T) {
		// The driver does not register itself: the registrar container registers it. Its
		// socket comes after the pod is Ready (the container has no readiness probe), and
		// before kubelet can list the driver in the CSINode.
		in.waitCSINode(t)
		if _, err := os.Stat(filepath.Join(realnode.KubeletRootDir, "plugins_registry", consts.DriverName+"-reg.sock")); err != nil {
			t.Errorf("no registration socket from the registrar container: %v", err)
		}
	})
	t.Run("storagepools", func(t *testing.T) { in.waitStoragePools(t) })
	if in.helm != nil {
		// The chart's own check, as a user runs it after installing: one restricted pod of the
		// node image, already pulled (TestChartHelmTest checks its rendering).
		t.Run("helm-test", func(t *testing.T) { in.helm.test(t, in) })
	}
	t.Run("workload-controller", func(t *testing.T) { in.checkController(t) })

	in.ns = framework.CreateNamespace(t, in.cp, "e2einstall")
	t.Run("examples", func(t *testing.T) { in.runExamples(t, nb) })
	t.Run("quickstart", func(t *testing.T) { in.runQuickstart(t) })
	// The provisioner publishes capacity per StorageClass: there is one since the examples.
	t.Run("capacity", func(t *testing.T) { in.waitCapacity(t) })
	t.Run("images-pulled", func(t *testing.T) { in.checkPulled(t, cd, nb) })
	var hb *heartbeatPod
	t.Run("workload", func(t *testing.T) { hb = in.startWorkload(t) })
	var sr *streamReader
	scope := t
	t.Run("streaming-workload", func(t *testing.T) { sr = in.startStreamReader(t, scope) })
	t.Run("upgrade", func(t *testing.T) {
		if hb == nil {
			t.Skip("no workload")
		}
		var before reads
		if sr != nil {
			before = sr.counts(t)
		}
		in.upgrade(t, hb)
		if sr != nil {
			sr.after(t, "the DaemonSet's upgrade", before)
		}
	})
	t.Run("driver-kill", func(t *testing.T) {
		if hb == nil {
			t.Skip("no workload")
		}
		var before reads
		if sr != nil {
			before = sr.counts(t)
		}
		in.killDriver(t, hb)
		if sr != nil {
			sr.after(t, "the driver's kill", before)
		}
	})
	t.Run("delete-workloads", func(t *testing.T) { in.deleteWorkloads(t) })
	// The containers' logs, before uninstalling removes them with their pods.
	if t.Failed() {
		if out, err := exec.Command("cp", "-a", filepath.Join(realnode.KubeletRootDir, "pod-logs"), filepath.Join(logs, "pod-logs")).CombinedOutput(); err != nil {
			t.Logf("keeping the containers' logs: %v: %s", err, out)
		}
	}
	// Uninstall runs even when a step failed, so the node is left clean.
	t.Run("uninstall", func(t *testing.T) { in.uninstall(t) })
}

func (in *install) nodeRef() string { return in.release["node"].Ref }

// releaseImages reads the images.json of `make images`.
func releaseImages(t *testing.T) map[string]realnode.ImageEntry {
	t.Helper()
	path := os.Getenv(ReleaseImagesEnv)
	data, err := os.ReadFile(path)
	if err != nil {
		realnode.Unavailable(t, "%s=%q: %v; run `make images`", ReleaseImagesEnv, path, err)
	}
	images := map[string]realnode.ImageEntry{}
	if err := json.Unmarshal(data, &images); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, name := range []string{"node", "workload-controller"} {
		if _, ok := images[name]; !ok {
			t.Fatalf("%s has no %q image", path, name)
		}
	}
	return images
}

// prepareInstallHost makes the host paths deploy/csi's DaemonSet mounts into what a node has:
// kubelet's directory a shared mount (the driver's Bidirectional propagation needs it) and
// /mnt/cistern one too (HostToContainer), with the pool, an ext4 filesystem on a loop device,
// mounted in it. Everything is undone at the end, also on failure.
func prepareInstallHost(t *testing.T, dir string) {
	t.Helper()
	// Cleanups run in reverse: these run last, after every process is stopped.
	t.Cleanup(func() {
		realnode.CleanupHost(t, dir)
		realnode.CleanupCgroups(t)
		if left := realnode.MountsUnder(t, dir); len(left) == 0 {
			_ = os.RemoveAll(dir)
		}
	})
	for _, p := range []string{"/var/lib/cistern", "/run/containerd", "/var/lib/cni"} {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			t.Cleanup(func() { _ = os.RemoveAll(p) })
		}
	}
	for _, p := range []string{realnode.KubeletRootDir, filepath.Dir(installPoolDir)} {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			t.Cleanup(func() { _ = os.RemoveAll(p) })
		} else if len(realnode.MountsUnder(t, p)) > 0 {
			t.Fatalf("%s has mounts already: is another node running here?", p)
		}
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
		realnode.Run(t, "mount", "--bind", p, p)
		t.Cleanup(func() { realnode.CleanupHost(t, p) })
		realnode.Run(t, "mount", "--make-rshared", p)
	}
	img := filepath.Join(dir, "pool.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse; room for the examples' five 1 GiB claims and the workloads'.
	if err := f.Truncate(8 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	realnode.Run(t, "mkfs.ext4", "-q", "-F", img)
	if err := os.MkdirAll(installPoolDir, 0o755); err != nil {
		t.Fatal(err)
	}
	realnode.Run(t, "mount", "-o", "loop", img, installPoolDir)
	t.Cleanup(func() { realnode.DetachLoops(t, dir) })
}

// startRegistry starts the loopback registry with the images of the given images.json files,
// also serving each SRC of retags (SRC=DST) as DST, and returns its address.
func startRegistry(t *testing.T, bin string, retags []string, indexes ...string) string {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), "addr")
	p := framework.StartProcess(t, "registry", bin, "-addr-file", addrFile,
		"-images", strings.Join(indexes, ","), "-retag", strings.Join(retags, ","))
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if data, err := os.ReadFile(addrFile); err == nil {
			return string(data)
		}
		select {
		case <-p.Done():
			t.Fatalf("%v", realnode.ErrExited(p))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry not ready after 3m (log: %s)", p.LogPath)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// serveKubernetesService makes the kubernetes Service's ClusterIP, which in-cluster clients dial
// (KUBERNETES_SERVICE_HOST), reach the API server, as kube-proxy would route it. The pods reach it
// through the pod network's route to it (containerdOptions.podRoutes).
func serveKubernetesService(t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	u, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	serveClusterIP(t, framework.KubernetesServiceIP, 443, func(context.Context) (string, error) { return u.Host, nil })
}

// serveService makes a Service's ClusterIP and port reach a ready endpoint of its EndpointSlices,
// from this host and from the pods, and returns ip:port.
func serveService(t *testing.T, cp *framework.ControlPlane, svc *corev1.Service) string {
	t.Helper()
	port := svc.Spec.Ports[0]
	serveClusterIP(t, svc.Spec.ClusterIP, int(port.Port), func(ctx context.Context) (string, error) {
		list, err := cp.Client.DiscoveryV1().EndpointSlices(svc.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
		if err != nil {
			return "", err
		}
		for _, s := range list.Items {
			for _, p := range s.Ports {
				if p.Port == nil || ptr.Deref(p.Name, "") != port.Name {
					continue
				}
				for _, e := range s.Endpoints {
					if ptr.Deref(e.Conditions.Ready, false) && len(e.Addresses) > 0 {
						return net.JoinHostPort(e.Addresses[0], fmt.Sprint(*p.Port)), nil
					}
				}
			}
		}
		return "", fmt.Errorf("service %s/%s has no ready endpoint", svc.Namespace, svc.Name)
	})
	return net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(port.Port))
}

// serveClusterIP does for one Service port what kube-proxy (in its old userspace mode) does for
// the processes of this host and the pods (whose route to the Service range goes through the
// host): the ClusterIP on the loopback interface, and each connection to ip:port relayed to
// the address target picks for it. A relay rather than kube-proxy's
// netfilter rules, which would change the tables of a host other suites share.
func serveClusterIP(t *testing.T, ip string, port int, target func(context.Context) (string, error)) {
	t.Helper()
	// replace, not add: an interrupted run of a node suite (which the host lock keeps to one at a
	// time) may have left the address; a timed-out test runs no cleanup.
	realnode.Run(t, "ip", "addr", "replace", ip+"/32", "dev", "lo")
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "addr", "del", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Logf("cleanup: removing %s from lo: %v: %s", ip, err, out)
		}
	})
	relay(t, net.JoinHostPort(ip, fmt.Sprint(port)), target)
}

// relayTCP relays every connection to listen to target until the test ends.
func relayTCP(t *testing.T, listen, target string) {
	t.Helper()
	relay(t, listen, func(context.Context) (string, error) { return target, nil })
}

// relay relays every connection to listen to the address target picks for it, until the test
// ends.
func relay(t *testing.T, listen string, target func(context.Context) (string, error)) {
	t.Helper()
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			addr, err := target(ctx)
			cancel()
			var up net.Conn
			if err == nil {
				up, err = net.DialTimeout("tcp", addr, 10*time.Second)
			}
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// writeOverlay writes the kustomization users would: deploy/csi with images: entries for the
// registry (the node image with nodeRef's tag) and the pools ConfigMap for this node's pool.
// Nothing else changes.
func (in *install) writeOverlay(t *testing.T, nodeRef string) {
	t.Helper()
	writeInstallOverlay(t, in.overlay, in.registry, []string{nodeRef, in.release["workload-controller"].Ref}, installPoolDir, []string{"--s3-allow-plain-http"})
}

// writeInstallOverlay writes into dir an overlay of deploy/csi as a user writes one: images:
// entries pointing refs (repository:tag) at registry, a pools ConfigMap with the pool fast at
// poolDir, driverArgs added to the driver's flags (the install suite's --s3-allow-plain-http: the
// examples' S3 server is a pod behind a Service, on plain HTTP), and the given components of
// deploy/csi (e.g. "snapshots").
func writeInstallOverlay(t *testing.T, dir, registry string, refs []string, poolDir string, driverArgs []string, components ...string) {
	t.Helper()
	root, err := realnode.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	base, err := filepath.Rel(dir, filepath.Join(root, "deploy", "csi"))
	if err != nil {
		t.Fatal(err)
	}
	var images strings.Builder
	for _, ref := range refs {
		repo, tag, _ := strings.Cut(ref, ":")
		// Quoted: a tag of digits only (a short commit hash can be) would be a YAML number. The
		// registry serves localhost/PATH (a test image's registry) as PATH.
		fmt.Fprintf(&images, "- name: %s\n  newName: %s/%s\n  newTag: %q\n", repo, registry, strings.TrimPrefix(repo, "localhost/"), tag)
	}
	var comps strings.Builder
	if len(components) > 0 {
		comps.WriteString("components:\n")
		for _, c := range components {
			fmt.Fprintf(&comps, "- %s/%s\n", base, c)
		}
	}
	var driverFlags string
	if len(driverArgs) > 0 {
		// The driver is the first container of the base; the snapshots component puts its
		// csi-snapshotter before it (the test op catches any other order). A flag added after
		// the base's own of the same name wins (the last value of a flag is the one kept).
		driver := 0
		if slices.Contains(components, "snapshots") {
			driver = 1
		}
		driverFlags = fmt.Sprintf(`- target: {kind: DaemonSet, name: cistern-node}
  patch: |-
    - op: test
      path: /spec/template/spec/containers/%d/name
      value: driver
`, driver)
		for _, a := range driverArgs {
			driverFlags += fmt.Sprintf("    - op: add\n      path: /spec/template/spec/containers/%d/args/-\n      value: %q\n", driver, a)
		}
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
%simages:
%s# The notebook comparison and stager images follow the controller's (as make push writes it).
replacements:
- source:
    kind: Deployment
    name: cistern-workload-controller
    fieldPath: spec.template.spec.containers.[name=controller].image
  targets:
  - select: {kind: Deployment, name: cistern-workload-controller}
    fieldPaths:
    - spec.template.spec.containers.[name=controller].env.[name=COMPARE_IMAGE].value
    - spec.template.spec.containers.[name=controller].env.[name=STAGER_IMAGE].value
patches:
%s- patch: |-
    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: cistern-pools
      namespace: cistern-system
    data:
      default.yaml: |
        pools:
        - name: fast
          path: %s
          labels: {media: ssd}
`, base, comps.String(), images.String(), driverFlags, poolDir)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitNodePodReady waits until the DaemonSet's pod runs image (any, when empty) and all five of
// its containers are ready, the driver container having restarted at least minRestarts times.
// The image is the pod's spec: the status names an image by the first tag it was pulled as, and
// both tags of the upgrade are one image.
func (in *install) waitNodePodReady(t *testing.T, image string, minRestarts int32) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	err := pollInstall(time.Second, func(ctx context.Context) (bool, error) {
		pods, err := in.cp.Client.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cistern-node"})
		if err != nil || len(pods.Items) != 1 {
			return false, nil
		}
		p := &pods.Items[0]
		last = p
		in.podUIDs[string(p.UID)] = true
		if p.DeletionTimestamp != nil || len(p.Status.ContainerStatuses) != 5 {
			return false, nil
		}
		if image != "" && !strings.HasSuffix(p.Spec.Containers[0].Image, image) {
			return false, nil
		}
		for _, cs := range p.Status.ContainerStatuses {
			if !cs.Ready {
				return false, nil
			}
			if cs.Name == "driver" && cs.RestartCount < minRestarts {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		name := ""
		if last != nil {
			name = last.Name
		}
		t.Fatalf("node pod not Ready with 5 containers: %v\n%s%s", err, describe(in.cp, installNamespace, "Pod", name, last), containerStates(last))
	}
	return last
}

// pollInstall checks cond every interval until it holds, fails or installTimeout has passed.
func pollInstall(interval time.Duration, cond wait.ConditionWithContextFunc) error {
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, interval, true, cond)
}

func containerStates(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	var b strings.Builder
	for _, cs := range p.Status.ContainerStatuses {
		fmt.Fprintf(&b, "  container %s ready=%v restarts=%d image=%s state=%+v last=%+v\n", cs.Name, cs.Ready, cs.RestartCount, cs.Image, cs.State, cs.LastTerminationState)
	}
	return b.String()
}

func (in *install) waitCSINode(t *testing.T) {
	t.Helper()
	err := pollInstall(time.Second, func(ctx context.Context) (bool, error) {
		cn, err := in.cp.Client.StorageV1().CSINodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, d := range cn.Spec.Drivers {
			if d.Name == consts.DriverName && d.NodeID == nodeName {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CSINode %s does not list %s: %v", nodeName, consts.DriverName, err)
	}
}

// waitStoragePools waits for the sidecar container's StoragePool of the pool.
func (in *install) waitStoragePools(t *testing.T) {
	t.Helper()
	var out string
	err := pollInstall(2*time.Second, func(ctx context.Context) (bool, error) {
		out = kubectlOutput(in.cp, "get", "storagepools", "-o", "jsonpath={range .items[*]}{.metadata.name}{\" \"}{end}")
		return strings.Contains(out, "fast"), nil
	})
	if err != nil {
		t.Fatalf("no StoragePool for pool fast (have %q): %v", out, err)
	}
}

// waitCapacity waits for the provisioner container's CSIStorageCapacity of this node's pool.
func (in *install) waitCapacity(t *testing.T) {
	t.Helper()
	err := pollInstall(2*time.Second, func(ctx context.Context) (bool, error) {
		list, err := in.cp.Client.StorageV1().CSIStorageCapacities(installNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range list.Items {
			if c.Capacity != nil && c.Capacity.Value() > 0 {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no CSIStorageCapacity with capacity in %s: %v", installNamespace, err)
	}
}

// checkController waits for the Deployment, then has the API server call its validating
// webhook through the webhook Service: an invalid LeaderWorkerSet must be refused by it.
func (in *install) checkController(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	var dep *appsv1.Deployment
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		d, err := in.cp.Client.AppsV1().Deployments(installNamespace).Get(ctx, "cistern-workload-controller", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		dep = d
		return d.Status.ReadyReplicas == *d.Spec.Replicas && d.Status.UpdatedReplicas == *d.Spec.Replicas, nil
	})
	if pods, err := in.cp.Client.CoreV1().Pods(installNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cistern-workload-controller"}); err == nil {
		for _, p := range pods.Items {
			in.podUIDs[string(p.UID)] = true
		}
	}
	if err != nil {
		var status appsv1.DeploymentStatus
		if dep != nil {
			status = dep.Status
		}
		t.Fatalf("workload-controller Deployment not Ready: %v (status %+v)", err, status)
	}
	// A claim template without access modes passes the CRD's schema; only the validating
	// webhook (pkg/workloads/lws/validation.go) refuses it, with its own words. The controller
	// injects the CA bundle at start: retry until the webhook answers.
	lws := `apiVersion: workloads.cistern.dev/v1alpha1
kind: LeaderWorkerSet
metadata: {name: invalid, namespace: default}
spec:
  replicas: 1
  leaderWorkerTemplate:
    size: 1
    workerTemplate:
      spec:
        containers: [{name: w, image: unused}]
    volumeClaimTemplates:
    - metadata: {name: data}
      spec: {}
`
	var last string
	err = wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		last = kubectlStdin(in.cp, lws, "apply", "--server-side", "--dry-run=server", "-f", "-")
		return strings.Contains(last, "at least one access mode"), nil
	})
	if err != nil {
		t.Fatalf("the webhooks did not answer through the Service: %v; last: %s", err, last)
	}
	if strings.Contains(last, "failed calling webhook") {
		t.Fatalf("the API server could not call the webhook: %s", last)
	}
	t.Logf("webhook answered: %s", strings.TrimSpace(last))
}

// checkPulled checks that containerd pulled every image of the pods from the registry: its image
// store has them under the registry's names, and the pause image is the only one imported.
func (in *install) checkPulled(t *testing.T, cd *realnode.Containerd, nb *v1alpha1.NotebookValidationJob) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := cd.Ctr(ctx, "images", "list", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		in.registry + "/" + strings.TrimPrefix(in.release["node"].Ref, ""),
		in.registry + "/" + in.release["workload-controller"].Ref,
		in.bins.Images["csi-provisioner"].Ref,
		in.bins.Images["node-driver-registrar"].Ref,
		in.bins.Images["livenessprobe"].Ref,
		in.registry + "/" + strings.TrimPrefix(in.bins.Images["versitygw"].Ref, "localhost/"),
		in.registry + "/" + strings.TrimPrefix(in.bins.Images["checker"].Ref, "localhost/"),
		"docker.io/library/busybox:1.37",
		"docker.io/" + installGitImage,
		nb.Spec.PodConfig.ContainerImage,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("containerd has no %s:\n%s", want, out)
		}
	}
}

// uninstall deletes what apply created and checks the node is left with nothing of Cistern.
func (in *install) uninstall(t *testing.T) {
	t.Helper()
	if in.helm != nil {
		in.helm.uninstall(t, in)
	} else {
		kubectlOutput(in.cp, "delete", "-k", in.overlay, "--wait=true", "--timeout=3m", "--ignore-not-found")
	}
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := in.cp.Client.CoreV1().Namespaces().Get(ctx, installNamespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("namespace %s not deleted: %v", installNamespace, err)
	}
	// kubelet removes a deleted pod's cgroups shortly after its containers.
	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
		return len(in.podCgroups()) == 0, nil
	})
	if err != nil {
		t.Errorf("cgroups of the uninstalled pods left: %v", in.podCgroups())
	}
	for _, p := range []string{
		filepath.Join(realnode.KubeletRootDir, "plugins_registry", consts.DriverName+"-reg.sock"),
		filepath.Join(realnode.KubeletRootDir, "plugins", consts.DriverName, "csi.sock"),
	} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s left after uninstall: %v", p, err)
		}
	}
	if left := csiMounts(t); len(left) > 0 {
		t.Errorf("CSI mounts left: %v", left)
	}
	if loops := realnode.LoopDevicesUnder(t, installPoolDir); len(loops) > 0 {
		t.Errorf("loop devices of volumes left: %v", loops)
	}
	if pids := driverPIDs(t); len(pids) > 0 {
		t.Errorf("driver processes left: %v", pids)
	}
	// Nothing of the install outside its namespace: CRDs, cluster roles, the CSIDriver, webhook
	// configurations, admission policies, the Role for Events in "default".
	for _, get := range [][]string{
		{"get", "crd,clusterrole,clusterrolebinding,csidriver,mutatingwebhookconfiguration,validatingwebhookconfiguration,validatingadmissionpolicy,validatingadmissionpolicybinding"},
		{"get", "role,rolebinding", "-n", "default"},
	} {
		out := kubectlOutput(in.cp, append(get, "-l", "app.kubernetes.io/part-of=cistern", "-o", "name")...)
		if strings.TrimSpace(out) != "" && !strings.Contains(out, "No resources found") {
			t.Errorf("left after uninstall:\n%s", out)
		}
	}
}

// podCgroups lists the cgroup directories (cgroupfs driver) of the install's pods that remain.
func (in *install) podCgroups() []string {
	var left []string
	for uid := range in.podUIDs {
		m, _ := filepath.Glob("/sys/fs/cgroup/*/" + installCgroupRoot + "/kubepods*/pod" + uid)
		m2, _ := filepath.Glob("/sys/fs/cgroup/*/" + installCgroupRoot + "/kubepods*/*/pod" + uid)
		left = append(left, append(m, m2...)...)
	}
	return left
}

// kubectlOutput runs the project's kubectl and returns its combined output, failing nothing.
func kubectlOutput(cp *framework.ControlPlane, args ...string) string {
	return kubectlStdin(cp, "", args...)
}

func kubectlStdin(cp *framework.ControlPlane, stdin string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(cp.BinDir, "kubectl"), append([]string{"--kubeconfig=" + cp.Kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s\n(%v)", out, err)
	}
	return string(out)
}

// heartbeatPod is a pod writing and reading its claim every second (hack/images/checker).
type heartbeatPod struct {
	name string
}

// startWorkload creates the example StorageClass (deploy/csi/examples/storageclass-fast.yaml)
// and a pod with a 64 MiB claim of it that writes to ENOSPC, then keeps a heartbeat.
func (in *install) startWorkload(t *testing.T) *heartbeatPod {
	t.Helper()
	ctx := context.Background()
	if _, err := in.cp.Client.CoreV1().PersistentVolumeClaims(in.ns).Create(ctx, pvc("data", "cistern-fast", "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hb := &heartbeatPod{name: "heartbeat"}
	pod := in.checker(hb.name, "data", "-write-read", "-size", "4194304", "-fill", "-heartbeat", "1s")
	createPod(t, in.cp, in.ns, pod)
	waitPodRunning(t, in.cp, in.ns, hb.name)
	d := readResult(t, in.resultsDir, hb.name).Dirs[0]
	if d.WriteRead == nil || !d.WriteRead.OK {
		t.Errorf("write and read back failed: %+v", d.WriteRead)
	}
	if d.Fill == nil || !d.Fill.ENOSPC || d.Fill.Bytes > 64<<20 {
		t.Errorf("filling the 64 MiB claim: %+v, want ENOSPC within 64 MiB", d.Fill)
	}
	return hb
}

// checker is a checker pod, pulled from the registry, using claim at /data.
func (in *install) checker(name, claim string, args ...string) *corev1.Pod {
	image := in.registry + "/" + strings.TrimPrefix(in.bins.Images["checker"].Ref, "localhost/")
	pod := checkerPod(image, in.resultsDir, name,
		[]corev1.Volume{pvcVolume("data", claim)},
		[]corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
		append([]string{"-dir", "/data"}, args...)...)
	pod.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
	return pod
}

// waitHeartbeat waits for a successful heartbeat written after since.
func (in *install) waitHeartbeat(t *testing.T, hb *heartbeatPod, since time.Time) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last Heartbeat
	for {
		readJSON(t, filepath.Join(in.resultsDir, hb.name+".heartbeat.json"), &last)
		if !last.OK {
			t.Fatalf("heartbeat failed: %s", last.Error)
		}
		if last.Time.After(since) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat since %s (last %+v)", since.Format(time.RFC3339), last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// csiMounts lists the CSI mounts in kubelet's directory, sorted (mountinfo's order changes when
// the driver's container comes and goes, its mounts propagating both ways).
func csiMounts(t *testing.T) []string {
	var mounts []string
	for _, mp := range realnode.MountsUnder(t, realnode.KubeletRootDir) {
		if strings.Contains(mp, "/kubernetes.io~csi/") || strings.Contains(mp, "/plugins/kubernetes.io/csi/") {
			mounts = append(mounts, mp)
		}
	}
	slices.Sort(mounts)
	return mounts
}

// upgrade applies the overlay with a second node image tag: the DaemonSet rolls its pod while
// the workload keeps writing and reading, and its mounts are the same afterwards.
func (in *install) upgrade(t *testing.T, hb *heartbeatPod) {
	t.Helper()
	before := csiMounts(t)
	next := in.nodeRef() + "-next"
	if in.helm != nil {
		in.helm.upgrade(t, in, "-next")
	} else {
		in.writeOverlay(t, next)
		framework.Kubectl(t, in.cp, "apply", "--server-side", "-k", in.overlay)
	}
	start := time.Now()
	in.waitNodePodReady(t, strings.TrimPrefix(next, "cistern/node"), 0)
	t.Logf("node pod rolled to %s in %s", next, time.Since(start).Round(time.Second))
	in.waitHeartbeat(t, hb, time.Now())
	if after := csiMounts(t); strings.Join(before, "\n") != strings.Join(after, "\n") {
		t.Errorf("mounts changed across the upgrade:\nbefore %v\nafter  %v", before, after)
	}
}

// killDriver kills the driver process in its container: kubelet restarts the container, the
// workload keeps working, and a new claim is provisioned and mounted.
func (in *install) killDriver(t *testing.T, hb *heartbeatPod) {
	t.Helper()
	pod := in.waitNodePodReady(t, "", 0)
	var restarts int32
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == "driver" {
			restarts = cs.RestartCount
		}
	}
	pids := driverPIDs(t)
	if len(pids) != 1 {
		t.Fatalf("want one csi-driver process on the node, found %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	in.waitNodePodReady(t, "", restarts+1)
	t.Logf("driver container restarted and Ready %s after the kill", time.Since(killed).Round(time.Second))
	in.waitHeartbeat(t, hb, time.Now())

	ctx := context.Background()
	if _, err := in.cp.Client.CoreV1().PersistentVolumeClaims(in.ns).Create(ctx, pvc("after-kill", "cistern-fast", "32Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPod(t, in.cp, in.ns, in.checker("after-kill", "after-kill", "-write-read"))
	waitPodRunning(t, in.cp, in.ns, "after-kill")
	if d := readResult(t, in.resultsDir, "after-kill").Dirs[0]; d.WriteRead == nil || !d.WriteRead.OK {
		t.Errorf("a new claim after the restart: write and read back failed: %+v", d.WriteRead)
	}
}

// driverPIDs finds the driver's processes by their command line, as the DaemonSet starts them.
func driverPIDs(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 1 && args[0] == "/usr/local/bin/csi-driver" && strings.Contains(string(cmdline), "--endpoint=unix:///csi/csi.sock") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// deleteWorkloads deletes the examples and the workloads' pods and claims, and waits until the
// volumes are gone.
func (in *install) deleteWorkloads(t *testing.T) {
	t.Helper()
	in.deleteExamples(t)
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	_ = framework.DeleteAllPods(ctx, in.cp, in.ns)
	_ = in.cp.Client.CoreV1().PersistentVolumeClaims(in.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	in.deleteStreamPV(ctx)
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := in.cp.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("PersistentVolumes not deleted: %v", err)
	}
	if left := csiMounts(t); len(left) > 0 {
		t.Errorf("CSI mounts left after the workloads are deleted: %v", left)
	}
}
