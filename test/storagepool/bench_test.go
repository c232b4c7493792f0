package storagepool_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	spac "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1/applyconfiguration/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/poolpublisher"
	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
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
				Cache:              benchCache(n, p),
			})
		}
	}
	return d
}

// benchCachedDatasets is how many datasets each bench pool's cache lists: a realistic object
// size, six Ready (six labels), one Staging, one Failed.
const benchCachedDatasets = 8

// benchCache is the dataset cache a bench pool reports: the same at every list, as a node at rest.
func benchCache(node, pool int) *spv1.DatasetCache {
	c := &spv1.DatasetCache{Total: benchCachedDatasets, Ready: benchCachedDatasets - 2, Staging: 1, Failed: 1}
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for i := range benchCachedDatasets {
		d := &spv1.CachedDataset{
			Id: fmt.Sprintf("%012x%06x%06x", i, node, pool), Source: fmt.Sprintf("s3://models/team-%d/model-%d", pool, i),
			Scheme: "s3", State: spv1.DatasetState_DATASET_STATE_READY, BytesDone: 20 << 30, BytesTotal: 20 << 30,
			LastUsed: timestamppb.New(t0.Add(-time.Duration(i) * time.Hour)), References: int32(i % 3),
		}
		switch i {
		case 0:
			d.State, d.BytesDone = spv1.DatasetState_DATASET_STATE_STAGING, 5<<30
		case benchCachedDatasets - 1:
			d.State, d.BytesDone, d.Reason, d.Source, d.Tenant = spv1.DatasetState_DATASET_STATE_FAILED, 0, "Denied", "", true
		}
		c.Bytes += d.BytesDone
		c.Datasets = append(c.Datasets, d)
	}
	return c
}

// benchPeerCache is what benchCache publishes, for the peer to write the same objects.
func benchPeerCache(node, pool int) (*spac.DatasetCacheApplyConfiguration, map[string]string) {
	c := benchCache(node, pool)
	labels := map[string]string{}
	ac := spac.DatasetCache().WithBytes(*resource.NewQuantity(c.Bytes, resource.BinarySI)).WithTotal(c.Total).
		WithReady(c.Ready).WithStaging(c.Staging).WithFailed(c.Failed)
	for _, d := range c.Datasets {
		state := map[spv1.DatasetState]spapi.DatasetState{spv1.DatasetState_DATASET_STATE_READY: spapi.DatasetReady,
			spv1.DatasetState_DATASET_STATE_STAGING: spapi.DatasetStaging, spv1.DatasetState_DATASET_STATE_FAILED: spapi.DatasetFailed}[d.State]
		e := spac.CachedDataset().WithID(d.Id).WithScheme(d.Scheme).WithState(state).WithBytesDone(d.BytesDone).
			WithBytesTotal(d.BytesTotal).WithLastUsed(metav1.NewTime(d.LastUsed.AsTime())).WithReferences(d.References)
		if d.Source != "" {
			e.WithSource(d.Source)
		}
		if d.Reason != "" {
			e.WithReason(d.Reason).WithTenant(true)
		}
		if state == spapi.DatasetReady {
			labels[consts.LabelDatasetPrefix+d.Id] = "true"
		}
		ac.WithDatasets(e)
	}
	return ac, labels
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

var (
	writeVerb   = regexp.MustCompile(`verb="(APPLY|PATCH|POST|PUT|DELETE|DELETECOLLECTION)"`)
	successCode = regexp.MustCompile(`code="2\d\d"`)
)

// apiserverWrites counts the API server's own successful write requests on storagepools.
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
		if writeVerb.MatchString(line) && successCode.MatchString(line) {
			v, _ := sumMetric(line, "apiserver_request_total", "")
			sum += v
		}
	}
	return sum
}

// scaleResult is what one way of running the sidecar achieved.
type scaleResult struct {
	publish       time.Duration
	publishWrites float64
	idleWrites    float64
	changeWrites  float64
}

