package installcheck

import (
	"context"
	"errors"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	spapi "github.com/cistern-csi/cistern/pkg/apis/storagepool/v1alpha1"
)

const driver = "cistern.csi.dev"

func csiNode(name string, drivers ...string) *storagev1.CSINode {
	n := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, d := range drivers {
		n.Spec.Drivers = append(n.Spec.Drivers, storagev1.CSINodeDriver{Name: d, NodeID: name})
	}
	return n
}

func pool(name, drv string, nodes ...string) spapi.StoragePool {
	return spapi.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spapi.StoragePoolSpec{Driver: drv},
		Status: spapi.StoragePoolStatus{AccessibleNodes: nodes}}
}

func TestCheck(t *testing.T) {
	csiDriver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driver}}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		pools   []spapi.StoragePool
		poolErr error
		want    []string // substrings of the error; none: passes
	}{
		{name: "every registered node has its pools",
			objects: []runtime.Object{csiDriver, csiNode("a", driver), csiNode("b", "other.csi.dev", driver), csiNode("c", "other.csi.dev")},
			pools:   []spapi.StoragePool{pool("a-fast", driver, "a"), pool("shared", driver, "a", "b"), pool("c-other", "other.csi.dev", "c")}},
		{name: "failure case - no CSIDriver", objects: []runtime.Object{csiNode("a", driver)},
			want: []string{"no CSIDriver cistern.csi.dev"}},
		{name: "failure case - no node registered the driver", objects: []runtime.Object{csiDriver, csiNode("c", "other.csi.dev")},
			want: []string{"no node has registered cistern.csi.dev"}},
		{name: "failure case - nodes without pools, another driver's pool not counted",
			objects: []runtime.Object{csiDriver, csiNode("a", driver), csiNode("b", driver), csiNode("c", driver)},
			pools:   []spapi.StoragePool{pool("a-fast", driver, "a"), pool("b-other", "other.csi.dev", "b")},
			want:    []string{"node b runs cistern.csi.dev but has no StoragePool", "node c runs"}},
		{name: "failure case - StoragePools not listable", objects: []runtime.Object{csiDriver, csiNode("a", driver)},
			poolErr: errors.New("forbidden"), want: []string{"listing StoragePools: forbidden"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset(tc.objects...)
			r, err := Check(context.Background(), kube, func(context.Context) ([]spapi.StoragePool, error) { return tc.pools, tc.poolErr }, driver)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if strings.Join(r.Nodes, ",") != "a,b" || strings.Join(r.Pools["a"], ",") != "a-fast,shared" || strings.Join(r.Pools["b"], ",") != "shared" {
					t.Errorf("report %+v, want nodes a,b with their pools", r)
				}
				return
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want it to say %q", err, w)
				}
			}
		})
	}
}
