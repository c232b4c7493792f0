package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
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
	cs := s.cp.Client
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
		name := "fanout-" + node
		if _, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx(t), newClaim(name, "cistern-fanout-"+pool, "16Mi"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Pods(s.ns).Create(ctx(t), newPod(name, name, map[string]string{corev1.LabelHostname: node}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pv := boundPV(t, cs, s.ns, name)
		stageCtx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		m, err := cluster.StageAndPublish(stageCtx, s.c.Nodes[node].Socket, pv, secrets, s.c.Nodes[node].KubeletRoot)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Unmount(context.Background()); err != nil {
				t.Error(err)
			}
		})
		if err := cluster.VerifyFiles(m.TargetPath, sums); err != nil {
			t.Errorf("published volume on %s: %v", node, err)
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

// metric reads one sample from a driver's /metrics; a series the driver does not export fails
// the test (never 0: a renamed counter must not pass a check for 0).
func metric(t *testing.T, addr, series string) float64 {
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
			return f
		}
	}
	t.Fatalf("the driver's /metrics at %s has no %s", addr, series)
	return 0
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
