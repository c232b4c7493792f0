package e2e_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// The placement benchmark's shape (issue: "Measured, on the real control plane").
const (
	benchNodes       = 4
	benchPods        = 20
	benchObjects     = 64
	benchObjectBytes = 4 << 20 // 64 x 4 MiB = 256 MiB
	// A claim holds the dataset in an ext4 image, of which the driver fills at most 95%.
	benchClaimSize = "320Mi"
	// Pools force a choice: the warm node holds both cached datasets and about 7 of the 20
	// claims, so a placement that sends every pod there runs out of room and must spread; the
	// four nodes together hold them all.
	benchPoolSize = 3 << 30
	benchIdle     = time.Minute
)

// placementRun is one phase of the benchmark: pods created one after the other.
type placementRun struct {
	onWarm  int             // pods on the node that held the dataset when the phase began
	started []podStart      // every pod's start
	nodes   map[string]int  // pods per node
	warmAt  map[string]bool // nodes holding the dataset when the phase began
}

type podStart struct {
	node string
	warm bool // its node held the dataset Ready when the pod was created
	// Since the claim and pod were created: the pod bound to a node, its claim bound (the volume
	// provisioned on that node), the pod Running (the volume staged and published).
	scheduled, bound, running time.Duration
}

// BenchmarkPlacement measures where pods with dataset claims start and how fast, with the pod
// placement webhook and without it, on simulated nodes with the real scheduler, provisioner,
// driver and a kubelet stand-in that stages and publishes their volumes (make bench-placement;
// figures in docs/benchmarks.md). It ends with the one-line summary the issue asks for.
func BenchmarkPlacement(b *testing.B) {
	names := make([]string, benchNodes)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%c", 'a'+i)
	}
	warmNode := names[0]
	held := testutil.HoldGuestMemory(b)
	// The components' intervals are their defaults (the driver checks its pools every 10 s, the
	// provisioner polls capacity every minute), not the e2e suite's short ones: the writes at rest
	// are what a cluster pays.
	s := startPlacementCluster(b, "bench-with", names, benchPoolSize, cluster.NodeOptions{})
	baseline := &scenario{c: s.c, cp: s.cp, ns: newNamespace(b, s.cp, "bench-without",
		map[string]string{consts.LabelDataPlacement: consts.DataPlacementDisabled})}
	s3, _ := s3Server(b)
	// One dataset per phase, so that pods of the first phase that went to a cold node do not
	// warm it for the second.
	ids := map[string]string{}
	for _, sc := range []*scenario{s, baseline} {
		prefix := "bench/" + sc.ns
		if _, err := s3.RandomDataset(ctx(b), "datasets", prefix, benchObjects, benchObjectBytes); err != nil {
			b.Fatal(err)
		}
		ids[sc.ns] = datasetClass(b, s.cp, sc.ns, "cistern-"+sc.ns, "s3://datasets/"+prefix+"/", s3)
	}

	// The warm node: a pod pinned to it stages each dataset once, from S3.
	var stageOnce []time.Duration
	for _, sc := range []*scenario{s, baseline} {
		start := time.Now()
		sc.createClaimAndPod(b, "warm-up", "cistern-"+sc.ns, benchClaimSize, map[string]string{corev1.LabelHostname: warmNode})
		sc.waitStarted(b, "warm-up", start, 10*time.Minute)
		stageOnce = append(stageOnce, time.Since(start))
		sc.deleteAll(b)
		sc.waitWarm(b, ids[sc.ns], warmNode)
	}

	with := s.placementPhase(b, "cistern-"+s.ns, ids[s.ns], names)
	s.deleteAll(b)
	without := baseline.placementPhase(b, "cistern-"+baseline.ns, ids[baseline.ns], names)

	// A VolumeManager stages ahead on its nodes: replicas 3 against replicas 1 (staging once),
	// each on a dataset of the same size that no node holds yet; three of each, taking turns so
	// that both see the same load, and the medians compared.
	vmRatio := "NA"
	vmTimes := map[int][]time.Duration{}
	vmRuns := map[int][]vmRun{}
	var vmSampled vmSamples
	if vmStagesAhead(b, s) {
		vmSampled = s.volumeManagerRuns(b, s3, vmTimes, vmRuns)
		vmRatio = vmSampled.readyRatio()
	}

	// At rest: the baseline's pods running, the VolumeManagers Ready, nothing changing.
	settle, settling, idle := atRest(b, s.cp, benchIdle)
	idlePerNodeMinute := idle.total / float64(benchNodes) / benchIdle.Minutes()

	fmt.Printf(`
Placement benchmark, %s: %d simulated nodes (real kube-scheduler, external-provisioner and
driver per node, a kubelet stand-in that stages and publishes each pod's volume), one node (%s)
holding a %d MiB dataset (%d objects from versitygw), %d pods with a claim of it created one after
the other (each Running before the next).

| measure | placement webhook | webhook off (namespace opted out) |
| --- | --- | --- |
| pods on the warm node | %d of %d (share %.2f) | %d of %d (share %.2f) |
| pods per node | %v | %v |
| creation -> Running, pods on a warm node: p50 | %s | %s |
| creation -> Running, pods on a cold node: p50 | %s | %s |
| warm pods: creation -> scheduled / claim bound, p50 | %s / %s | %s / %s |

stage once (a pod pinned to the warm node, from S3): %v
VolumeManager time to Ready, replicas 1: %v; replicas 3: %v (ratio of the medians %s)
  replicas 1, from creation (medians): %s
  replicas 3, from creation (medians): %s
API writes while coming to rest (sync, then 75 s without writes; took %s): %.0f %v
API writes at rest over %s (all %d nodes; leases and the install's Deployment/DaemonSet status excluded): %.0f %v
`, time.Now().UTC().Format("2006-01-02"), benchNodes, warmNode, benchObjects*benchObjectBytes>>20, benchObjects, benchPods,
		with.onWarm, benchPods, share(with), without.onWarm, benchPods, share(without),
		with.nodes, without.nodes, seconds(median(with.started, true)), seconds(median(without.started, true)),
		seconds(median(with.started, false)), seconds(median(without.started, false)),
		seconds(medianOf(with.started, true, scheduled)), seconds(medianOf(with.started, true, bound)),
		seconds(medianOf(without.started, true, scheduled)), seconds(medianOf(without.started, true, bound)),
		stageOnce, vmTimes[1], vmTimes[3], vmRatio, vmBreakdown(vmRuns[1]), vmBreakdown(vmRuns[3]), settle.Round(time.Second), settling.total, settling.byResource,
		benchIdle, benchNodes, idle.total, idle.byResource)
	fmt.Print(vmSampled.table())
	fmt.Printf("  %s\nvm: peers=on %s\n", held, vmSampled.line())
	// Each phase's p50s apart: pooling them would let one phase's many fast starts hide the
	// other's.
	fmt.Printf("placement: warm_share=%.2f baseline_share=%.2f warm_p50_s=%s cold_p50_s=%s baseline_warm_p50_s=%s baseline_cold_p50_s=%s vm_ready_ratio=%s idle_writes_per_min=%s\n",
		share(with), share(without), seconds(median(with.started, true)), seconds(median(with.started, false)),
		seconds(median(without.started, true)), seconds(median(without.started, false)), vmRatio, strconv.FormatFloat(idlePerNodeMinute, 'f', -1, 64))
}

