package e2enode

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework/realnode"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/specgate"
	"github.com/cistern-csi/cistern/test/testutil"
)

// What TestK8sStorageE2E finds through the environment; hack/make/80-k8se2e.mk sets them.
const (
	// K8sE2EBinEnv is the directory with e2e.test and ginkgo (make k8s-e2e-tools).
	K8sE2EBinEnv = "CISTERN_K8S_E2E_BIN"
	// K8sE2EImagesEnv is the images.json of make k8s-e2e-images.
	K8sE2EImagesEnv = "CISTERN_K8S_E2E_IMAGES"
	// SnapshotCRDsEnv is external-snapshotter's client/config/crd directory.
	SnapshotCRDsEnv = "CISTERN_SNAPSHOT_CRDS"
	// SnapshotControllerEnv is external-snapshotter's deploy/kubernetes/snapshot-controller.
	SnapshotControllerEnv = "CISTERN_SNAPSHOT_CONTROLLER"
	// K8sE2ERunsEnv selects the runs (k8sE2ERuns), comma-separated; all when empty.
	K8sE2ERunsEnv = "CISTERN_K8S_E2E_RUNS"
	// K8sE2ENodesEnv is the number of nodes (1 or 2; default 2).
	K8sE2ENodesEnv = "CISTERN_K8S_E2E_NODES"
	// K8sE2EProcsEnv is ginkgo's number of parallel processes (default 4).
	K8sE2EProcsEnv = "CISTERN_K8S_E2E_PROCS"
	// K8sE2EFocusEnv, when set, adds the run "focus": the External Storage tests of the
	// testdriver matching this regular expression (e.g. one test, to reproduce a failure).
	K8sE2EFocusEnv = "CISTERN_K8S_E2E_FOCUS"

	// k8sE2EPoolDir is where each node's pool is mounted, in its own mount namespace.
	k8sE2EPoolDir = "/mnt/cistern/e2e-fast"
	// The pools are sparse: room for the volumes of the tests running at once.
	k8sE2EPoolSize = 24 << 30
	// The path of the testdriver in the repository; e2e.test reads it while parsing its flags,
	// before --repo-root applies, so it gets the absolute path. The StorageClass file it names
	// is resolved against --repo-root.
	k8sE2ETestDriver = "test/k8se2e/testdriver.yaml"
	// The testdriver of the "expansion" run: the same driver with xfs as its default filesystem.
	k8sE2ETestDriverXFS = "test/k8se2e/testdriver-xfs.yaml"
)

// k8sE2ERun is one ginkgo run of e2e.test.
type k8sE2ERun struct {
	name        string
	focus, skip string
	// streaming runs with test/k8se2e/testdriver-streaming.yaml (inline volumes with
	// dataMode: streaming over a public S3 dataset) rather than testdriver.yaml, and is held
	// to the streaming path (checkStreamed).
	streaming bool
	// testDriver is the run's testdriver, relative to the repository (default k8sE2ETestDriver).
	testDriver string
}

