package realnode

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/framework/kit"
)

// NodeCA signs kubelet's client certificate; kube-apiserver trusts it through --client-ca-file,
// so kubelet authenticates as system:node:<name> and the Node authorizer applies to it, as in
// a real cluster.
type NodeCA struct {
	CertFile string
	*kit.CA
}

// NewNodeCA makes a CA under dir for the node's certificates.
func NewNodeCA(t *testing.T, dir string) *NodeCA {
	t.Helper()
	ca := &NodeCA{CertFile: filepath.Join(dir, "node-ca.crt"), CA: kit.NewCA(t, "cistern-e2e-node-ca")}
	if err := os.WriteFile(ca.CertFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return ca
}

// servingCert writes a serving certificate for a node's kubelet at ip (and DNS name host) and
// its key into dir, and returns their paths.
func (ca *NodeCA) servingCert(t *testing.T, dir, name, host, ip string) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := ca.Issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: host},
		DNSNames:    []string{host},
		IPAddresses: []net.IP{net.ParseIP(ip)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return kit.WritePair(t, dir, name, certPEM, keyPEM)
}

// ClientCertFiles writes clientCert's certificate and key into dir and returns their paths.
func (ca *NodeCA) ClientCertFiles(t *testing.T, dir, name, user string, groups ...string) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := ca.clientCert(t, user, groups...)
	return kit.WritePair(t, dir, name, certPEM, keyPEM)
}

// clientCert returns a PEM certificate and key for user in groups.
func (ca *NodeCA) clientCert(t *testing.T, user string, groups ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	return ca.Issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// Kubelet is a running kubelet.
type Kubelet struct {
	RootDir string
	process *framework.Process
}

// kubeletConfig follows what is known to work on this machine: cgroup v1 with cgroupfs,
// oom_score_adj left alone, no eviction or image GC that a busy shared disk could trigger.
func kubeletConfig(rootDir, runtimeSocket, cgroupRoot string, port, healthzPort int32) *kubeletv1beta1.KubeletConfiguration {
	return &kubeletv1beta1.KubeletConfiguration{
		CgroupRoot:               cgroupRoot,
		TypeMeta:                 metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		ContainerRuntimeEndpoint: "unix://" + runtimeSocket,
		FailCgroupV1:             ptr.To(false),
		CgroupDriver:             "cgroupfs",
		OOMScoreAdj:              ptr.To[int32](0),
		FailSwapOn:               ptr.To(false),
		Address:                  "127.0.0.1",
		Port:                     port,
		ReadOnlyPort:             0,
		HealthzBindAddress:       "127.0.0.1",
		HealthzPort:              ptr.To(healthzPort),
		PodLogsDir:               filepath.Join(rootDir, "pod-logs"),
		// Nobody calls kubelet's API in these tests (no logs, no exec); refuse everyone.
		Authentication: kubeletv1beta1.KubeletAuthentication{
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(false)},
		},
		Authorization:                 kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow},
		EvictionHard:                  map[string]string{"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
		MergeDefaultEvictionSettings:  ptr.To(false),
		ImageGCHighThresholdPercent:   ptr.To[int32](100),
		ImageGCLowThresholdPercent:    ptr.To[int32](99),
		SyncFrequency:                 metav1.Duration{Duration: 10 * time.Second},
		NodeStatusUpdateFrequency:     metav1.Duration{Duration: 5 * time.Second},
		ResolverConfig:                ptr.To(""),
		MakeIPTablesUtilChains:        ptr.To(false),
		SerializeImagePulls:           ptr.To(false),
		LocalStorageCapacityIsolation: ptr.To(true),
	}
}

// StartKubelet starts kubelet as system:node:<name> with its root directory in rootDir.
// cgroupRoot, when set, is the cgroup under which kubelet puts its kubepods tree (see
// OwnCgroupRoot); empty: the root, as on a node.
func StartKubelet(t *testing.T, cp *framework.ControlPlane, ca *NodeCA, bin, nodeName, rootDir, runtimeSocket, cgroupRoot string) *Kubelet {
	t.Helper()
	return StartKubeletWith(t, cp, ca, bin, KubeletOptions{NodeName: nodeName, RootDir: rootDir, RuntimeSocket: runtimeSocket, CgroupRoot: cgroupRoot})
}

