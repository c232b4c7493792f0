package storagepool_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	spac "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1/applyconfiguration/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/storagepool"
	"github.com/cistern-csi/cistern/test/framework"
)

const (
	benchNodes        = 1000
	benchPoolsPerNode = 4
	benchResync       = 5 * time.Second
)

// manyNodesDriver is a driver stub that reports the pools of many nodes, as a controller-mode
// driver would: the scale bench runs ONE real sidecar (leader-elected controller mode) against
// it, rather than 1,000 sidecar processes the 2-core test machine could not hold.
type manyNodesDriver struct {
	csi.UnimplementedIdentityServer
	spv1.UnimplementedStoragePoolControllerServer
	prefix string

	mu         sync.Mutex
	pools      []*spv1.StoragePool
	generation uint64
	changed    chan struct{}
}

func newManyNodesDriver(prefix string) *manyNodesDriver {
	d := &manyNodesDriver{prefix: prefix, generation: 1, changed: make(chan struct{})}
	for n := range benchNodes {
		node := fmt.Sprintf("%s-node-%04d", prefix, n)
		for p := range benchPoolsPerNode {
			d.pools = append(d.pools, &spv1.StoragePool{
				Name:               fmt.Sprintf("pool%d", p),
				Parameters:         map[string]string{consts.ParamPool: fmt.Sprintf("pool%d", p)},
				Labels:             map[string]string{"media": "nvme"},
				AccessibleTopology: []*spv1.Topology{{Segments: map[string]string{consts.TopologyKey: node}}},
				TotalBytes:         4 << 40,
				AvailableBytes:     3 << 40,
				MaximumVolumeBytes: 3 << 40,
				Healthy:            true,
			})
		}
	}
	return d
}

// shrink changes one pool's available capacity.
func (d *manyNodesDriver) shrink(i int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pools[i].AvailableBytes -= 1 << 30
	d.generation++
	close(d.changed)
	d.changed = make(chan struct{})
}

func (d *manyNodesDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: consts.DriverName, VendorVersion: "bench"}, nil
}