// The storage e2e runs. "storage" is every External Storage test of the testdriver without
// [Disruptive] and [Serial] (they restart kubelet or need the whole cluster) and without the
// [Feature:...] tests that need a component absent here: VolumeAttributesClass (its
// modifications are driven by external-resizer, which cannot be built here; its stand-in only
// expands), SELinux (no SELinux on these hosts); VolumeSnapshotDataSource runs on its own in
// "snapshots". "expansion" is the expansion tests that grow a volume in use, with xfs as the
// default filesystem (test/k8se2e/testdriver-xfs.yaml): ext4 grows online only with
// CAP_SYS_RESOURCE, which these machines do not grant, so testdriver.yaml (ext4 by default)
// declares offline expansion only and "storage" runs those. "subset" is the
// representative part `make test` runs (docs/testing.md). "streaming" is the CSI ephemeral test
// that fits a read-only inline volume, with streaming volumes: the other two that take a CSI
// inline volume of the testdriver ("two pods which have the same volume definition", "multiple
// inline ephemeral volumes") mount it read/write in their first pod, and skip themselves for a
// read-only one.
var k8sE2ERuns = []k8sE2ERun{
	{name: "storage",
		focus: `External.Storage.*cistern\.csi\.dev`,
		skip:  `\[Disruptive\]|\[Serial\]|\[Feature:VolumeAttributesClass\]|\[Feature:SELinux\]|\[Feature:VolumeSnapshotDataSource\]`},
	{name: "expansion",
		focus:      `External.Storage.*cistern\.csi\.dev.*(\(allowExpansion\)\] volume-expand should resize volume|Generic Ephemeral-volume .*\] ephemeral should support expansion of pvcs created for ephemeral pvcs)`,
		skip:       `\[Disruptive\]|\[Serial\]`,
		testDriver: k8sE2ETestDriverXFS},
	{name: "snapshots",
		focus: `External.Storage.*cistern\.csi\.dev.*\[Feature:VolumeSnapshotDataSource\]`,
		skip:  `\[Disruptive\]|\[Serial\]`},
	{name: "subset",
		focus: `External.Storage.*cistern\.csi\.dev.*\[Testpattern: (` +
			`Dynamic PV \(default fs\)\] (provisioning should provision storage with pvc data source|volumes should store data|subPath should support existing directory)|` +
			`Dynamic PV \(block volmode\)\] volumes should store data|` +
			`CSI Ephemeral-volume \(default fs\)\] ephemeral should create read/write inline ephemeral volume|` +
			`Generic Ephemeral-volume \(default fs\) \(late-binding\)\] ephemeral should create read/write inline ephemeral volume|` +
			`Dynamic Snapshot \(delete policy\)\] snapshottable.*should check snapshot fields, check restore correctly works after modifying source data, check deletion \(persistent\))$`,
		skip: `\[Disruptive\]|\[Serial\]`},
	{name: "streaming",
		focus:     `External.Storage.*cistern\.csi\.dev.*\[Testpattern: CSI Ephemeral-volume \(default fs\)\] ephemeral should create read-only inline ephemeral volume$`,
		skip:      `\[Disruptive\]|\[Serial\]`,
		streaming: true},
}