// BenchmarkSidecarScale publishes 1,000 nodes x 4 pools on a real API server in the two ways the
// sidecar runs: one binary next to a controller-mode driver stub reporting every node's pools,
// and 1,000 per-node sidecars (the DaemonSet way; in one process, each with its own field
// manager, informers and driver stream). Both are compared with a peer: the same objects applied
// directly by a plain client, the least any publisher must send. It reports the API writes of a
// resync with nothing changed (goal 0) and of one pool's capacity change (goal 1).
func BenchmarkSidecarScale(b *testing.B) {
	cp := framework.Shared(b)
	install(b, cp)
	total := benchNodes * benchPoolsPerNode
	c, err := poolpublisher.NewClient(restConfigUnlimited(cp))
	if err != nil {
		b.Fatal(err)
	}
	peer := benchPeer(b, c, total)
	controller := benchControllerMode(b, cp, c, total)
	if err := c.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "media=nvme"}); err != nil {
		b.Fatal(err)
	}
	b.Logf("controller mode: %+v", controller)
	perNode := benchPerNode(b, cp, c, total)
	b.Logf("per node: %+v", perNode)

	b.ReportMetric(peer.Seconds(), "peer-s")
	b.ReportMetric(controller.publish.Seconds(), "controller-publish-s")
	b.ReportMetric(perNode.publish.Seconds(), "pernode-publish-s")
	b.ReportMetric(controller.idleWrites+perNode.idleWrites, "writes/idle-resync")
	b.ReportMetric(controller.changeWrites, "writes/capacity-change")
	report := fmt.Sprintf(`Measured %s by `+"`make bench-sidecar`"+` (test/storagepool/bench_test.go) on a real
kube-apiserver + etcd (v1.37.2) on this machine: %d simulated nodes x %d pools = %d StoragePools,
each with a dataset cache of eight datasets in its status (six Ready, so six dataset labels, one
Staging, one Failed), published two ways:

- **controller mode**: a driver stub serving every node's pools over the real gRPC socket, and ONE
  real storagepool-sidecar binary (leader election on, ServiceAccount of deploy/csi, client rate
  limits lifted);
- **per node** (the DaemonSet way): 1,000 sidecars, each with its own field manager, its own
  label-selected informers (2,000 watches) and its own stream of its node's pools, run as
  reconcilers in one test process (1,000 processes do not fit the 2-core machine), sharing one
  client without rate limits.

The peer applies the same %d objects (spec, then status) directly with a plain client: no
driver, no informer, no diffing. API writes are counted by the API server itself
(apiserver_request_total on storagepools, write verbs).

| measure | controller mode | per node | goal |
| --- | --- | --- | --- |
| time to publish all %d pools | %.1f s | %.1f s | |
| peer: the same objects applied directly | %.1f s | %.1f s | |
| ratio sidecar / peer | %.2f | %.2f | close to 1 |
| API writes to publish all | %.0f | %.0f | %d (2 per pool) |
| API writes per resync with nothing changed | %.0f | %.0f | 0 |
| API writes after one pool's capacity changes (incl. one more resync) | %.0f | %.0f | 1 |

The per-node publish time is what 1,000 sidecars starting at the same instant do to a 2-core API
server that also serves their 2,000 watches: requests queue in API Priority and Fairness and
some time out ("http: Handler timeout"), so a few writes are retried (writes above 8,000). It is a
thundering-herd figure on a small machine, not a per-sidecar cost; the write counts, which are
the goals, hold in both modes.
`, time.Now().UTC().Format("2006-01-02"), benchNodes, benchPoolsPerNode, total, total, total,
		controller.publish.Seconds(), perNode.publish.Seconds(), peer.Seconds(), peer.Seconds(),
		controller.publish.Seconds()/peer.Seconds(), perNode.publish.Seconds()/peer.Seconds(),
		controller.publishWrites, perNode.publishWrites, 2*total,
		controller.idleWrites, perNode.idleWrites, controller.changeWrites, perNode.changeWrites)
	b.Log("\n" + report)
	for mode, r := range map[string]scaleResult{"controller mode": controller, "per node": perNode} {
		if r.idleWrites != 0 || r.changeWrites != 1 {
			b.Errorf("%s: writes per idle resync = %v (want 0), after one capacity change = %v (want 1)", mode, r.idleWrites, r.changeWrites)
		}
	}
}

