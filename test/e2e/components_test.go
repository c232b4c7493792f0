package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/e2e/cluster"
)

// The suite reads the other components' objects without importing their Go types, so that it
// builds whichever of them the tree has.
var (
	storagePoolGVR   = schema.GroupVersionResource{Group: consts.StoragePoolGroup, Version: "v1alpha1", Resource: "storagepools"}
	lwsGVR           = schema.GroupVersionResource{Group: "workloads.cistern.dev", Version: "v1alpha1", Resource: "leaderworkersets"}
	volumeManagerGVR = schema.GroupVersionResource{Group: "data.cistern.dev", Version: "v1alpha1", Resource: "volumemanagers"}
)

var unstructuredString = unstructured.NestedString

func (s *scenario) dynamic(t testing.TB) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// storagePool finds the StoragePool object for pool on node, by the sidecar's labels.
func (s *scenario) storagePool(ctx context.Context, pool, node string) (*unstructured.Unstructured, error) {
	d, err := dynamic.NewForConfig(s.cp.Config)
	if err != nil {
		return nil, err
	}
	list, err := d.Resource(storagePoolGVR).List(ctx, metav1.ListOptions{
		LabelSelector: fmt.Sprintf("%s=%s,%s=%s", consts.LabelPool, pool, consts.LabelNode, node),
	})
	if err != nil {
		return nil, err
	}
	if len(list.Items) != 1 {
		return nil, errorf("%d StoragePool objects for pool %s on node %s, want 1", len(list.Items), pool, node)
	}
	return &list.Items[0], nil
}

// storagePools: the sidecars of both nodes publish one StoragePool per pool, with the node as
// accessible and the driver's capacity.
func (s *scenario) storagePools(t *testing.T) {
	for _, n := range nodes {
		for _, p := range n.Pools {
			eventually(t, time.Minute, "StoragePool "+p.Name+" of "+n.Name, func(ctx context.Context) error {
				obj, err := s.storagePool(ctx, p.Name, n.Name)
				if err != nil {
					return err
				}
				driver, _, _ := unstructured.NestedString(obj.Object, "spec", "driver")
				accessible, _, _ := unstructured.NestedStringSlice(obj.Object, "status", "accessibleNodes")
				total, _, _ := unstructured.NestedString(obj.Object, "status", "capacity", "total")
				if driver != consts.DriverName || len(accessible) != 1 || accessible[0] != n.Name || total == "" {
					return errorf("StoragePool %s: driver %q, accessibleNodes %v, total %q", obj.GetName(), driver, accessible, total)
				}
				return nil
			})
		}
	}
}

// leaderWorkerSet: an LWS with a claim template; every pod's claim is provisioned in a pool of
// the node that pod was scheduled to.
func (s *scenario) leaderWorkerSet(t *testing.T) {
	const lws = `
apiVersion: workloads.cistern.dev/v1alpha1
kind: LeaderWorkerSet
metadata: {name: llm}
spec:
  replicas: 2
  leaderWorkerTemplate:
    size: 2
    workerTemplate:
      spec:
        containers:
        - name: server
          image: registry.invalid/e2e:never-pulled
          volumeMounts: [{name: cache, mountPath: /cache}]
    volumeClaimTemplates:
    - metadata: {name: cache}
      spec:
        storageClassName: cistern-fast
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 32Mi}}
`
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(lws), &obj.Object); err != nil {
		t.Fatal(err)
	}
	if _, err := s.dynamic(t).Resource(lwsGVR).Namespace(s.ns).Create(ctx(t), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// 2 groups of 2 pods; each pod has its own claim.
	eventually(t, 3*time.Minute, "LWS pods scheduled with bound claims", func(ctx context.Context) error {
		pods, err := s.podNodes(ctx, "leaderworkerset.sigs.k8s.io/name=llm")
		if err != nil {
			return err
		}
		if len(pods) != 4 {
			return errorf("%d pods, want 4", len(pods))
		}
		for name, pod := range pods {
			if pod.Spec.NodeName == "" {
				return errorf("pod %s not scheduled", name)
			}
			claim := "cache-" + name
			pvc, err := s.cp.Client.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, claim, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if pvc.Spec.VolumeName == "" {
				return errorf("claim %s not bound", claim)
			}
			pv, err := s.cp.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := cluster.TopologyOf(pv); got != pod.Spec.NodeName {
				t.Errorf("pod %s on %s, its volume on %s", name, pod.Spec.NodeName, got)
			}
		}
		return nil
	})
	sts, err := s.cp.Client.AppsV1().StatefulSets(s.ns).List(ctx(t), metav1.ListOptions{LabelSelector: "leaderworkerset.sigs.k8s.io/name=llm"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sts.Items) != 3 { // the leaders' and one per group for the workers
		t.Errorf("%d StatefulSets, want 3", len(sts.Items))
	}
}
