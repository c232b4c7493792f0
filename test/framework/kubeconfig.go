package framework

import (
	"context"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// serviceAccountTokenTTL outlives any test; the token is bound to the ServiceAccount's UID.
const serviceAccountTokenTTL = 24 * 60 * 60

func kubeconfigYAML(server string, caCert []byte, user, token string) []byte {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cistern-test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caCert}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["cistern-test"] = &clientcmdapi.Context{Cluster: "cistern-test", AuthInfo: user}
	cfg.CurrentContext = "cistern-test"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		panic(err) // only fails for values that cannot be marshalled; ours always can
	}
	return data
}

// ServiceAccountConfig returns a client config authenticated as the ServiceAccount namespace/sa,
// with a token from the TokenRequest API, so that a component runs with the RBAC its manifests
// grant rather than as admin. The ServiceAccount must exist (e.g. applied from deploy/csi).
func ServiceAccountConfig(t TB, cp *ControlPlane, namespace, sa string) *rest.Config {
	t.Helper()
	return tokenConfig(t, cp, namespace, sa, nil)
}

// PodServiceAccountConfig is ServiceAccountConfig with a token bound to pod, as kubelet projects
// it into the pod's containers: once the pod is scheduled, the API server names its node in the
// token (the `authentication.kubernetes.io/node-name` extra that policies may check).
func PodServiceAccountConfig(t TB, cp *ControlPlane, pod *corev1.Pod) *rest.Config {
	t.Helper()
	return tokenConfig(t, cp, pod.Namespace, pod.Spec.ServiceAccountName, &authenticationv1.BoundObjectReference{
		Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
}

func tokenConfig(t TB, cp *ControlPlane, namespace, sa string, bound *authenticationv1.BoundObjectReference) *rest.Config {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	tr, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](serviceAccountTokenTTL), BoundObjectRef: bound},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for ServiceAccount %s/%s: %v", namespace, sa, err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg
}

// PodServiceAccountToken returns a token of pod's ServiceAccount for audiences, bound to pod, as
// a projected serviceAccountToken volume gives the pod's containers.
func PodServiceAccountToken(t TB, cp *ControlPlane, pod *corev1.Pod, audiences ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	tr, err := cp.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: ptr.To[int64](serviceAccountTokenTTL),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return tr.Status.Token
}

// ServiceAccountKubeconfig writes a kubeconfig for the ServiceAccount namespace/sa (see
// ServiceAccountConfig) and returns its path, for a component started with --kubeconfig.
func ServiceAccountKubeconfig(t TB, cp *ControlPlane, namespace, sa string) string {
	t.Helper()
	return writeTokenKubeconfig(t, cp, namespace, sa, ServiceAccountConfig(t, cp, namespace, sa))
}

// PodServiceAccountKubeconfig writes a kubeconfig with PodServiceAccountConfig's token.
func PodServiceAccountKubeconfig(t TB, cp *ControlPlane, pod *corev1.Pod) string {
	t.Helper()
	return writeTokenKubeconfig(t, cp, pod.Namespace, pod.Spec.ServiceAccountName, PodServiceAccountConfig(t, cp, pod))
}

func writeTokenKubeconfig(t TB, cp *ControlPlane, namespace, sa string, cfg *rest.Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), namespace+"-"+sa+".kubeconfig")
	user := "system:serviceaccount:" + namespace + ":" + sa
	if err := os.WriteFile(path, kubeconfigYAML(cp.URL, cp.caCert, user, cfg.BearerToken), 0o600); err != nil {
		t.Fatalf("writing kubeconfig: %v", err)
	}
	return path
}