func (d *manyNodesDriver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (d *manyNodesDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

func (d *manyNodesDriver) ControllerListStoragePools(_ context.Context, req *spv1.ControllerListStoragePoolsRequest) (*spv1.ControllerListStoragePoolsResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := 0
	if req.GetStartingToken() != "" {
		fmt.Sscan(req.GetStartingToken(), &start) //nolint:errcheck // a bad token lists from 0
	}
	end := len(d.pools)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &spv1.ControllerListStoragePoolsResponse{Generation: d.generation, Pools: d.pools[start:end]}
	if end < len(d.pools) {
		resp.NextToken = fmt.Sprint(end)
	}
	return resp, nil
}

func (d *manyNodesDriver) WatchStoragePools(_ *spv1.WatchStoragePoolsRequest, stream grpc.ServerStreamingServer[spv1.WatchStoragePoolsResponse]) error {
	for {
		d.mu.Lock()
		gen, changed := d.generation, d.changed
		d.mu.Unlock()
		if err := stream.Send(&spv1.WatchStoragePoolsResponse{Generation: gen}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

func (d *manyNodesDriver) serve(b *testing.B) string {
	b.Helper()
	sock := filepath.Join(b.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, d)
	spv1.RegisterStoragePoolControllerServer(srv, d)
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	b.Cleanup(srv.Stop)
	return sock
}

// apiserverWrites counts the API server's own write requests on storagepools.
func apiserverWrites(b *testing.B, cp *framework.ControlPlane) float64 {
	b.Helper()
	raw, err := cp.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="storagepools"`) {
			continue
		}
		if regexp.MustCompile(`verb="(APPLY|PATCH|POST|PUT|DELETE|DELETECOLLECTION)"`).MatchString(line) {
			sum += sumMetric(line, "apiserver_request_total", "")
		}
	}
	return sum
}

// BenchmarkSidecarScale publishes 1,000 nodes x 4 pools through the real sidecar and a real API
// server, and compares the time with a peer: the same objects applied directly by a plain client
// (the least any publisher must send). It reports the API writes of a resync with nothing
// changed (goal 0) and of one pool's capacity change (goal 1).
func BenchmarkSidecarScale(b *testing.B) {
	cp := framework.Shared(b)
	installBench(b, cp)
	total := benchNodes * benchPoolsPerNode
	c, err := storagepool.NewClient(restConfigUnlimited(cp))
	if err != nil {
		b.Fatal(err)
	}

	// Peer: the same number of objects, spec then status, applied one by one.
	peerStart := time.Now()
	for i := range total {
		name := fmt.Sprintf("peer-%04d.pool%d", i/benchPoolsPerNode, i%benchPoolsPerNode)
		ac := spac.StoragePool(name).WithLabels(map[string]string{consts.LabelPool: "peer"}).
			WithSpec(spac.StoragePoolSpec().WithDriver("peer.bench").WithParameters(map[string]string{"pool": "x"}))
		if _, err := c.Apply(context.Background(), ac, metav1.ApplyOptions{FieldManager: "bench-peer", Force: true}); err != nil {
			b.Fatal(err)
		}
		q := resource.MustParse("3Ti")
		st := spac.StoragePool(name).WithStatus(spac.StoragePoolStatus().WithAccessibleNodes("peer").
			WithCapacity(spac.PoolCapacity().WithTotal(q).WithAvailable(q)))
		if _, err := c.ApplyStatus(context.Background(), st, metav1.ApplyOptions{FieldManager: "bench-peer", Force: true}); err != nil {
			b.Fatal(err)
		}
	}
	peer := time.Since(peerStart)
	if err := c.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: consts.LabelPool + "=peer"}); err != nil {
		b.Fatal(err)
	}

	d := newManyNodesDriver("bench")
	sock := d.serve(b)
	writes0 := apiserverWrites(b, cp)
	start := time.Now()
	kubeconfig := framework.ServiceAccountKubeconfig(b, cp, sidecarNamespace, sidecarServiceAccount)
	addr := freeAddrB(b)
	proc := framework.StartProcess(b, "storagepool-sidecar-bench", filepath.Join(binDir, "storagepool-sidecar"),
		"--csi-address="+sock, "--kubeconfig="+kubeconfig, "--http-endpoint="+addr,
		"--resync-period="+benchResync.String(), "--kube-api-qps=100000", "--kube-api-burst=100000",
		"--leader-election", "--leader-election-namespace="+sidecarNamespace, "-v=2")
	sc := &sidecar{proc: proc, metricsAddr: addr}
	b.Cleanup(func() {
		proc.Stop()
		_ = c.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "media=nvme"})
	})
	waitB(b, 15*time.Minute, "all pools published", func() bool {
		return sc.metric("storagepool_sidecar_api_writes_total", `operation="apply_status"`) >= float64(total) &&
			sc.metric("storagepool_sidecar_syncs_total", `result="success"`) >= 1
	})
	publish := time.Since(start)
	publishWrites := apiserverWrites(b, cp) - writes0

	// Two resyncs with nothing changed.
	syncs := sc.metric("storagepool_sidecar_syncs_total", `result="success"`)
	w0 := apiserverWrites(b, cp)
	waitB(b, time.Minute, "two resyncs", func() bool {
		return sc.metric("storagepool_sidecar_syncs_total", `result="success"`) >= syncs+2
	})
	idleWrites := (apiserverWrites(b, cp) - w0) / 2

	// One pool's capacity changes; wait for it, then one more resync.
	w1 := apiserverWrites(b, cp)
	d.shrink(1234)
	name := storagepool.ObjectName("pool2", "bench-node-0308", false)
	waitB(b, time.Minute, "the capacity change", func() bool {
		obj, err := c.Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && obj.Status.Capacity.Available.Value() == 3<<40-1<<30
	})
	syncs = sc.metric("storagepool_sidecar_syncs_total", `result="success"`)
	waitB(b, time.Minute, "one more resync", func() bool {
		return sc.metric("storagepool_sidecar_syncs_total", `result="success"`) >= syncs+1
	})
	changeWrites := apiserverWrites(b, cp) - w1

	ratio := publish.Seconds() / peer.Seconds()
	b.ReportMetric(publish.Seconds(), "publish-s")
	b.ReportMetric(peer.Seconds(), "peer-s")
	b.ReportMetric(ratio, "publish/peer")
	b.ReportMetric(idleWrites, "writes/idle-resync")
	b.ReportMetric(changeWrites, "writes/capacity-change")
	report := fmt.Sprintf(`Measured %s by `+"`make bench-sidecar`"+` (test/storagepool/bench_test.go) on a real
kube-apiserver + etcd (v1.37.2) on this machine: %d simulated nodes x %d pools = %d StoragePools.
Setup: a driver stub serving all nodes' pools over the real gRPC socket, and ONE real
storagepool-sidecar binary (controller mode, leader election on, ServiceAccount of deploy/csi,
client rate limits lifted) publishing them; 1,000 sidecar processes do not fit the 2-core machine.
API writes are counted by the API server itself (apiserver_request_total, storagepools, write verbs).

| measure | result | goal |
| --- | --- | --- |
| time to publish all %d pools (spec + status each) | %.1f s | |
| peer: the same %d objects applied directly by a plain client, no driver, no diffing | %.1f s | |
| ratio sidecar / peer | %.2f | close to 1 |
| API writes to publish all | %.0f | %d (2 per pool) |
| API writes per resync with nothing changed | %.0f | 0 |
| API writes after one pool's capacity changes (incl. one more resync) | %.0f | 1 |
`, time.Now().UTC().Format("2006-01-02"), benchNodes, benchPoolsPerNode, total, total, publish.Seconds(), total, peer.Seconds(),
		ratio, publishWrites, 2*total, idleWrites, changeWrites)
	b.Log("\n" + report)
	if idleWrites != 0 || changeWrites != 1 {
		b.Errorf("writes per idle resync = %v (want 0), after one capacity change = %v (want 1)", idleWrites, changeWrites)
	}
	if out := os.Getenv("CISTERN_BENCH_OUT"); out != "" {
		if err := writeBenchSection(out, report); err != nil {
			b.Error(err)
		}
	}
}

func installBench(b *testing.B, cp *framework.ControlPlane) {
	b.Helper()
	installOnce.Do(func() {
		framework.ApplyYAML(b, cp, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: "+sidecarNamespace+"\n")
		framework.ApplyManifests(b, cp, filepath.Join(repoRoot, "deploy/csi/crds/storagepool.storage.k8s.io_storagepools.yaml"),
			filepath.Join(repoRoot, "deploy/csi/storagepool-sidecar/rbac.yaml"))
	})
}

func restConfigUnlimited(cp *framework.ControlPlane) *rest.Config {
	cfg := *cp.Config
	cfg.QPS, cfg.Burst = 100000, 100000
	return &cfg
}

func freeAddrB(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitB(b *testing.B, timeout time.Duration, what string, cond func() bool) {
	b.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		b.Fatalf("waiting for %s: %v", what, err)
	}
}

const (
	benchStart = "<!-- bench-sidecar:start -->"
	benchEnd   = "<!-- bench-sidecar:end -->"
)

// writeBenchSection replaces this benchmark's section of docs/benchmarks.md (or appends it).
func writeBenchSection(path, report string) error {
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	section := benchStart + "\n## storagepool-sidecar at scale\n\n" + report + benchEnd
	text := string(data)
	if i, j := strings.Index(text, benchStart), strings.Index(text, benchEnd); i >= 0 && j > i {
		text = text[:i] + section + text[j+len(benchEnd):]
	} else {
		if text == "" {
			text = "# Benchmarks\n"
		}
		text = strings.TrimRight(text, "\n") + "\n\n" + section + "\n"
	}
	return os.WriteFile(path, []byte(text), 0o644)
}