// benchPeer applies total objects, spec then status, one by one, and deletes them.
func benchPeer(b *testing.B, c *poolpublisher.Client, total int) time.Duration {
	b.Helper()
	start := time.Now()
	for i := range total {
		name := fmt.Sprintf("peer-%04d.pool%d", i/benchPoolsPerNode, i%benchPoolsPerNode)
		cacheAC, cacheLabels := benchPeerCache(i/benchPoolsPerNode, i%benchPoolsPerNode)
		ac := spac.StoragePool(name).WithLabels(map[string]string{consts.LabelPool: "peer"}).WithLabels(cacheLabels).
			WithSpec(spac.StoragePoolSpec().WithDriver("peer.bench").WithParameters(map[string]string{"pool": "x"}))
		if _, err := c.Apply(context.Background(), ac, metav1.ApplyOptions{FieldManager: "bench-peer", Force: true}); err != nil {
			b.Fatal(err)
		}
		q := resource.MustParse("3Ti")
		st := spac.StoragePool(name).WithStatus(spac.StoragePoolStatus().WithAccessibleNodes("peer").
			WithCapacity(spac.PoolCapacity().WithTotal(q).WithAvailable(q)).WithCache(cacheAC))
		if _, err := c.ApplyStatus(context.Background(), st, metav1.ApplyOptions{FieldManager: "bench-peer", Force: true}); err != nil {
			b.Fatal(err)
		}
	}
	peer := time.Since(start)
	if err := c.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: consts.LabelPool + "=peer"}); err != nil {
		b.Fatal(err)
	}
	return peer
}

// benchControllerMode runs the real sidecar binary against a stub driver reporting all nodes.
func benchControllerMode(b *testing.B, cp *framework.ControlPlane, c *poolpublisher.Client, total int) scaleResult {
	b.Helper()
	d := newManyNodesDriver("bench")
	sock := d.serve(b)
	writes0 := apiserverWrites(b, cp)
	start := time.Now()
	kubeconfig := framework.ServiceAccountKubeconfig(b, cp, sidecarNamespace, sidecarServiceAccount)
	addr := framework.FreeAddr(b)
	proc := framework.StartProcess(b, "storagepool-sidecar-bench", filepath.Join(binDir, "storagepool-sidecar"),
		"--csi-address="+sock, "--kubeconfig="+kubeconfig, "--http-endpoint="+addr,
		"--resync-period="+benchResync.String(), "--kube-api-qps=100000", "--kube-api-burst=100000",
		"--leader-election", "--leader-election-namespace="+sidecarNamespace, "-v=2")
	defer proc.Stop()
	sc := &sidecar{t: b, proc: proc, metricsAddr: addr}
	successes := func() float64 { return sc.metric("storagepool_sidecar_syncs_total", `result="success"`) }
	waitB(b, 15*time.Minute, "all pools published", func() bool {
		return sc.metric("storagepool_sidecar_api_writes_total", `operation="apply_status"`) >= float64(total) && successes() >= 1
	})
	var r scaleResult
	r.publish = time.Since(start)
	r.publishWrites = apiserverWrites(b, cp) - writes0
	r.idleWrites, r.changeWrites = steadyWrites(b, cp, c, d, successes, 1, time.Minute)
	return r
}

