package nodeevents_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/nodeevents"
	"github.com/cistern-csi/cistern/test/framework"
)

// TestEvictedEvent records an eviction on a real API server and finds it among the Node's Events,
// the way kubectl describe node looks for them.
func TestEvictedEvent(t *testing.T) {
	cp := framework.StartControlPlane(t, framework.Options{})
	ctx := context.Background()
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := nodeevents.New(cp.Client, "node-a", "cistern-csi-driver")
	t.Cleanup(r.Stop)
	r.Evicted(datasource.EvictEvent{Pool: "/pools/fast", DatasetID: "0123", Source: "s3://models/llm", Bytes: 3 << 30,
		LastUsed: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), Reason: "pool free space 1.0 GiB is under the low watermark 2.0 GiB (10%)"})

	waitForEvent(t, cp, "an eviction", func(e corev1.Event) bool {
		return e.Reason == nodeevents.ReasonEvicted && e.Type == corev1.EventTypeNormal &&
			strings.Contains(e.Message, "s3://models/llm") && strings.Contains(e.Message, "low watermark") &&
			e.Source.Component == "cistern-csi-driver" && e.Source.Host == "node-a"
	})
}

// TestUnverifiableEvent records an object nothing could check, refused, as a Warning on the Node
// that names the key, the dataset and why.
func TestUnverifiableEvent(t *testing.T) {
	cp := framework.StartControlPlane(t, framework.Options{})
	ctx := context.Background()
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := nodeevents.New(cp.Client, "node-a", "cistern-csi-driver")
	t.Cleanup(r.Stop)
	r.Unverifiable(datasource.UnverifiableEvent{Dataset: "0123", Key: "shards/a.bin", Reason: "no likely part size"})
	waitForEvent(t, cp, "an unverifiable object", func(e corev1.Event) bool {
		return e.Reason == nodeevents.ReasonUnverifiable && e.Type == corev1.EventTypeWarning &&
			strings.Contains(e.Message, `"shards/a.bin"`) && strings.Contains(e.Message, "0123") &&
			strings.Contains(e.Message, "refused") && strings.Contains(e.Message, "no likely part size")
	})
}

// waitForEvent waits for an Event on node-a that match accepts, the way kubectl describe node
// looks for them.
func waitForEvent(t *testing.T, cp *framework.ControlPlane, what string, match func(corev1.Event) bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute) // the broadcaster sends asynchronously; the machine may be busy
	for {
		evs, err := cp.Client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Node,involvedObject.name=node-a,involvedObject.uid=node-a"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if match(e) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Event of %s on the node; events: %+v", what, evs.Items)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
