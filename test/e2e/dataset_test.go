package e2e_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/cistern-csi/cistern/test/e2e/cluster"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// s3Server starts versitygw with the sample dataset, or skips.
func s3Server(t testing.TB) (*cluster.S3, map[string]string) {
	t.Helper()
	bin := testpeers.VersitygwBinary()
	if bin == "" {
		testutil.Unavailable(t, "versitygw not built; run `make s3-tools`")
	}
	s3 := cluster.StartS3(t, bin, t.TempDir())
	sums, err := s3.SampleDataset(ctx(t), "datasets", "sample")
	if err != nil {
		t.Fatal(err)
	}
	return s3, sums
}

// sampleClassesYAML is a Secret named secret in ns with s3's keys and, for each class name and
// pool in classes, a WaitForFirstConsumer StorageClass of that pool whose source is s3's sample
// dataset at endpoint, staged with that Secret.
func sampleClassesYAML(ns, secret string, s3 *cluster.S3, endpoint string, classes map[string]string) string {
	return datasetClassesYAML(ns, secret, s3, endpoint, "s3://datasets/sample/", classes)
}

// datasetClassesYAML is sampleClassesYAML for the dataset at source.
func datasetClassesYAML(ns, secret string, s3 *cluster.S3, endpoint, source string, classes map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Secret
metadata: {name: %s, namespace: %s}
stringData: {accessKeyID: %s, secretAccessKey: %s}
`, secret, ns, s3.AccessKey, s3.SecretKey)
	for _, name := range slices.Sorted(maps.Keys(classes)) {
		fmt.Fprintf(&b, `---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: %[1]s}
provisioner: cistern.csi.dev
volumeBindingMode: WaitForFirstConsumer
parameters:
  pool: %[2]s
  source: %[6]s
  endpoint: %[3]s
  pathStyle: "true"
  csi.storage.k8s.io/node-stage-secret-name: %[4]s
  csi.storage.k8s.io/node-stage-secret-namespace: %[5]s
`, name, classes[name], endpoint, secret, ns, source)
	}
	return b.String()
}

// dataset: a claim of a class with an S3 source and a secret; once provisioned on node-a, the
// test calls NodeStageVolume and NodePublishVolume as kubelet does (with the secret's data) and
// checks every file against the source.
func (s *scenario) dataset(t *testing.T) {
	s3, sums := s3Server(t)
	cs := s.cp.Client
	framework.ApplyYAML(t, s.cp, sampleClassesYAML(s.ns, "sample-s3", s3, s3.Endpoint, map[string]string{"cistern-sample": "fast"}))
	if _, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx(t), newClaim("sample", "cistern-sample", "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(s.ns).Create(ctx(t), newPod("sample", "sample", map[string]string{corev1.LabelHostname: nodeA}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := boundPV(t, cs, s.ns, "sample")
	secret, err := cs.CoreV1().Secrets(s.ns).Get(ctx(t), "sample-s3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{}
	for k, v := range secret.Data {
		secrets[k] = string(v)
	}
	stageCtx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, err := cluster.StageAndPublish(stageCtx, s.c.Nodes[nodeA].Socket, pv, secrets, s.c.Nodes[nodeA].KubeletRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Unmount(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	if err := cluster.VerifyFiles(m.TargetPath, sums); err != nil {
		t.Errorf("published volume: %v", err)
	}
}

// volumeManager: a VolumeManager with replicas 2 gets a static PV and claim pinned to both nodes,
// and its status lists them with the node affinity pods need; the test then stages that PV on each
// node as kubelet would and checks the data on both. (Its stager pods never run here: these nodes
// have no kubelet. test/e2enode runs them.)
func (s *scenario) volumeManager(t *testing.T) {
	s3, sums := s3Server(t)
	endpoint, access, secret := s3.Endpoint, s3.AccessKey, s3.SecretKey
	framework.ApplyYAML(t, s.cp, fmt.Sprintf(`
apiVersion: v1
kind: Secret
metadata: {name: vm-s3, namespace: %[1]s}
stringData: {accessKeyID: %[2]s, secretAccessKey: %[3]s}
---
apiVersion: data.cistern.dev/v1alpha1
kind: VolumeManager
metadata: {name: sample, namespace: %[1]s}
spec:
  volumes:
  - id: sample
    replicas: 2
    sourceType: S3
    sourceURL: s3://datasets/sample/
    capacity: 64Mi
    accessMode: ReadOnlyMany
    options: {endpoint: %[4]q, pathStyle: "true", secretName: vm-s3}
`, s.ns, access, secret, endpoint))
	var claim string
	eventually(t, 2*time.Minute, "VolumeManager status lists both nodes", func(ctx context.Context) error {
		obj, err := s.dynamic(t).Resource(volumeManagerGVR).Namespace(s.ns).Get(ctx, "sample", metav1.GetOptions{})
		if err != nil {
			return err
		}
		vols, _, _ := unstructured.NestedSlice(obj.Object, "status", "volumes")
		if len(vols) != 1 {
			return errorf("status.volumes %v", vols)
		}
		v, _ := vols[0].(map[string]any)
		entries, _, _ := unstructured.NestedSlice(v, "nodes")
		var nodes []string
		for _, e := range entries {
			if m, ok := e.(map[string]any); ok {
				name, _, _ := unstructured.NestedString(m, "name")
				nodes = append(nodes, name)
			}
		}
		slices.Sort(nodes)
		if !slices.Equal(nodes, []string{nodeA, nodeB}) {
			msg, _, _ := unstructured.NestedString(v, "message")
			return errorf("status.volumes[0].nodes %v (message %q), want both nodes", nodes, msg)
		}
		terms, _, _ := unstructured.NestedSlice(v, "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
		if len(terms) != 1 {
			return errorf("status.volumes[0].nodeAffinity %v", terms)
		}
		claim, _, _ = unstructured.NestedString(v, "volumeSource", "persistentVolumeClaim", "claimName")
		return nil
	})
	pv := boundPV(t, s.cp.Client, s.ns, claim)
	if got := strings.Split(cluster.TopologyOf(pv), ","); !slices.Equal(sorted(got), []string{nodeA, nodeB}) {
		t.Errorf("PV %s pinned to %v, want both nodes", pv.Name, got)
	}
	secrets := map[string]string{"accessKeyID": access, "secretAccessKey": secret}
	for _, node := range []string{nodeA, nodeB} {
		stageCtx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		m, err := cluster.StageAndPublish(stageCtx, s.c.Nodes[node].Socket, pv, secrets, s.c.Nodes[node].KubeletRoot)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", node, err)
		}
		if err := cluster.VerifyFiles(m.TargetPath, sums); err != nil {
			t.Errorf("%s: %v", node, err)
		}
		if err := m.Unmount(context.Background()); err != nil {
			t.Error(err)
		}
	}
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}