// gatherSum sums the samples of a metric family whose label values include value.
func gatherSum(b *testing.B, reg k8smetrics.KubeRegistry, name, value string) float64 {
	b.Helper()
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// nodeSource is one node's view of a manyNodesDriver, as that node's driver would report it.
type nodeSource struct {
	d    *manyNodesDriver
	node int
}

func (s nodeSource) List(context.Context) ([]*spv1.StoragePool, uint64, error) {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	i := s.node * benchPoolsPerNode
	return s.d.pools[i : i+benchPoolsPerNode], s.d.generation, nil
}

func (s nodeSource) Watch(ctx context.Context, onChange func(uint64)) error {
	for {
		s.d.mu.Lock()
		gen, changed := s.d.generation, s.d.changed
		s.d.mu.Unlock()
		onChange(gen)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// benchPerNode runs one reconciler per node, each as the per-node sidecar sets itself up.
func benchPerNode(b *testing.B, cp *framework.ControlPlane, c *poolpublisher.Client, total int) scaleResult {
	b.Helper()
	d := newManyNodesDriver("pernode")
	// The reconcilers' own logs would drown the benchmark's output; their metrics count instead.
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	reg := k8smetrics.NewKubeRegistry()
	m := poolpublisher.NewMetrics(reg) // shared: counts the syncs of all reconcilers
	successes := func() float64 { return gatherSum(b, reg, "storagepool_sidecar_syncs_total", "success") }
	writes0 := apiserverWrites(b, cp)
	start := time.Now()
	for n := range benchNodes {
		node := fmt.Sprintf("pernode-node-%04d", n)
		informers := []cache.SharedIndexInformer{
			poolpublisher.NewInformer(c, labels.SelectorFromSet(labels.Set{consts.LabelNode: poolpublisher.LabelValue(node)})),
			poolpublisher.NewInformer(c, labels.SelectorFromSet(labels.Set{consts.LabelShared: "true"})),
		}
		objects, err := poolpublisher.NewObjectCache(informers...)
		if err != nil {
			b.Fatal(err)
		}
		r, err := poolpublisher.NewReconciler(poolpublisher.Config{DriverName: consts.DriverName, NodeName: node, ResyncPeriod: benchResync},
			nodeSource{d: d, node: n}, c, objects, m)
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, inf := range informers {
				go inf.RunWithContext(ctx)
			}
			if cache.WaitForCacheSync(ctx.Done(), objects.HasSynced) {
				r.Run(ctx)
			}
		}()
	}
	var r scaleResult
	waitB(b, 15*time.Minute, "all pools published", func() bool {
		time.Sleep(2 * time.Second) // listing 4,000 objects is itself load: poll slowly
		if apiserverWrites(b, cp)-writes0 < float64(2*total) {
			return false
		}
		list, err := c.List(context.Background(), metav1.ListOptions{LabelSelector: "media=nvme"})
		if err != nil {
			return false
		}
		published := 0
		for _, o := range list.Items {
			if len(o.Status.Conditions) > 0 {
				published++
			}
		}
		return published == total
	})
	r.publish = time.Since(start)
	r.publishWrites = apiserverWrites(b, cp) - writes0
	r.idleWrites, r.changeWrites = steadyWrites(b, cp, c, d, successes, benchNodes, 2*time.Minute)
	return r
}

// steadyWrites measures the API server writes once every pool is published: idle, per resync
// with nothing changed (the mean of two), and change, for one capacity change (d shrinks; pool2
// of node 0308 shows it) up to the resync after it. successes counts the publishers' successful
// syncs, perResync of which make one resync; idleTimeout bounds the wait for the two.
func steadyWrites(b *testing.B, cp *framework.ControlPlane, c *poolpublisher.Client, d *manyNodesDriver,
	successes func() float64, perResync float64, idleTimeout time.Duration) (idle, change float64) {
	b.Helper()
	syncs, w0 := successes(), apiserverWrites(b, cp)
	waitB(b, idleTimeout, "two resyncs", func() bool { return successes() >= syncs+2*perResync })
	idle = (apiserverWrites(b, cp) - w0) / 2

	w1 := apiserverWrites(b, cp)
	d.shrink(1234)
	name := poolpublisher.ObjectName("pool2", d.prefix+"-node-0308", false)
	waitB(b, time.Minute, "the capacity change", func() bool {
		obj, err := c.Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && obj.Status.Capacity.Available.Value() == 3<<40-1<<30
	})
	syncs = successes()
	waitB(b, time.Minute, "one more resync", func() bool { return successes() >= syncs+perResync })
	return idle, apiserverWrites(b, cp) - w1
}

func restConfigUnlimited(cp *framework.ControlPlane) *rest.Config {
	cfg := *cp.Config
	cfg.QPS, cfg.Burst = 100000, 100000
	return &cfg
}

func waitB(b *testing.B, timeout time.Duration, what string, cond func() bool) {
	b.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		b.Fatalf("waiting for %s: %v", what, err)
	}
}
