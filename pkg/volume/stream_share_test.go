package volume

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cistern-csi/cistern/pkg/state"
)

// TestTreeNamespace: a streaming tree counts under its pod's namespace, else under its claim's,
// but an inline volume's (or the lower layer of one, or of a per-pod copy) only under its pod's:
// its other attributes are the pod author's.
func TestTreeNamespace(t *testing.T) {
	e := newFakeEnv(t, false)
	pod := map[string]string{"csi.storage.k8s.io/pod.namespace": "p", "csi.storage.k8s.io/pvc/namespace": "c"}
	claim := map[string]string{"csi.storage.k8s.io/pvc/namespace": "c"}
	for _, v := range []state.Volume{{ID: "provisioned"}, {ID: "inline", Ephemeral: true}} {
		if err := e.store.PutVolume(v); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		rec  state.TreeVolume
		want string
	}{
		{"inline with its pod", state.TreeVolume{Inline: true, Parameters: pod}, "p"},
		{"inline naming a claim only", state.TreeVolume{Inline: true, Parameters: claim}, ""},
		{"static PV of a claim", state.TreeVolume{Parameters: claim}, "c"},
		{"static PV of no one", state.TreeVolume{}, ""},
		{"lower layer of a provisioned volume", state.TreeVolume{LayerOf: "provisioned", Parameters: claim}, "c"},
		{"lower layer of an inline volume", state.TreeVolume{LayerOf: "inline", Parameters: claim}, ""},
		{"lower layer of an inline volume with its pod", state.TreeVolume{LayerOf: "inline", Parameters: pod}, "p"},
		{"lower layer of a volume not recorded", state.TreeVolume{LayerOf: "gone", Parameters: claim}, ""},
	} {
		if got := e.s.treeNamespace(tc.rec); got != tc.want {
			t.Errorf("%s: namespace %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestStreamShareReserve: a reservation counts against the node's bound and its namespace's share
// until it is done or mounted; the share defaults to a quarter of the node's bound.
func TestStreamShareReserve(t *testing.T) {
	if got := newStreamMounts(StreamingVolumes{}).perNamespace; got != DefaultMaxStreamingVolumes/4 {
		t.Errorf("default share %d, want %d", got, DefaultMaxStreamingVolumes/4)
	}
	if got := newStreamMounts(StreamingVolumes{MaxVolumes: 2}).perNamespace; got != 1 {
		t.Errorf("share of a bound of 2: %d, want 1", got)
	}
	sm := newStreamMounts(StreamingVolumes{MaxVolumes: 3, MaxVolumesPerNamespace: 1})
	done, err := sm.reserve("a1", "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sm.reserve("a2", "a"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second of a while the first mounts: %v, want ResourceExhausted", err)
	}
	sm.add("a1", &streamMount{namespace: "a"})
	done()
	if _, err := sm.reserve("a2", "a"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second of a once the first is mounted: %v, want ResourceExhausted", err)
	}
	if _, err := sm.reserve("n1", ""); err != nil {
		t.Fatalf("one naming no namespace: %v", err)
	}
	if _, err := sm.reserve("n2", ""); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second naming no namespace: %v, want ResourceExhausted", err)
	}
	if _, err := sm.reserve("b1", "b"); err != nil {
		t.Fatalf("one of b: %v", err)
	}
	if _, err := sm.reserve("c1", "c"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("one of c on a full node: %v, want ResourceExhausted", err)
	}
	delete(sm.m, "a1") // stopped
	if _, err := sm.reserve("a2", "a"); err != nil {
		t.Fatalf("a second of a once the first stopped: %v", err)
	}
}
