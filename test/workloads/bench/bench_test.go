//go:build bench

// A benchmark written as a test (it needs a *testing.T's helpers and subtests): built only
// with -tags bench, by make bench-workloads.

// Package bench measures the workload-controller at scale on a real control plane: a
// LeaderWorkerSet of 500 groups of 8 pods. Run with `make bench-workloads` (-tags bench).
package bench

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/workloads/testutil"
)

const (
	groups = 500
	size   = 8
)

// counter counts the controller's requests by verb and resource.
type counter struct {
	mu sync.Mutex
	n  map[string]int
	rt http.RoundTripper
}

func (c *counter) RoundTrip(req *http.Request) (*http.Response, error) {
	verb := req.Method
	if req.URL.Query().Get("watch") == "true" {
		verb = "WATCH"
	}
	c.mu.Lock()
	c.n[verb+" "+resourceOf(req.URL.Path)]++
	c.mu.Unlock()
	return c.rt.RoundTrip(req)
}

func (c *counter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// resourceOf turns /api/v1/namespaces/ns/pods/x/status into "pods/status".
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) > 0 && parts[0] == "apis" && len(parts) > 3 {
		parts = parts[3:]
	} else if len(parts) > 2 {
		parts = parts[2:]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "namespaces"
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}

func diff(after, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func writes(m map[string]int) int {
	n := 0
	for k, v := range m {
		if !strings.HasPrefix(k, "GET ") && !strings.HasPrefix(k, "WATCH ") {
			n += v
		}
	}
	return n
}

func format(m map[string]int, per float64) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "    %-40s %6d  (%.2f per group)\n", k, m[k], float64(m[k])/per)
	}
	return b.String()
}

func TestLeaderWorkerSetScale(t *testing.T) {
	// The StatefulSet controller must not be the bottleneck being measured: lift its client limits.
	cp := framework.StartControlPlane(t, framework.Options{
		ControllerManager:     true,
		ControllerManagerArgs: []string{"--kube-api-qps=1000", "--kube-api-burst=2000", "--concurrent-statefulset-syncs=20"},
		APIServerArgs:         []string{"--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000"},
	})
	root := framework.RepoRoot()
	if err := testutil.InstallCRDs(cp.Config, filepath.Join(root, "deploy", "csi", "crds")); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(cp.Config, client.Options{Scheme: workloads.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	// The controller's requests go through cnt.
	cnt := &counter{n: map[string]int{}}
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { cnt.rt = rt; return cnt })
	wc, err := testutil.ControllerConfig(func(wc *workloads.Config) {
		wc.WebhookServiceNamespace, wc.GroupWorkers = "default", 8
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.StartController(cfg, wc); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // let the caches sync
	ns := framework.CreateNamespace(t, cp, "bench")

	before := cnt.snapshot()
	lws := &v1alpha1.LeaderWorkerSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "big"},
		Spec: v1alpha1.LeaderWorkerSetSpec{
			Replicas: ptr.To[int32](groups),
			LeaderWorkerTemplate: v1alpha1.LeaderWorkerTemplate{
				Size: ptr.To[int32](size),
				WorkerTemplate: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "main", Image: "registry.invalid/app:1"}}}},
			},
		},
	}
	start := time.Now()
	if err := cl.Create(context.Background(), lws); err != nil {
		t.Fatal(err)
	}
	var stsDone, podsDone time.Duration
	var lastSts, lastPods int
	framework.Eventually(t, 15*time.Minute, "all StatefulSets and pods", func(ctx context.Context) error {
		var sets appsv1.StatefulSetList
		if err := cl.List(ctx, &sets, client.InNamespace(ns)); err != nil {
			return err
		}
		if lastSts = len(sets.Items); lastSts == groups+1 && stsDone == 0 {
			stsDone = time.Since(start)
		}
		var pods metav1.PartialObjectMetadataList
		pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := cl.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return err
		}
		if lastPods = len(pods.Items); lastPods == groups*size && podsDone == 0 {
			podsDone = time.Since(start)
		}
		if stsDone == 0 || podsDone == 0 {
			return fmt.Errorf("%d of %d StatefulSets, %d of %d pods", lastSts, groups+1, lastPods, groups*size)
		}
		return nil
	})
	framework.Eventually(t, 5*time.Minute, "status settles", func(ctx context.Context) error {
		var got v1alpha1.LeaderWorkerSet
		if err := cl.Get(ctx, client.ObjectKeyFromObject(lws), &got); err != nil {
			return err
		}
		if got.Status.Replicas != groups {
			return fmt.Errorf("status.replicas %d of %d", got.Status.Replicas, groups)
		}
		return nil
	})
	time.Sleep(5 * time.Second)
	created := diff(cnt.snapshot(), before)

	// Steady state: nothing changes, so the controller must not write.
	const quiet = 30 * time.Second
	steadyBefore := cnt.snapshot()
	time.Sleep(quiet)
	steady := diff(cnt.snapshot(), steadyBefore)

	report := fmt.Sprintf(`LeaderWorkerSet %d groups x %d pods (%d StatefulSets, %d pods), real kube-apiserver + kube-controller-manager
  all StatefulSets exist after        %s
  all pods exist after (peer: the StatefulSet controller of kube-controller-manager)  %s
  ratio StatefulSets / pods           %.2f
  controller requests from create to settled status: %d (%d writes, %.2f writes per group)
%s  steady state over %s: %d requests, %d writes
%s`,
		groups, size, groups+1, groups*size, stsDone.Round(10*time.Millisecond), podsDone.Round(10*time.Millisecond),
		stsDone.Seconds()/podsDone.Seconds(), total(created), writes(created), float64(writes(created))/groups,
		format(created, groups), quiet, total(steady), writes(steady), format(steady, groups))
	t.Log("\n" + report)
	out := filepath.Join(root, "_output", "bench")
	_ = os.MkdirAll(out, 0o755)
	_ = os.WriteFile(filepath.Join(out, "workloads.txt"), []byte(report), 0o644)
	if w := writes(steady); w != 0 {
		t.Errorf("steady state made %d writes: %v", w, steady)
	}
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
