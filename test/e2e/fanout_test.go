package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/poolpublisher"
	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// datasetFanOut: node-b stages a dataset from S3; node-a, asked for the same dataset (in another
// pool: the dataset is the same), finds node-b in the StoragePool inventory and reads it from
// node-b's peer port: one pinned read goes to S3 (node-a's own proof of access), the bytes come
// from the peer and match the source.
func (s *scenario) datasetFanOut(t *testing.T) {
	s3, sums := s3Server(t)
	var gets atomic.Int64
	proxy := testpeers.StartProxy(t, s3.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodGet && !r.URL.Query().Has("list-type") {
			gets.Add(1)
		}
		return testpeers.None
	})
	framework.ApplyYAML(t, s.cp, sampleClassesYAML(s.ns, "fanout-s3", s3, proxy.URL,
		map[string]string{"cistern-fanout-fast": "fast", "cistern-fanout-bulk": "bulk"}))
	v, err := params.Parse(map[string]string{"pool": "fast", "source": "s3://datasets/sample/", "endpoint": proxy.URL, "pathStyle": "true"}, params.StorageClass)
	if err != nil {
		t.Fatal(err)
	}
	id := v.Dataset.ID()
	secrets := map[string]string{"accessKeyID": s3.AccessKey, "secretAccessKey": s3.SecretKey}

	stage := func(node, pool string) {
		t.Helper()
		pv := s.claimOn(t, "fanout-"+node, "cistern-fanout-"+pool, "16Mi", node)
		if err := s.publishOn(t, node, pv, secrets, sums); err != nil {
			t.Fatal(err)
		}
	}

	stage(nodeB, "fast")
	fromS3 := gets.Load()
	// node-b's StoragePool lists the dataset Ready, with node-b's peer endpoint.
	pools, err := poolpublisher.NewClient(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "node-b's StoragePool lists the dataset with its peer endpoint", func(ctx context.Context) error {
		sp, err := pools.Get(ctx, poolpublisher.ObjectName("fast", nodeB, false), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if sp.Labels[consts.LabelDatasetPrefix+id] != "true" {
			return errorf("dataset %s not labelled Ready", id)
		}
		if sp.Annotations[peer.AnnotationEndpoint] != s.c.Nodes[nodeB].PeerAddress || sp.Annotations[peer.AnnotationCertHash] == "" {
			return errorf("peer endpoint not published: %v", sp.Annotations)
		}
		return nil
	})

	before := gets.Load()
	stage(nodeA, "bulk")
	if n := gets.Load() - before; n > 1 {
		t.Errorf("node-a read %d objects from S3 (node-b read %d), want the one pinned read of its access proof", n, fromS3)
	}
	if got := metric(t, s.c.Nodes[nodeA].MetricsAddress, fmt.Sprintf(`cistern_dataset_fetched_bytes_total{dataset=%q,origin="peer"}`, id)); got == 0 {
		t.Error("node-a counted no bytes from peers")
	}
}

