package e2enode

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/nodeevents"
	"github.com/cistern-csi/cistern/pkg/streamfs"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/framework/realnode"
	"github.com/cistern-csi/cistern/test/testpeers"
)

const (
	// k8sE2EStreamingTestDriver is the streaming run's testdriver, with ${S3_ENDPOINT} where
	// the nodes' address of the suite's S3 server goes.
	k8sE2EStreamingTestDriver = "test/k8se2e/testdriver-streaming.yaml"
	// k8sE2EStreamingPolicy is the admission policy that publishes streaming inline volumes
	// read-only (the file says why the run needs it).
	k8sE2EStreamingPolicy = "test/k8se2e/streaming-readonly-policy.yaml"
	// k8sE2EObjectDelay delays every object GET of the dataset, so that its staging (a few
	// small files, otherwise done in milliseconds) is still running when NodePublishVolume
	// decides: a dataset already staged is served as the cached tree, not streamed.
	k8sE2EObjectDelay = 2 * time.Second
)

// k8sE2EStreaming is what the "streaming" run adds to the suite: a public dataset on an S3
// server, the nodes' way to it, and the testdriver that names it.
type k8sE2EStreaming struct {
	// endpoint is the S3 server as the nodes reach it: a port of the kubernetes Service
	// address, their one route out, relayed to the server on the host.
	endpoint string
	// testDriver is the streaming testdriver with the endpoint filled in.
	testDriver string
}

// startK8sE2EStreaming starts versitygw with the dataset of the node suite (five files, nested
// keys) in a bucket whose policy lets anyone list and read it (a public dataset: the inline
// volume has no Secret, so the node reads it anonymously), behind a proxy that delays object
// GETs, relayed at the kubernetes Service address; and writes the testdriver naming it into
// dir. serveKubernetesService must have put that address on the host.
func startK8sE2EStreaming(t *testing.T, root, dir string) *k8sE2EStreaming {
	t.Helper()
	s := testpeers.StartS3(t, "")
	s.Bucket(t, datasetBucket)
	uploadDataset(t, s)
	policy := `{"Version":"2012-10-17","Statement":[` +
		`{"Effect":"Allow","Principal":"*","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::` + datasetBucket + `"]},` +
		`{"Effect":"Allow","Principal":"*","Action":["s3:GetObject","s3:GetObjectAttributes"],"Resource":["arn:aws:s3:::` + datasetBucket + `/*"]}]}`
	if _, err := s.Client.PutBucketPolicy(context.Background(), &s3.PutBucketPolicyInput{
		Bucket: aws.String(datasetBucket), Policy: aws.String(policy)}); err != nil {
		t.Fatalf("making bucket %s public: %v", datasetBucket, err)
	}
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if q := r.URL.Query(); r.Method == http.MethodGet && !q.Has("list-type") && !q.Has("attributes") {
			return testpeers.Fault{ResetAfter: -1, Delay: k8sE2EObjectDelay}
		}
		return testpeers.None
	})
	ports, err := framework.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(framework.KubernetesServiceIP, fmt.Sprint(ports[0]))
	relayTCP(t, addr, strings.TrimPrefix(proxy.URL, "http://"))
	st := &k8sE2EStreaming{endpoint: "http://" + addr, testDriver: filepath.Join(dir, "testdriver-streaming.yaml")}

	tmpl, err := os.ReadFile(filepath.Join(root, k8sE2EStreamingTestDriver))
	if err != nil {
		t.Fatal(err)
	}
	const placeholder = "${S3_ENDPOINT}"
	if n := strings.Count(string(tmpl), placeholder); n != 1 {
		t.Fatalf("%s: %d occurrences of %s, want 1", k8sE2EStreamingTestDriver, n, placeholder)
	}
	if err := os.WriteFile(st.testDriver, []byte(strings.Replace(string(tmpl), placeholder, st.endpoint, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return st
}

// driverArgs are the node plugin's flags the run needs, set as an administrator sets them: the
// dataset's endpoint among those inline volumes may name (deploy/csi allows none), and plain
// HTTP (the suite's S3 server has no TLS).
func (st *k8sE2EStreaming) driverArgs() []string {
	return []string{"--tenant-s3-endpoints=" + framework.KubernetesServiceIP + "/32", "--s3-allow-plain-http"}
}

// applyPolicy installs the admission policy and waits until the API server applies it: a pod
// with a streaming inline volume, created with dry run, comes back with the volume read-only.
func (st *k8sE2EStreaming) applyPolicy(t *testing.T, cp *framework.ControlPlane, root string) {
	t.Helper()
	framework.Kubectl(t, cp, "apply", "--server-side", "-f", filepath.Join(root, k8sE2EStreamingPolicy))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "streaming-policy-check"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10.2"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: consts.DriverName, VolumeAttributes: map[string]string{
					"source": "s3://" + datasetBucket + "/" + datasetPrefix, "dataMode": consts.DataModeStreaming}}}}},
		},
	}
	var last string
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("csi.readOnly %v", p.Spec.Volumes[0].CSI.ReadOnly)
		return ptr.Deref(p.Spec.Volumes[0].CSI.ReadOnly, false), nil
	})
	if err != nil {
		t.Fatalf("%s: a streaming inline volume is not made read-only (last: %s): %v", k8sE2EStreamingPolicy, last, err)
	}
}