// TestK8sStorageE2E runs Kubernetes' own storage e2e suite (e2e.test's External Storage tests,
// with test/k8se2e/testdriver.yaml) against Cistern installed from deploy/csi (plus the
// snapshots component) on kubelet nodes in their own network namespaces; see docs/testing.md,
// "Kubernetes storage e2e".
func TestK8sStorageE2E(t *testing.T) {
	requireMachine(t)
	lockHost(t)
	bins := realnode.FindBinaries(t)
	bins.RequireImages(t, "csi-provisioner", "node-driver-registrar", "livenessprobe", "csi-resizer", "busybox")
	release := releaseImages(t)
	e2eBin := os.Getenv(K8sE2EBinEnv)
	for _, f := range []string{"e2e.test", "ginkgo"} {
		if _, err := os.Stat(filepath.Join(e2eBin, f)); e2eBin == "" || err != nil {
			realnode.Unavailable(t, "%s=%q has no %s; run `make k8s-e2e-tools`", K8sE2EBinEnv, e2eBin, f)
		}
	}
	e2eImages := os.Getenv(K8sE2EImagesEnv)
	crds, controller := os.Getenv(SnapshotCRDsEnv), os.Getenv(SnapshotControllerEnv)
	for env, path := range map[string]string{K8sE2EImagesEnv: e2eImages, SnapshotCRDsEnv: crds, SnapshotControllerEnv: controller} {
		if _, err := os.Stat(path); path == "" || err != nil {
			realnode.Unavailable(t, "%s=%q: not found; run `make e2e-k8s`", env, path)
		}
	}
	registryBin := os.Getenv(RegistryBinEnv)
	if _, err := os.Stat(registryBin); registryBin == "" || err != nil {
		realnode.Unavailable(t, "%s=%q: the registry is not built; run `make e2e-k8s`", RegistryBinEnv, registryBin)
	}
	runs := selectRuns(t)
	nodes := 2
	if v := os.Getenv(K8sE2ENodesEnv); v != "" {
		var err error
		if nodes, err = strconv.Atoi(v); err != nil || nodes < 1 || nodes > 2 {
			t.Fatalf("%s=%q: want 1 or 2", K8sE2ENodesEnv, v)
		}
	}
	root, err := realnode.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}

	dir := netnsNodesDir(t, "cistern-k8se2e-")
	logs := framework.LogDir(t)
	begin := time.Now()

	nodeIndex := filepath.Join(filepath.Dir(bins.Images["pause"].Tarball), "images.json")
	registry := startRegistry(t, registryBin, []string{
		// e2e.test's busybox and pause, under the tags its image list names.
		bins.Images["busybox"].Ref + "=registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
		bins.Images["pause"].Ref + "=registry.k8s.io/pause:3.10.2",
		// Stand-ins (docs/testing.md): the storage tests run only shell commands in the nginx
		// image (the exec test: `ls`) and the glibc-dns-testing one (the multi-volume tests:
		// GNU dd with oflag=nocache, which busybox lacks), never nginx or the DNS tools. busybox
		// serves as nginx; Cistern's node image, Debian bookworm with coreutils as the real
		// image's Debian base has, as glibc-dns-testing.
		bins.Images["busybox"].Ref + "=registry.k8s.io/e2e-test-images/nginx:1.27.0-2",
		release["node"].Ref + "=registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1",
	}, nodeIndex, os.Getenv(ReleaseImagesEnv), e2eImages)
	_, registryPort, err := net.SplitHostPort(registry)
	if err != nil {
		t.Fatal(err)
	}

	ca := realnode.NewNodeCA(t, dir)
	clientCert, clientKey := ca.ClientCertFiles(t, dir, "apiserver-kubelet-client", "kube-apiserver-kubelet-client")
	cp := framework.StartControlPlane(t, framework.Options{
		ControllerManager: true,
		Scheduler:         true,
		APIServerArgs: []string{
			"--client-ca-file=" + ca.CertFile,
			// Webhook Services are reached at an endpoint of the Service (docs/testing.md).
			"--enable-aggregator-routing=true",
			// exec, logs and port-forward go to kubelet at the node's address, verified
			// against the node CA, with a client certificate kubelet trusts.
			"--kubelet-certificate-authority=" + ca.CertFile,
			"--kubelet-client-certificate=" + clientCert,
			"--kubelet-client-key=" + clientKey,
			"--kubelet-preferred-address-types=InternalIP",
		},
	})
	// kubelet authorizes the API server's calls with a SubjectAccessReview (webhook mode).
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(context.Background(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-apiserver-kubelet-client"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "kube-apiserver-kubelet-client"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	serveKubernetesService(t, cp)
	var streaming *k8sE2EStreaming
	var driverArgs []string
	if slices.ContainsFunc(runs, func(r k8sE2ERun) bool { return r.streaming }) {
		streaming = startK8sE2EStreaming(t, root, dir)
		driverArgs = streaming.driverArgs()
	}

	// The nodes' PID 1: the pause program, which reaps orphans.
	init := filepath.Join(dir, "init")
	build := testutil.GoBuild(init, "./pause")
	build.Dir = filepath.Join(root, "hack", "images")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building hack/images/pause: %v\n%s", err, out)
	}
	var names []string
	netnsNodes := map[string]*realnode.NetnsNode{}
	for i := range nodes {
		name := fmt.Sprintf("cistern-k8se2e-%c", 'a'+i)
		names = append(names, name)
		n := realnode.StartNetnsNode(t, dir, i, name, k8sE2EPoolDir, k8sE2EPoolSize, init)
		netnsNodes[name] = n
		// The node pulls through a relay on its link to the loopback registry, under the
		// registry's own name (what KUBE_TEST_REPO_LIST gives e2e.test) and the mirrored ones.
		relayTCP(t, net.JoinHostPort(n.HostIP, registryPort), registry)
		cd := realnode.StartContainerd(t, bins, filepath.Join(n.Dir, "containerd"), realnode.ContainerdOptions{
			Registry:    registry,
			RegistryVia: net.JoinHostPort(n.HostIP, registryPort),
			Mirrored:    []string{"registry.k8s.io", "docker.io"},
			// And the host's end of the node's link: the API server calls the
			// workload-controller's webhooks (the node-created PV policy among them) at their
			// pod addresses from there, and without this route their answers had no way back.
			PodRoutes: []string{framework.KubernetesServiceIP + "/32", n.HostIP + "/32"},
			Imported:  []string{"pause"},
			Subnet:    n.PodSubnet,
			Gateway:   n.PodGateway,
			LogName:   "containerd-" + name,
			Enter:     n.Enter,
		})
		k := realnode.StartKubeletWith(t, cp, ca, bins.Kubelet, realnode.KubeletOptions{
			NodeName: name, RootDir: realnode.KubeletRootDir, RuntimeSocket: cd.Socket, CgroupRoot: n.CgroupRoot,
			LogName: "kubelet-" + name, Enter: n.Enter, NodeIP: n.NodeIP,
			Server: "https://" + net.JoinHostPort(framework.KubernetesServiceIP, "443"),
		})
		realnode.WaitNodeReady(t, cp, k, name, 2*time.Minute)
	}
	t.Logf("%d nodes Ready %s after start", nodes, time.Since(begin).Round(time.Second))

	t.Run("install", func(t *testing.T) {
		installForE2E(t, cp, dir, registry, []string{release["node"].Ref, release["workload-controller"].Ref, bins.Images["csi-resizer"].Ref}, crds, controller, names, driverArgs)
		if streaming != nil {
			streaming.applyPolicy(t, cp, root)
		}
	})
	if t.Failed() {
		return
	}
	t.Logf("installed %s after start", time.Since(begin).Round(time.Second))
	t.Run("kubelet-api", func(t *testing.T) { checkKubeletAPI(t, cp, registry, names) })

	repoList := filepath.Join(dir, "repo-list.yaml")
	// Every registry e2e.test's image list names that an External Storage test pulls from.
	if err := os.WriteFile(repoList, []byte(fmt.Sprintf(`promoterE2eRegistry: %[1]s/e2e-test-images
gcRegistry: %[1]s
gcEtcdRegistry: %[1]s
sigStorageRegistry: %[1]s/sig-storage
dockerLibraryRegistry: %[1]s/library
`, registry)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			if !r.streaming {
				driver := cmp.Or(r.testDriver, k8sE2ETestDriver)
				runGinkgo(t, cp, root, e2eBin, filepath.Join(root, driver), repoList, logs, r)
				return
			}
			w := watchPodVolumes(netnsNodes)
			passed := runGinkgo(t, cp, root, e2eBin, streaming.testDriver, repoList, logs, r)
			checkStreamed(t, cp, w.end(), passed)
		})
	}
}

