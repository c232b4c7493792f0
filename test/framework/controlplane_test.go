package framework_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
)

// Polls for what controllers do are bounded generously: the machine may be busy.
const eventually = 2 * time.Minute

// TestStartControlPlane starts a control plane of its own: etcd and kube-apiserver only.
func TestStartControlPlane(t *testing.T) {
	t.Parallel()
	cp := framework.StartControlPlane(t, framework.Options{})
	ctx := context.Background()

	ns, err := cp.Client.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "created-by-admin"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a namespace as admin: %v", err)
	}

	// The kubeconfig file works for other clients, and kubectl is the one built from source.
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	if _, err := client.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("reading the namespace through the kubeconfig: %v", err)
	}
	if out := framework.Kubectl(t, cp, "get", "namespace", ns.Name, "-o", "name"); strings.TrimSpace(out) != "namespace/"+ns.Name {
		t.Errorf("kubectl get namespace = %q", out)
	}
	if out := framework.Kubectl(t, cp, "version", "-o", "yaml"); !strings.Contains(out, "gitVersion: v1.37.2") {
		t.Errorf("kubectl version does not report v1.37.2:\n%s", out)
	}
}

// TestSchedulingAndControllers checks that the shared control plane runs pods' prerequisites
// (ServiceAccount, kube-root-ca.crt), schedules to a node from CreateNode, and binds a
// StatefulSet's claim to a matching PersistentVolume.
func TestSchedulingAndControllers(t *testing.T) {
	t.Parallel()
	cp := framework.Shared(t)
	ctx := context.Background()
	node := framework.CreateNode(t, cp, "node-scheduling", map[string]string{"example.com/role": "storage"})
	ns := framework.CreateNamespace(t, cp, "scheduling")

	if node.Labels[consts.TopologyKey] != node.Name || node.Labels["example.com/role"] != "storage" {
		t.Errorf("node labels = %v", node.Labels)
	}
	csiNode, err := cp.Client.StorageV1().CSINodes().Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("CSINode: %v", err)
	}
	if d := csiNode.Spec.Drivers; len(d) != 1 || d[0].Name != consts.DriverName || d[0].NodeID != node.Name {
		t.Errorf("CSINode drivers = %+v", d)
	}

	// kube-controller-manager: default ServiceAccount and root CA ConfigMap in a new namespace.
	framework.Eventually(t, eventually, "ServiceAccount default", func(ctx context.Context) error {
		_, err := cp.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	framework.Eventually(t, eventually, "ConfigMap kube-root-ca.crt", func(ctx context.Context) error {
		_, err := cp.Client.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})

	// kube-scheduler: a pod lands on the only node that matches.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pod"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"example.com/role": "storage"},
			Containers:   []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	framework.Eventually(t, eventually, "pod scheduled", func(ctx context.Context) error {
		return onNode(ctx, cp, ns, pod.Name, node.Name)
	})

	// StatefulSet controller, scheduler volume binding and the PV controller together.
	storageClass := createLocalStorage(t, cp, ns, node.Name)
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "sts"},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "sts"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "sts"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "pause", Image: "registry.k8s.io/pause:3.10",
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
				}}},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: &storageClass,
					Resources: corev1.VolumeResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
					},
				},
			}},
		},
	}
	if _, err := cp.Client.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating StatefulSet: %v", err)
	}
	framework.Eventually(t, eventually, "claim data-sts-0 Bound", func(ctx context.Context) error {
		pvc, err := cp.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data-sts-0", metav1.GetOptions{})
		if err == nil && pvc.Status.Phase != corev1.ClaimBound {
			err = fmt.Errorf("phase %s", pvc.Status.Phase)
		}
		return err
	})
	framework.Eventually(t, eventually, "pod sts-0 scheduled", func(ctx context.Context) error {
		return onNode(ctx, cp, ns, "sts-0", node.Name)
	})
}

// onNode says whether pod ns/name is bound to node.
func onNode(ctx context.Context, cp *framework.ControlPlane, ns, name, node string) error {
	p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err == nil && p.Spec.NodeName != node {
		err = fmt.Errorf("pod %s on node %q, want %s", name, p.Spec.NodeName, node)
	}
	return err
}

// createLocalStorage creates a no-provisioner StorageClass and one local PV on nodeName, named
// after the namespace so that tests sharing the control plane do not collide.
func createLocalStorage(t *testing.T, cp *framework.ControlPlane, ns, nodeName string) string {
	t.Helper()
	ctx := context.Background()
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: ns},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
	if _, err := cp.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:         corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: sc.Name,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				Local: &corev1.LocalVolumeSource{Path: "/mnt/unused"},
			},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{nodeName},
				}}}},
			}},
		},
	}
	if _, err := cp.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
		_ = cp.Client.StorageV1().StorageClasses().Delete(context.Background(), sc.Name, metav1.DeleteOptions{})
	})
	return sc.Name
}

// TestServiceAccountKubeconfig checks that a ServiceAccount client gets what its RBAC grants and
// is refused the rest; the RBAC comes from manifests, as a component's would.
func TestServiceAccountKubeconfig(t *testing.T) {
	t.Parallel()
	cp := framework.Shared(t)
	ctx := context.Background()
	ns := framework.CreateNamespace(t, cp, "rbac")

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "serviceaccount.yaml"), `
apiVersion: v1
kind: ServiceAccount
metadata:
  name: reader
  namespace: `+ns+`
`)
	writeFile(t, filepath.Join(dir, "rbac", "role.yaml"), `
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: configmap-reader
  namespace: `+ns+`
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: reader
  namespace: `+ns+`
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: configmap-reader
subjects:
- kind: ServiceAccount
  name: reader
  namespace: `+ns+`
`)
	framework.ApplyManifests(t, cp, dir)

	cfg, err := clientcmd.BuildConfigFromFlags("", framework.ServiceAccountKubeconfig(t, cp, ns, "reader"))
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)

	if _, err := client.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("listing configmaps, which the Role grants: %v", err)
	}
	forbidden := map[string]func() error{
		"list secrets": func() error {
			_, err := client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
			return err
		},
		"create configmap": func() error {
			_, err := client.CoreV1().ConfigMaps(ns).Create(ctx,
				&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		},
		"list configmaps in kube-system": func() error {
			_, err := client.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{})
			return err
		},
		"list nodes": func() error {
			_, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			return err
		},
	}
	for name, call := range forbidden {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: got %v, want Forbidden", name, err)
		}
	}
}

// TestApplyManifestsCRD checks that a CRD applied with ApplyManifests is usable on return.
func TestApplyManifestsCRD(t *testing.T) {
	t.Parallel()
	cp := framework.Shared(t)
	ns := framework.CreateNamespace(t, cp, "crd")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "kustomization.yaml"), "resources: [crd.yaml]\n")
	writeFile(t, filepath.Join(dir, "crd.yaml"), `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.framework.test.cistern.csi.dev
spec:
  group: framework.test.cistern.csi.dev
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
`)
	framework.ApplyManifests(t, cp, dir)
	t.Cleanup(func() {
		framework.Kubectl(t, cp, "delete", "customresourcedefinition", "widgets.framework.test.cistern.csi.dev", "--wait=false")
	})
	framework.ApplyYAML(t, cp, `
apiVersion: framework.test.cistern.csi.dev/v1
kind: Widget
metadata:
  name: w
  namespace: `+ns+`
spec: {size: 3}
`)
	if out := framework.Kubectl(t, cp, "get", "widgets", "-n", ns, "-o", "name"); strings.TrimSpace(out) != "widget.framework.test.cistern.csi.dev/w" {
		t.Errorf("kubectl get widgets = %q", out)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