// podVolumeWatch records the CSI volumes of pods that each node mounts while a run goes, with
// their filesystem types, from the nodes' mount tables. A pod of the run lives for seconds
// (started, checked with kubectl exec, deleted); the tables are read every 100 ms.
type podVolumeWatch struct {
	stop chan struct{}
	done sync.WaitGroup
	mu   sync.Mutex
	seen map[string]string // "<node> <mount point>" -> filesystem type
}

func watchPodVolumes(nodes map[string]*realnode.NetnsNode) *podVolumeWatch {
	w := &podVolumeWatch{stop: make(chan struct{}), seen: map[string]string{}}
	dir := filepath.Join(realnode.KubeletRootDir, "pods")
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			for name, n := range nodes {
				data, err := n.Mountinfo()
				if err != nil {
					continue
				}
				for _, m := range mountsUnder(data, dir) {
					if strings.Contains(m.point, "/volumes/kubernetes.io~csi/") && strings.HasSuffix(m.point, "/mount") {
						w.mu.Lock()
						w.seen[name+" "+m.point] = m.fstype
						w.mu.Unlock()
					}
				}
			}
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// end stops the watch and returns what it saw.
func (w *podVolumeWatch) end() map[string]string {
	close(w.stop)
	w.done.Wait()
	return w.seen
}

// checkStreamed holds the run to the streaming path: every CSI volume a pod of the run mounted
// was a streaming (FUSE) mount, at least one per passed spec, and no node recorded a streaming
// volume staged instead (Event StreamingVolumeStaged). A run whose volumes were staged passes
// the suite's specs as well, and proves nothing about streaming.
func checkStreamed(t *testing.T, cp *framework.ControlPlane, seen map[string]string, passed int) {
	t.Helper()
	want := "fuse." + streamfs.Subtype
	var streamed, other []string
	for m, fstype := range seen {
		if fstype == want {
			streamed = append(streamed, m)
		} else {
			other = append(other, m+" ("+fstype+")")
		}
	}
	slices.Sort(streamed)
	slices.Sort(other)
	t.Logf("pod volumes mounted during the run: %d streaming %v, %d other %v", len(streamed), streamed, len(other), other)
	if len(other) > 0 {
		t.Errorf("pod volumes of the streaming run that are not %s mounts: %v", want, other)
	}
	if len(streamed) < passed {
		t.Errorf("%d specs passed but %d streaming (%s) pod volumes were seen on the nodes: the run did not stream", passed, len(streamed), want)
	}
	events, err := cp.Client.CoreV1().Events(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": "Node", "reason": nodeevents.ReasonStreamingStaged}.String()})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		t.Errorf("node %s: %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
	}
}