// placementPhase creates benchPods claims and pods one after the other, each Running before the
// next, and records where and how fast each started.
func (s *scenario) placementPhase(b *testing.B, class, id string, nodes []string) placementRun {
	b.Helper()
	run := placementRun{nodes: map[string]int{}, warmAt: s.warmNodes(b, id)}
	for i := range benchPods {
		name := fmt.Sprintf("pod-%02d", i)
		warm := s.warmNodes(b, id)
		start := time.Now()
		s.createClaimAndPod(b, name, class, benchClaimSize, nil)
		ps := s.waitStarted(b, name, start, 10*time.Minute)
		ps.warm = warm[ps.node]
		run.nodes[ps.node]++
		if run.warmAt[ps.node] {
			run.onWarm++
		}
		run.started = append(run.started, ps)
	}
	return run
}

// warmNodes are the nodes whose StoragePool says their cache holds the dataset Ready.
func (s *scenario) warmNodes(b *testing.B, id string) map[string]bool {
	b.Helper()
	list, err := s.dynamic(b).Resource(storagePoolGVR).List(ctx(b), metav1.ListOptions{LabelSelector: consts.LabelDatasetPrefix + id + "=true"})
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range list.Items {
		if n := p.GetLabels()[consts.LabelNode]; n != "" {
			out[n] = true
		}
	}
	return out
}

