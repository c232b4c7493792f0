package e2enode

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apimetav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// datasetRole is the role the STS stand-in hands the dataset's keys for.
const datasetRole = "arn:aws:iam::000000000000:role/dataset-reader"

// startSTS starts the STS stand-in for the control plane's ServiceAccount issuer. It reads the
// API server's OIDC discovery document and JWKS as an outside STS reads a cluster's issuer:
// anonymously, trusting only the API server's CA, allowed by the ClusterRoleBinding that
// self-hosted IRSA setups create. It hands out no role until one is added.
func startSTS(t *testing.T, cp *framework.ControlPlane) *testpeers.STS {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: apimetav1.ObjectMeta{Name: "service-account-issuer-discovery-public"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:service-account-issuer-discovery"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:unauthenticated"}},
	}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, apimetav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(rest.AnonymousClientConfig(cp.Config))
	if err != nil {
		t.Fatal(err)
	}
	return testpeers.StartSTSFor(t, testpeers.Discovery{URL: cp.URL, Client: hc}, consts.DefaultWebIdentityAudience, nil)
}

// testWebIdentity: a pod with no Secret, only its ServiceAccount, mounts the private dataset
// inline with web-identity credentials (kubelet hands NodePublishVolume the pod's token for the
// CSIDriver's tokenRequests audience, the driver exchanges it at the STS, which verifies it
// against the API server's issuer and trusts the ServiceAccount dataset-reader only); a pod of
// another ServiceAccount naming the same role is refused.
func testWebIdentity(t *testing.T, c *cluster, d *dataset) {
	ctx := context.Background()
	c.sts.AddRole(datasetRole, testpeers.Role{
		Trusts:    []string{"system:serviceaccount:" + c.ns + ":dataset-reader"},
		AccessKey: d.s3.AccessKey, SecretKey: d.s3.SecretKey,
	})
	for _, sa := range []string{"dataset-reader", "other-team"} {
		// Both name the role: other-team's author annotated their own ServiceAccount with it,
		// which the STS, trusting dataset-reader only, refuses (testWebIdentityClaim).
		obj := &corev1.ServiceAccount{ObjectMeta: apimetav1.ObjectMeta{Name: sa, Annotations: map[string]string{consts.AnnotationRoleARN: datasetRole}}}
		if _, err := c.cp.Client.CoreV1().ServiceAccounts(c.ns).Create(ctx, obj, apimetav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	attrs := d.attributes()
	attrs["size"] = "64Mi"
	attrs[consts.ParamCredentials] = consts.CredentialsWebIdentity
	attrs[consts.ParamRoleARN] = datasetRole
	pod := func(name, sa string) *corev1.Pod {
		p := checkerPod(c.checkerImage, c.resultsDir, name,
			[]corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: consts.DriverName, ReadOnly: ptr.To(true), VolumeAttributes: attrs,
			}}}},
			[]corev1.VolumeMount{{Name: "model", MountPath: "/model", ReadOnly: true}},
			"-dir", "/model", "-hash")
		p.Spec.ServiceAccountName = sa
		return p
	}

	checkWebIdentityPods(t, c, d, "web-identity", pod)
	testWebIdentityClaim(t, c, d)
}

// checkWebIdentityPods: a pod of dataset-reader called name reads every file byte-identical,
// with its token exchanged at the STS; a pod of other-team, name-other, is refused at its mount.
// Both are deleted at the end.
func checkWebIdentityPods(t *testing.T, c *cluster, d *dataset, name string, pod func(name, sa string) *corev1.Pod) {
	t.Helper()
	exchanges := c.sts.Exchanges()
	createPod(t, c.cp, c.ns, pod(name, "dataset-reader"))
	waitPodRunning(t, c.cp, c.ns, name)
	d.checkFiles(t, name, readResult(t, c.resultsDir, name).Dirs[0])
	if c.sts.Exchanges() <= exchanges {
		t.Errorf("%s: the STS exchanged no token for the pod (%d exchanges before, %d after)", name, exchanges, c.sts.Exchanges())
	}
	other := name + "-other"
	createPod(t, c.cp, c.ns, pod(other, "other-team"))
	waitFailedMount(t, c, other, "PermissionDenied")
	for _, n := range []string{name, other} {
		deletePodAndWait(t, c.cp, c.ns, n)
	}
}

// testWebIdentityClaim: a claim of a StorageClass with web-identity credentials whose role comes
// from the pod's ServiceAccount annotation (roleFrom=serviceAccount; the driver reads the
// ServiceAccount kubelet names). kubelet stages it with no pod token, so the driver stages it
// pending; the first publish, for a pod of dataset-reader, exchanges that pod's token and fills
// the volume: every file byte-identical. A pod of other-team using the same claim, whose
// ServiceAccount names the same role, is refused at its own publish by the STS.
func testWebIdentityClaim(t *testing.T, c *cluster, d *dataset) {
	ctx := context.Background()
	params := d.attributes()
	params[consts.ParamCredentials] = consts.CredentialsWebIdentity
	params[consts.ParamRoleFrom] = consts.RoleFromServiceAccount
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{ObjectMeta: apimetav1.ObjectMeta{Name: "cistern-web-identity"},
		Provisioner: consts.DriverName, Parameters: params, VolumeBindingMode: &wffc}
	if _, err := c.cp.Client.StorageV1().StorageClasses().Create(ctx, sc, apimetav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Create(ctx, pvc("web-identity", sc.Name, "64Mi"), apimetav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name, sa string) *corev1.Pod {
		p := checkerPod(c.checkerImage, c.resultsDir, name, []corev1.Volume{pvcVolume("data", "web-identity")},
			[]corev1.VolumeMount{{Name: "data", MountPath: "/data", ReadOnly: true}}, "-dir", "/data", "-hash")
		p.Spec.ServiceAccountName = sa
		return p
	}
	checkWebIdentityPods(t, c, d, "web-identity-claim", pod)
	if err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Delete(ctx, "web-identity", apimetav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	_ = c.cp.Client.StorageV1().StorageClasses().Delete(ctx, sc.Name, apimetav1.DeleteOptions{})
}
