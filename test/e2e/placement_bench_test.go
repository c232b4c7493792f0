package e2e_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
)

// The placement benchmark's shape (issue: "Measured, on the real control plane").
const (
	benchNodes       = 4
	benchPods        = 20
	benchObjects     = 64
	benchObjectBytes = 4 << 20 // 64 x 4 MiB = 256 MiB
	// A claim holds the dataset in an ext4 image, of which the driver fills at most 95%.
	benchClaimSize = "320Mi"
	// Pools hold all 20 claims and both cached datasets on the warm node: "while it has room".
	benchPoolSize = 10 << 30
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
	node    string
	warm    bool // its node held the dataset Ready when the pod was created
	running time.Duration
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
	s := startPlacementCluster(b, "bench-with", names, benchPoolSize)
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
		sc.waitRunningFast(b, "warm-up", 10*time.Minute)
		stageOnce = append(stageOnce, time.Since(start))
		sc.deleteAll(b)
		sc.waitWarm(b, ids[sc.ns], warmNode)
	}

	with := s.placementPhase(b, "cistern-"+s.ns, ids[s.ns], names)
	s.deleteAll(b)
	without := baseline.placementPhase(b, "cistern-"+baseline.ns, ids[baseline.ns], names)

	// At rest: the baseline's pods running, nothing changing.
	idle := idleWrites(b, s.cp, benchIdle)
	idlePerNodeMinute := idle.total / float64(benchNodes) / benchIdle.Minutes()

	all := append(slices.Clone(with.started), without.started...)
	warmP50, coldP50 := median(all, true), median(all, false)
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

stage once (a pod pinned to the warm node, from S3): %v
API writes at rest over %s (all %d nodes, leases excluded): %.0f %v
`, time.Now().UTC().Format("2006-01-02"), benchNodes, warmNode, benchObjects*benchObjectBytes>>20, benchObjects, benchPods,
		with.onWarm, benchPods, share(with), without.onWarm, benchPods, share(without),
		with.nodes, without.nodes, seconds(median(with.started, true)), seconds(median(without.started, true)),
		seconds(median(with.started, false)), seconds(median(without.started, false)),
		stageOnce, benchIdle, benchNodes, idle.total, idle.byResource)
	fmt.Printf("placement: warm_share=%.2f baseline_share=%.2f warm_p50_s=%s cold_p50_s=%s vm_ready_ratio=%s idle_writes_per_min=%s\n",
		share(with), share(without), seconds(warmP50), seconds(coldP50), "NA", strconv.FormatFloat(idlePerNodeMinute, 'f', -1, 64))
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
		pod := s.waitRunningFast(b, name, 10*time.Minute)
		took := time.Since(start)
		node := pod.Spec.NodeName
		run.nodes[node]++
		if run.warmAt[node] {
			run.onWarm++
		}
		run.started = append(run.started, podStart{node: node, warm: warm[node], running: took})
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

// waitRunningFast is waitRunning polling every 50 ms: the time to Running is what is measured.
func (s *scenario) waitRunningFast(b *testing.B, name string, timeout time.Duration) *corev1.Pod {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		p, err := s.cp.Client.CoreV1().Pods(s.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			return p
		}
		if time.Now().After(deadline) {
			b.Fatalf("pod %s not Running after %s (%v)", name, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func share(r placementRun) float64 { return float64(r.onWarm) / float64(len(r.started)) }

// median of the start times of pods on warm (or cold) nodes; -1 when there are none.
func median(starts []podStart, warm bool) time.Duration {
	var d []time.Duration
	for _, s := range starts {
		if s.warm == warm {
			d = append(d, s.running)
		}
	}
	if len(d) == 0 {
		return -1
	}
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

// idleWrites counts, with the API server's apiserver_request_total, the successful writes made
// during d, by resource. Leases are left out: they are the heartbeats of kubelet (here its
// stand-in) and of leader election, not Cistern's.
func idleWrites(b *testing.B, cp *framework.ControlPlane, d time.Duration) writeCount {
	b.Helper()
	before := apiWrites(b, cp)
	time.Sleep(d)
	after := apiWrites(b, cp)
	out := writeCount{byResource: map[string]float64{}}
	for r, n := range after {
		if diff := n - before[r]; diff > 0 && r != "leases" {
			out.byResource[r] = diff
			out.total += diff
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