func (s *scenario) waitWarm(b *testing.B, id, node string) {
	b.Helper()
	eventually(b, 2*time.Minute, "dataset "+id+" Ready on "+node, func(context.Context) error {
		if !s.warmNodes(b, id)[node] {
			return errorf("no label on %s's StoragePool", node)
		}
		return nil
	})
}

// waitStarted polls the pod and its claim (same name) every 50 ms until the pod is Running: the
// times are what is measured.
func (s *scenario) waitStarted(b *testing.B, name string, start time.Time, timeout time.Duration) podStart {
	b.Helper()
	var ps podStart
	for {
		c := context.Background()
		p, err := s.cp.Client.CoreV1().Pods(s.ns).Get(c, name, metav1.GetOptions{})
		if err == nil && p.Spec.NodeName != "" && ps.scheduled == 0 {
			ps.node, ps.scheduled = p.Spec.NodeName, time.Since(start)
		}
		if ps.bound == 0 {
			if pvc, err := s.cp.Client.CoreV1().PersistentVolumeClaims(s.ns).Get(c, name, metav1.GetOptions{}); err == nil && pvc.Status.Phase == corev1.ClaimBound {
				ps.bound = time.Since(start)
			}
		}
		if err == nil && p.Status.Phase == corev1.PodRunning {
			ps.running = time.Since(start)
			return ps
		}
		if time.Since(start) > timeout {
			b.Fatalf("pod %s not Running after %s (%v)", name, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func scheduled(p podStart) time.Duration { return p.scheduled }
func bound(p podStart) time.Duration     { return p.bound }

func share(r placementRun) float64 { return float64(r.onWarm) / float64(len(r.started)) }

// median of the times to Running of pods on warm (or cold) nodes; -1 when there are none.
func median(starts []podStart, warm bool) time.Duration {
	return medianOf(starts, warm, func(p podStart) time.Duration { return p.running })
}

func medianOf(starts []podStart, warm bool, f func(podStart) time.Duration) time.Duration {
	var d []time.Duration
	for _, s := range starts {
		if s.warm == warm {
			d = append(d, f(s))
		}
	}
	return medianDuration(d)
}

// medianDuration is the median of d; -1 when d is empty.
func medianDuration(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return -1
	}
	d = slices.Clone(d)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	if len(d)%2 == 1 {
		return d[len(d)/2]
	}
	return (d[len(d)/2-1] + d[len(d)/2]) / 2
}

func seconds(d time.Duration) string {
	if d < 0 {
		return "NA"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64)
}

type writeCount struct {
	total      float64
	byResource map[string]float64
}

var (
	writeVerb   = regexp.MustCompile(`verb="(APPLY|PATCH|POST|PUT|DELETE|DELETECOLLECTION)"`)
	successCode = regexp.MustCompile(`code="2\d\d"`)
	resourceRe  = regexp.MustCompile(`resource="([^"]*)"`)
)

// atRest waits for the cluster to come to rest, then counts, with the API server's
// apiserver_request_total, the successful writes made during d, by resource, except the harness's.
// Rest: every dirty page written back (sync(2): the copies just made into the volumes move each
// pool's free space for a while), then a quiet window longer than the slowest poll that publishes
// a change (the provisioner's capacity poll, a minute), so that what changed before is published
// before the count starts.
func atRest(b *testing.B, cp *framework.ControlPlane, d time.Duration) (settle time.Duration, settling, idle writeCount) {
	b.Helper()
	const quiet = 75 * time.Second
	start := time.Now()
	unix.Sync()
	first := apiWrites(b, cp)
	for last := first; ; {
		time.Sleep(quiet)
		now := apiWrites(b, cp)
		if diff(last, now).total == 0 || time.Since(start) > 6*time.Minute {
			settle, settling = time.Since(start), diff(first, now)
			break
		}
		last = now
	}
	before, capBefore := apiWrites(b, cp), capacities(b, cp)
	time.Sleep(d)
	idle = diff(before, apiWrites(b, cp))
	if idle.total > 0 {
		// Say what moved: the capacity each CSIStorageCapacity object published.
		capAfter := capacities(b, cp)
		for k, v := range capAfter {
			if capBefore[k] != v {
				fmt.Printf("at rest: CSIStorageCapacity %s: %d -> %d bytes (%+d)\n", k, capBefore[k], v, v-capBefore[k])
			}
		}
	}
	return settle, settling, idle
}

// capacities maps each CSIStorageCapacity (class/node) to its capacity in bytes.
func capacities(b *testing.B, cp *framework.ControlPlane) map[string]int64 {
	b.Helper()
	list, err := cp.Client.StorageV1().CSIStorageCapacities(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]int64{}
	for _, c := range list.Items {
		if c.Capacity != nil && c.NodeTopology != nil {
			out[c.StorageClassName+"/"+c.NodeTopology.MatchLabels[consts.TopologyKey]] = c.Capacity.Value()
		}
	}
	return out
}

// harness are the resources whose writes are not Cistern's: leases (the heartbeats of kubelet's
// stand-in and of leader election) and the status of the install's Deployment and DaemonSet, which
// no kubelet runs here (kube-controller-manager marks the Deployment's progress deadline exceeded
// after ten minutes).
var harness = map[string]bool{"leases": true, "deployments": true, "replicasets": true, "daemonsets": true}

func diff(before, after map[string]float64) writeCount {
	out := writeCount{byResource: map[string]float64{}}
	for r, n := range after {
		if d := n - before[r]; d > 0 && !harness[r] {
			out.byResource[r] = d
			out.total += d
		}
	}
	return out
}

func apiWrites(b *testing.B, cp *framework.ControlPlane) map[string]float64 {
	b.Helper()
	raw, err := cp.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !writeVerb.MatchString(line) || !successCode.MatchString(line) {
			continue
		}
		m := resourceRe.FindStringSubmatch(line)
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if m == nil || err != nil {
			continue
		}
		out[m[1]] += v
	}
	return out
}

// volumeManagerRuns stages three VolumeManagers of replicas 3 and three of replicas 1 (staging
// once), each on a dataset of the same size that no node holds yet, taking turns so that both
// see the same load. After each turn, rclone copies the turn's replicas-3 dataset from the same
// server, once alone and three times at once: what this machine gives three concurrent copies by
// a tool not ours, measured next to each sample.
func (s *scenario) volumeManagerRuns(b *testing.B, s3 *cluster.S3, times map[int][]time.Duration, runs map[int][]vmRun) vmSamples {
	rclone := testpeers.Binary(b, "CISTERN_RCLONE")
	var out vmSamples
	for i := range 3 {
		for _, replicas := range []int{1, 3} {
			r := s.volumeManagerReady(b, s3, fmt.Sprintf("vm-%d-%d", replicas, i), replicas)
			times[replicas], runs[replicas] = append(times[replicas], r.running), append(runs[replicas], r)
		}
		out.ready = append(out.ready, times[3][i].Seconds()/times[1][i].Seconds())
		out.copies = append(out.copies, peerCopies(b, rclone, s3, "datasets", "bench/"+s.ns+fmt.Sprintf("-vm-3-%d", i)))
		out.disk = append(out.disk, diskWrites(b))
	}
	return out
}

// BenchmarkVolumeManagerReplicas is the VolumeManager part of BenchmarkPlacement alone, on the
// same cluster shape (make bench-vm-replicas): replicas 3 against replicas 1, with the breakdown.
// CISTERN_BENCH_VM_PEERS=off starts the drivers without a peer port (no peer fan-out).
func BenchmarkVolumeManagerReplicas(b *testing.B) {
	names := make([]string, benchNodes)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%c", 'a'+i)
	}
	peers := os.Getenv("CISTERN_BENCH_VM_PEERS")
	if peers != "off" {
		peers = "on"
	}
	held := testutil.HoldGuestMemory(b)
	s := startPlacementCluster(b, "bench-vm", names, benchPoolSize, cluster.NodeOptions{NoPeers: peers == "off"})
	s3, _ := s3Server(b)
	datasetClass(b, s.cp, s.ns, "cistern-"+s.ns, "s3://datasets/bench/", s3) // the Secret s3 the VolumeManagers name
	if !vmStagesAhead(b, s) {
		b.Fatal("the VolumeManager API installed does not stage ahead")
	}
	times, runs := map[int][]time.Duration{}, map[int][]vmRun{}
	samples := s.volumeManagerRuns(b, s3, times, runs)
	fmt.Printf("VolumeManager time to Running, replicas 1: %v; replicas 3: %v\n  replicas 1: %s\n  replicas 3: %s\nreplicas 1:\n%sreplicas 3:\n%s",
		times[1], times[3], vmBreakdown(runs[1]), vmBreakdown(runs[3]), vmBytes(runs[1]), vmBytes(runs[3]))
	fmt.Print(samples.table())
	fmt.Printf("  %s\nvm: peers=%s %s\n", held, peers, samples.line())
}

// vmStagesAhead says whether the installed VolumeManager API reports per-node staging
// (status.volumes[].nodes[] objects, state Ready): the controller that stages ahead.
func vmStagesAhead(b *testing.B, s *scenario) bool {
	b.Helper()
	crd, err := s.dynamic(b).Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}).
		Get(ctx(b), "volumemanagers.data.cistern.dev", metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		typ, _, _ := unstructured.NestedString(v.(map[string]any), "schema", "openAPIV3Schema", "properties", "status", "properties",
			"volumes", "items", "properties", "nodes", "items", "type")
		if typ == "object" {
			return true
		}
	}
	return false
}