// datasetFanOutTogether: node-a and node-b are asked for the same dataset, which neither holds,
// at the same moment, with each object GET from S3 held back 400 ms (a slow object store). Each
// finds the other staging through the StoragePool inventory as it goes, so between them they read
// less than the dataset twice from S3 (counted at the proxy), and each volume matches the source.
func (s *scenario) datasetFanOutTogether(t *testing.T) {
	s3, _ := s3Server(t)
	const count, size = 24, 1 << 20
	sums, err := s3.RandomDataset(ctx(t), "datasets", "together", count, size)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testpeers.StartProxy(t, s3.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if q := r.URL.Query(); r.Method == http.MethodGet && !q.Has("list-type") && !q.Has("attributes") {
			return testpeers.Fault{ResetAfter: -1, Delay: 400 * time.Millisecond, Name: "slow-get"}
		}
		return testpeers.None
	})
	framework.ApplyYAML(t, s.cp, datasetClassesYAML(s.ns, "together-s3", s3, proxy.URL, "s3://datasets/together/",
		map[string]string{"cistern-together-fast": "fast", "cistern-together-bulk": "bulk"}))
	secrets := map[string]string{"accessKeyID": s3.AccessKey, "secretAccessKey": s3.SecretKey}
	pvs := map[string]*corev1.PersistentVolume{}
	for node, pool := range map[string]string{nodeA: "bulk", nodeB: "fast"} {
		pvs[node] = s.claimOn(t, "together-"+node, "cistern-together-"+pool, "32Mi", node)
	}
	var wg sync.WaitGroup
	for node, pv := range pvs {
		wg.Go(func() {
			if err := s.publishOn(t, node, pv, secrets, sums); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if proxy.Delivered("slow-get") < count {
		t.Fatalf("the proxy held back %d object GETs, fewer than the %d objects: S3 was not read through it", proxy.Delivered("slow-get"), count)
	}
	total := int64(count * size)
	got := proxy.Sent.Load()
	t.Logf("fanout-together: nodes=2 dataset_bytes=%d s3_bytes=%d ratio=%.2f", total, got, float64(got)/float64(total))
	if got >= 2*total {
		t.Errorf("S3 sent %d bytes for a %d-byte dataset staged on 2 nodes together: the nodes did not share it", got, total)
	}
	v, err := params.Parse(map[string]string{"pool": "fast", "source": "s3://datasets/together/", "endpoint": proxy.URL, "pathStyle": "true"}, params.StorageClass)
	if err != nil {
		t.Fatal(err)
	}
	// A node that read nothing from its peer has no such series; one of the two must.
	var fromPeers float64
	for _, node := range []string{nodeA, nodeB} {
		if v, ok := metricValue(t, s.c.Nodes[node].MetricsAddress, fmt.Sprintf(`cistern_dataset_fetched_bytes_total{dataset=%q,origin="peer"}`, v.Dataset.ID())); ok {
			fromPeers += v
		}
	}
	if fromPeers == 0 {
		t.Error("neither node counted bytes from its peer")
	}
}

// claimOn creates a claim of class and a pod on node that uses it, and returns the claim's PV
// once it is bound.
func (s *scenario) claimOn(t *testing.T, name, class, size, node string) *corev1.PersistentVolume {
	t.Helper()
	cs := s.cp.Client
	if _, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx(t), newClaim(name, class, size), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(s.ns).Create(ctx(t), newPod(name, name, map[string]string{corev1.LabelHostname: node}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return boundPV(t, cs, s.ns, name)
}

// publishOn stages and publishes pv on node as kubelet does, with the Secret's data, checks its
// files against sums, and unmounts it when the test ends. Safe to call from any goroutine.
func (s *scenario) publishOn(t *testing.T, node string, pv *corev1.PersistentVolume, secrets, sums map[string]string) error {
	stageCtx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, err := cluster.StageAndPublish(stageCtx, s.c.Nodes[node].Socket, pv, secrets, s.c.Nodes[node].KubeletRoot)
	if err != nil {
		return fmt.Errorf("%s: %w", node, err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err := cluster.VerifyFiles(m.TargetPath, sums); err != nil {
		return fmt.Errorf("published volume on %s: %w", node, err)
	}
	return nil
}

// metric reads one sample from a driver's /metrics; a series the driver does not export fails
// the test (never 0: a renamed counter must not pass a check for 0).
func metric(t *testing.T, addr, series string) float64 {
	t.Helper()
	v, ok := metricValue(t, addr, series)
	if !ok {
		t.Fatalf("the driver's /metrics at %s has no %s", addr, series)
	}
	return v
}

// metricValue reads one sample from a driver's /metrics, and whether the driver exports it.
func metricValue(t *testing.T, addr, series string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f, true
		}
	}
	return 0, false
}

// peerPort: the peer port serves only node plugins: a node plugin's pod-bound peer token is
// served; the node's token for the API server, and a tenant pod's token even for the peer
// audience, are refused (TokenReview on the real API server). The certificate is the one the
// node published on its StoragePool.
func (s *scenario) peerPort(t *testing.T) {
	pools, err := poolpublisher.NewClient(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	var sp *spapi.StoragePool
	eventually(t, time.Minute, "node-a's peer endpoint published", func(ctx context.Context) error {
		sp, err = pools.Get(ctx, poolpublisher.ObjectName("fast", nodeA, false), metav1.GetOptions{})
		if err == nil && sp.Annotations[peer.AnnotationCertHash] == "" {
			return errorf("no peer annotations")
		}
		return err
	})
	target := peer.Peer{Node: nodeA, Address: sp.Annotations[peer.AnnotationEndpoint], CertHash: sp.Annotations[peer.AnnotationCertHash]}

	// A tenant's pod on node-b, with the namespace's default ServiceAccount.
	cs := s.cp.Client
	tenant := newPod("peer-client", "none", map[string]string{corev1.LabelHostname: nodeB})
	tenant.Spec.Volumes = nil
	tenant.Spec.Containers[0].VolumeMounts = nil
	tenant, err = cs.CoreV1().Pods(s.ns).Create(ctx(t), tenant, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "tenant pod scheduled", func(ctx context.Context) error {
		tenant, err = cs.CoreV1().Pods(s.ns).Get(ctx, tenant.Name, metav1.GetOptions{})
		if err == nil && tenant.Spec.NodeName == "" {
			return errorf("not scheduled")
		}
		return err
	})
	nodePod := cluster.DaemonSetPod(t, s.cp, nodeB)

	const id, digest = "0123456789abcdef01234567", "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name  string
		token string
		want  string
	}{
		{"node plugin", framework.PodServiceAccountToken(t, s.cp, nodePod, peer.Audience), "404"},
		{"failure case - node plugin's API server token", framework.PodServiceAccountToken(t, s.cp, nodePod), "401"},
		{"failure case - tenant pod", framework.PodServiceAccountToken(t, s.cp, tenant, peer.Audience), "401"},
		{"failure case - no token", "", "401"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := peer.NewNetwork(peer.NetworkConfig{Self: nodeB, Directory: noPeers{}, Token: func() (string, error) { return tc.token, nil }})
			if err != nil {
				t.Fatal(err)
			}
			_, err = n.HaveOf(ctx(t), target, id, digest)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an answer %s", err, tc.want)
			}
		})
	}
}

type noPeers struct{}

func (noPeers) Peers(string) []peer.Peer { return nil }