// KubeletOptions are a kubelet's node: its name, directories and runtime, and for a node in its
// own network namespace (netns_test.go) how it is started and reached.
type KubeletOptions struct {
	NodeName, RootDir, RuntimeSocket, CgroupRoot string
	// logName names the process and its log; "kubelet" when empty.
	LogName string
	// enter is the command prefix that runs kubelet in the node's namespaces.
	Enter []string
	// nodeIP, when set, is kubelet's --node-ip and where it serves its API, with a serving
	// certificate from the node CA, to clients with a certificate from that CA (the API server's
	// Kubelet client), authorized by the API server; unset: loopback, and nobody may call it.
	NodeIP string
	// server is the API server as the node reaches it, and serverName the name its
	// certificate is checked against; cp.URL when empty.
	Server, serverName string
	// ClusterDNS, when set, is the nameserver of the pods' resolv.conf (kubelet's clusterDNS,
	// with the cluster.local domain); unset, pods have none.
	ClusterDNS string
}

// StartKubeletWith starts kubelet as opts say.
func StartKubeletWith(t *testing.T, cp *framework.ControlPlane, ca *NodeCA, bin string, opts KubeletOptions) *Kubelet {
	t.Helper()
	if err := os.MkdirAll(opts.RootDir, 0o750); err != nil {
		t.Fatal(err)
	}
	confDir := t.TempDir()
	certPEM, keyPEM := ca.clientCert(t, "system:node:"+opts.NodeName, "system:nodes")
	kubeconfig := clientcmdapi.NewConfig()
	server := opts.Server
	if server == "" {
		server = cp.URL
	}
	kubeconfig.Clusters["cistern"] = &clientcmdapi.Cluster{Server: server, TLSServerName: opts.serverName, CertificateAuthorityData: cp.Config.CAData}
	kubeconfig.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kubeconfig.Contexts["cistern"] = &clientcmdapi.Context{Cluster: "cistern", AuthInfo: "kubelet"}
	kubeconfig.CurrentContext = "cistern"
	kubeconfigPath := filepath.Join(confDir, "kubelet.kubeconfig")
	if err := clientcmd.WriteToFile(*kubeconfig, kubeconfigPath); err != nil {
		t.Fatal(err)
	}

	ports, err := FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	cfg := kubeletConfig(opts.RootDir, opts.RuntimeSocket, opts.CgroupRoot, ports[0], ports[1])
	args := []string{}
	if opts.ClusterDNS != "" {
		cfg.ClusterDNS, cfg.ClusterDomain = []string{opts.ClusterDNS}, "cluster.local"
	}
	if opts.NodeIP != "" {
		// Its own address: the well-known port, as the API server dials nodes.
		cfg.Address, cfg.Port = opts.NodeIP, 10250
		cfg.TLSCertFile, cfg.TLSPrivateKeyFile = ca.servingCert(t, confDir, "kubelet", opts.NodeName, opts.NodeIP)
		cfg.Authentication = kubeletv1beta1.KubeletAuthentication{
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(true)},
			X509:      kubeletv1beta1.KubeletX509Authentication{ClientCAFile: ca.CertFile},
		}
		cfg.Authorization = kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook}
		args = append(args, "--node-ip="+opts.NodeIP)
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	configPath := filepath.Join(confDir, "kubelet.yaml")
	if err := os.WriteFile(configPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	name := opts.LogName
	if name == "" {
		name = "kubelet"
	}
	args = append(append(slices.Clone(opts.Enter), bin,
		"--config="+configPath,
		"--kubeconfig="+kubeconfigPath,
		"--root-dir="+opts.RootDir,
		"--cert-dir="+filepath.Join(opts.RootDir, "pki"),
		"--hostname-override="+opts.NodeName,
		"--v=2",
	), args...)
	p := framework.StartCommand(t, name, exec.Command(args[0], args[1:]...))
	return &Kubelet{RootDir: opts.RootDir, process: p}
}

// WaitNodeReady waits until kubelet has registered the Node and reports it Ready.
func WaitNodeReady(t *testing.T, cp *framework.ControlPlane, k *Kubelet, nodeName string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-k.process.Done():
			return false, ErrExited(k.process)
		default:
		}
		node, err := cp.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			last = "not registered"
			return false, nil
		}
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = string(c.Status) + ": " + c.Message
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("Node %s not Ready (%s): %v; kubelet log: %s", nodeName, last, err, k.process.LogPath)
	}
}

// Stop stops kubelet (SIGTERM, then SIGKILL): its node stops reporting, its pods run on without
// it. Safe to call more than once; the test's cleanup calls it too.
func (k *Kubelet) Stop() { k.process.Stop() }