// vmRun is one VolumeManager's way to Running, each step the time since its creation at which
// the last of its nodes (stager pods) got there, seen by a 100 ms poll: the stager pods created,
// bound to their nodes by the scheduler, Succeeded (the kubelet stand-in staged and published
// their claim), the nodes Ready in status.volumes[].nodes (the StoragePool inventory said so),
// then status.state Running.
type vmRun struct {
	created, scheduled, firstStaged, staged, nodesReady, running time.Duration
	load                                                         string // /proc/loadavg's 1-minute figure at the start
	// What each node's staging read, by origin (the driver's cistern_dataset_fetched_bytes_total,
	// the difference over the run: each run's dataset is new).
	fetched map[string]fetched
	// cpu is what the run's processes and the machine used until Running.
	cpu cpuReading
}

// volumeManagerReady creates a VolumeManager of a fresh 256 MiB dataset with replicas nodes and
// returns its way to status.state Running (the data staged on every chosen node).
func (s *scenario) volumeManagerReady(b *testing.B, s3 *cluster.S3, name string, replicas int) vmRun {
	b.Helper()
	prefix := "bench/" + s.ns + "-" + name
	if _, err := s3.RandomDataset(ctx(b), "datasets", prefix, benchObjects, benchObjectBytes); err != nil {
		b.Fatal(err)
	}
	run := vmRun{load: loadAverage()}
	before, cpuBefore := s.fetchedByNode(b), s.readCPU(s3)
	start := time.Now()
	framework.ApplyYAML(b, s.cp, fmt.Sprintf(`
apiVersion: data.cistern.dev/v1alpha1
kind: VolumeManager
metadata: {name: %s, namespace: %s}
spec:
  volumes:
  - id: data
    replicas: %d
    sourceType: S3
    sourceURL: s3://datasets/%s/
    capacity: %s
    accessMode: ReadOnlyMany
    options: {endpoint: %q, pathStyle: "true", secretName: s3}
`, name, s.ns, replicas, prefix, benchClaimSize, s3.Endpoint))
	created, scheduled, staged, ready := map[string]time.Duration{}, map[string]time.Duration{}, map[string]time.Duration{}, map[string]time.Duration{}
	first := func(m map[string]time.Duration, key string) {
		if _, ok := m[key]; !ok {
			m[key] = time.Since(start)
		}
	}
	stagers := metav1.ListOptions{LabelSelector: "data.cistern.dev/volumemanager=" + name + ",data.cistern.dev/stager=true"}
	var state string
	deadline := time.Now().Add(10 * time.Minute)
	for {
		if pods, err := s.cp.Client.CoreV1().Pods(s.ns).List(context.Background(), stagers); err == nil {
			for _, p := range pods.Items {
				first(created, p.Name)
				if p.Spec.NodeName != "" {
					first(scheduled, p.Name)
				}
				if p.Status.Phase == corev1.PodSucceeded {
					first(staged, p.Name)
				}
			}
		}
		obj, err := s.dynamic(b).Resource(volumeManagerGVR).Namespace(s.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			vols, _, _ := unstructured.NestedSlice(obj.Object, "status", "volumes")
			for _, v := range vols {
				nodes, _, _ := unstructured.NestedSlice(v.(map[string]any), "nodes")
				for _, n := range nodes {
					if n := n.(map[string]any); n["state"] == "Ready" {
						first(ready, fmt.Sprint(n["name"]))
					}
				}
			}
			if state, _, _ = unstructured.NestedString(obj.Object, "status", "state"); state == "Running" {
				run.running = time.Since(start)
				run.created, run.scheduled, run.staged, run.nodesReady = latest(created), latest(scheduled), latest(staged), latest(ready)
				run.firstStaged = earliest(staged)
				run.cpu = cpuSince(cpuBefore, s.readCPU(s3))
				run.fetched = fetchedSince(before, s.fetchedByNode(b))
				return run
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("VolumeManager %s not Running after 10 minutes: state %q (%v)", name, state, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func latest(m map[string]time.Duration) time.Duration {
	var d time.Duration
	for _, v := range m {
		d = max(d, v)
	}
	return d
}

func earliest(m map[string]time.Duration) time.Duration {
	d := time.Duration(-1)
	for _, v := range m {
		if d < 0 || v < d {
			d = v
		}
	}
	return max(d, 0)
}

// loadAverage is the host's 1-minute load average: the machine is shared, so each figure says
// what else ran.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// vmBreakdown is one line per step: the median over runs of the time since creation.
func vmBreakdown(runs []vmRun) string {
	step := func(f func(vmRun) time.Duration) string {
		d := make([]time.Duration, len(runs))
		for i, r := range runs {
			d[i] = f(r)
		}
		return seconds(medianDuration(d))
	}
	var loads []string
	for _, r := range runs {
		loads = append(loads, r.load)
	}
	return fmt.Sprintf("stagers created %s, scheduled %s, first staged %s, all staged %s, nodes Ready in status %s, Running %s (load %s)",
		step(func(r vmRun) time.Duration { return r.created }), step(func(r vmRun) time.Duration { return r.scheduled }),
		step(func(r vmRun) time.Duration { return r.firstStaged }), step(func(r vmRun) time.Duration { return r.staged }),
		step(func(r vmRun) time.Duration { return r.nodesReady }), step(func(r vmRun) time.Duration { return r.running }),
		strings.Join(loads, " "))
}