// selectRuns returns the runs K8sE2ERunsEnv names (default: storage, expansion, snapshots and
// streaming).
func selectRuns(t *testing.T) []k8sE2ERun {
	want := os.Getenv(K8sE2ERunsEnv)
	if want == "" {
		want = "storage,expansion,snapshots,streaming"
	}
	all := k8sE2ERuns
	if f := os.Getenv(K8sE2EFocusEnv); f != "" {
		all = append(slices.Clone(all), k8sE2ERun{name: "focus",
			focus: `External.Storage.*cistern\.csi\.dev.*(` + f + `)`, skip: `\[Disruptive\]|\[Serial\]`})
	}
	var runs []k8sE2ERun
	for _, name := range strings.Split(want, ",") {
		found := false
		for _, r := range all {
			if r.name == name {
				runs, found = append(runs, r), true
			}
		}
		if !found {
			t.Fatalf("%s: no run %q", K8sE2ERunsEnv, name)
		}
	}
	return runs
}

// installForE2E installs what the suite tests: the VolumeSnapshot CRDs and upstream's
// snapshot-controller (distributed snapshotting, as node-local volumes need), and deploy/csi
// with the snapshots component and the external-resizer stand-in (test/k8se2e/resizer) through
// an overlay as a user writes one (images, the refs served by the registry; driverArgs added to
// the node plugin's flags); then waits for every node's pod and the controllers.
func installForE2E(t *testing.T, cp *framework.ControlPlane, dir, registry string, images []string, crds, controller string, nodes, driverArgs []string) {
	framework.Kubectl(t, cp, "apply", "--server-side", "-k", crds)

	sc := filepath.Join(dir, "snapshot-controller")
	if err := os.MkdirAll(sc, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"rbac-snapshot-controller.yaml", "setup-snapshot-controller.yaml"} {
		data, err := os.ReadFile(filepath.Join(controller, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sc, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Upstream's manifests, with the version built here and the flag (and the permission
	// upstream documents for it) that hands each snapshot to the node of its volume.
	if err := os.WriteFile(filepath.Join(sc, "kustomization.yaml"), []byte(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- rbac-snapshot-controller.yaml
- setup-snapshot-controller.yaml
images:
- name: registry.k8s.io/sig-storage/snapshot-controller
  newName: `+registry+`/sig-storage/snapshot-controller
  newTag: v8.7.0
patches:
- target: {kind: Deployment, name: snapshot-controller}
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --enable-distributed-snapshotting
- target: {kind: ClusterRole, name: snapshot-controller-runner}
  patch: |-
    - op: add
      path: /rules/-
      value: {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	framework.Kubectl(t, cp, "apply", "--server-side", "-k", sc)

	overlay := filepath.Join(dir, "overlay")
	// Components are named relative to deploy/csi.
	writeInstallOverlay(t, overlay, registry, images, k8sE2EPoolDir, driverArgs, "snapshots", "../../test/k8se2e/resizer")
	framework.Kubectl(t, cp, "apply", "--server-side", "-k", overlay)

	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	var last string // what the last complete round found not ready
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		var round string
		for _, ns := range []string{installNamespace, "kube-system"} {
			pods, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			for _, p := range pods.Items {
				if !podReady(&p) {
					round += fmt.Sprintf(" %s/%s(%s on %s%s)", ns, p.Name, p.Status.Phase, p.Spec.NodeName, podWaiting(&p))
				}
			}
		}
		ds, err := cp.Client.AppsV1().DaemonSets(installNamespace).Get(ctx, "cistern-node", metav1.GetOptions{})
		if err != nil || ds.Status.NumberReady != int32(len(nodes)) {
			last = round + " cistern-node not ready on every node"
			return false, nil
		}
		for _, n := range nodes {
			cn, err := cp.Client.StorageV1().CSINodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil || len(cn.Spec.Drivers) == 0 || cn.Spec.Drivers[0].Name != consts.DriverName {
				last = round + " no CSINode driver on " + n
				return false, nil
			}
		}
		last = round
		return round == "", nil
	})
	if err != nil {
		t.Fatalf("install not ready after %s: %v; not ready:%s", installTimeout, err, last)
	}
}

// checkKubeletAPI runs a pod on each node and reads its log and runs a command in it with
// kubectl: the API server reaches each kubelet at its node address, verifies it against the
// node CA, and kubelet accepts the API server's client certificate.
func checkKubeletAPI(t *testing.T, cp *framework.ControlPlane, registry string, nodes []string) {
	ns := framework.CreateNamespace(t, cp, "kubelet-api")
	for _, node := range nodes {
		name := "echo-" + node
		createPod(t, cp, ns, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				NodeName:                      node,
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{
					Name:    "echo",
					Image:   registry + "/e2e-test-images/busybox:1.37.0-2",
					Command: []string{"sh", "-c", "echo hello from $(hostname); exec sleep 3600"},
				}},
			},
		})
		waitPodRunning(t, cp, ns, name)
		if out := kubectlOutput(cp, "logs", "-n", ns, name); !strings.Contains(out, "hello from "+name) {
			t.Errorf("kubectl logs of a pod on %s: %q", node, out)
		}
		if out := kubectlOutput(cp, "exec", "-n", ns, name, "--", "cat", "/etc/hostname"); strings.TrimSpace(out) != name {
			t.Errorf("kubectl exec in a pod on %s: %q", node, out)
		}
		_ = cp.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// runGinkgo runs e2e.test under ginkgo with the run's focus and skip and the testdriver (an
// absolute path), in parallel processes, keeps its output and JSON report in the logs, holds the
// run to its expected spec count, and returns the number of specs that passed.
func runGinkgo(t *testing.T, cp *framework.ControlPlane, root, bin, testDriver, repoList, logs string, r k8sE2ERun) int {
	procs := 4
	if v := os.Getenv(K8sE2EProcsEnv); v != "" {
		var err error
		if procs, err = strconv.Atoi(v); err != nil || procs < 1 {
			t.Fatalf("%s=%q", K8sE2EProcsEnv, v)
		}
	}
	report := filepath.Join(logs, "ginkgo-"+r.name+".json")
	out := filepath.Join(logs, "ginkgo-"+r.name+".log")
	// ginkgo runs e2e.test in the binary's directory and puts reports under --output-dir.
	args := []string{
		"--procs=" + strconv.Itoa(procs), "--no-color", "--timeout=3h",
		"--focus=" + r.focus, "--skip=" + r.skip, "--fail-on-empty",
		"--output-dir=" + logs, "--json-report=" + filepath.Base(report),
		filepath.Join(bin, "e2e.test"), "--",
		"--kubeconfig=" + cp.Kubeconfig,
		"--kubectl-path=" + filepath.Join(cp.BinDir, "kubectl"),
		"--provider=skeleton",
		"--repo-root=" + root,
		"--storage.testdriver=" + testDriver,
		// No node logs to gather over SSH, no cloud.
		"--disable-log-dump",
	}
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(bin, "ginkgo"), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "KUBE_TEST_REPO_LIST="+repoList)
	cmd.Stdout, cmd.Stderr = f, f
	start := time.Now()
	t.Logf("running e2e.test (%s): output in %s", r.name, out)
	runErr := cmd.Run()
	t.Logf("e2e.test (%s) took %s", r.name, time.Since(start).Round(time.Second))
	// The run must pass as many specs as test/specgate/expected.txt says ("k8s-e2e/<run>"), or
	// at least one for the "focus" run; the specs that skip themselves are listed as skipped
	// subtests.
	passed := 0
	if specs, err := specgate.ParseFile(report); err != nil {
		t.Errorf("no ginkgo report: %v", err)
	} else {
		specgate.Check(t, "k8s-e2e/"+r.name, specs)
		for _, s := range specs {
			if s.State == "passed" {
				passed++
			}
		}
	}
	if runErr != nil {
		t.Errorf("ginkgo: %v (output: %s, last lines:\n%s)", runErr, out, framework.Tail(out, 30))
	}
	return passed
}

// podWaiting says why a pod's containers are not ready: each one's waiting reason or last
// termination, for a failure message.
func podWaiting(p *corev1.Pod) string {
	var why string
	for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		switch {
		case c.State.Waiting != nil:
			why += fmt.Sprintf(", %s waiting: %s %s", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message)
		case c.LastTerminationState.Terminated != nil:
			why += fmt.Sprintf(", %s restarted %d times, last exit %d: %s", c.Name, c.RestartCount,
				c.LastTerminationState.Terminated.ExitCode, c.LastTerminationState.Terminated.Message)
		}
	}
	return why
}
