package framework

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// errPortInUse marks a start that failed because another process took a port we picked.
var errPortInUse = errors.New("port already in use")

const serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

func (cp *ControlPlane) run(name string, args ...string) (*Process, error) {
	p, err := startProcess(cp.LogDir, name, exec.Command(filepath.Join(cp.BinDir, name), args...))
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, p)
	return p, nil
}

func (cp *ControlPlane) startEtcd(ctx context.Context) (string, error) {
	ports, err := FreePorts(2)
	if err != nil {
		return "", err
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	p, err := cp.run("etcd",
		"--name=etcd",
		"--data-dir="+filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls="+clientURL,
		"--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=etcd="+peerURL,
		// The data is thrown away after the test; fsync only makes it slow.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	)
	if err != nil {
		return "", err
	}
	return clientURL, waitReady(ctx, p, http.DefaultClient, clientURL+"/health", "")
}

func (cp *ControlPlane) startAPIServer(ctx context.Context, etcdURL string, creds *credentials, extra []string) error {
	port, err := FreePort()
	if err != nil {
		return err
	}
	args := append([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir=" + filepath.Join(cp.Dir, "kube-apiserver"),
		"--tls-cert-file=" + creds.servingCert,
		"--tls-private-key-file=" + creds.servingKey,
		"--token-auth-file=" + creds.tokenFile,
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-account-key-file=" + creds.saPublicKey,
		"--service-account-signing-key-file=" + creds.saSigningKey,
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--allow-privileged=true",
		// 127.0.0.1 is not a valid endpoint for the kubernetes Service; nothing runs pods anyway.
		"--endpoint-reconciler-type=none",
	}, extra...)
	p, err := cp.run("kube-apiserver", args...)
	if err != nil {
		return err
	}
	cp.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
	cp.Config = &rest.Config{
		Host:            cp.URL,
		BearerToken:     creds.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: creds.caCert},
		// Tests create objects in bursts; client-go's default of 5 QPS would dominate their runtime.
		QPS:   100,
		Burst: 200,
	}
	cp.Kubeconfig = filepath.Join(cp.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(cp.Kubeconfig, cp.URL, creds.caCert, "admin", creds.adminToken); err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(creds.caCert)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return waitReady(ctx, p, client, cp.URL+"/readyz", creds.adminToken)
}

// componentArgs are the flags kube-controller-manager and kube-scheduler share: a kubeconfig for
// their own user, a free secure port on loopback (returned too), a certificate directory of their
// own, no leader election.
func (cp *ControlPlane) componentArgs(name string, caCert []byte, user, token string) (int, []string, error) {
	port, err := FreePort()
	if err != nil {
		return 0, nil, err
	}
	kubeconfig := filepath.Join(cp.Dir, name+".kubeconfig")
	if err := writeKubeconfig(kubeconfig, cp.URL, caCert, user, token); err != nil {
		return 0, nil, err
	}
	return port, []string{
		"--kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir=" + filepath.Join(cp.Dir, name),
		"--leader-elect=false",
	}, nil
}

func (cp *ControlPlane) startControllerManager(ctx context.Context, creds *credentials, controllers, extra []string) error {
	port, args, err := cp.componentArgs("kube-controller-manager", creds.caCert, "system:kube-controller-manager", creds.kcmToken)
	if err != nil {
		return err
	}
	args = append(append(args,
		"--controllers="+strings.Join(controllers, ","),
		// Each controller with its own ServiceAccount and RBAC role, as in a real cluster.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+creds.saSigningKey,
		"--root-ca-file="+creds.caFile,
	), extra...)
	p, err := cp.run("kube-controller-manager", args...)
	if err != nil {
		return err
	}
	if err := waitReady(ctx, p, insecureClient, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), ""); err != nil {
		return err
	}
	// Pods are refused until their namespace has a default ServiceAccount: wait for the first one.
	return waitFor(ctx, p, "ServiceAccount default/default", func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
}

func (cp *ControlPlane) startScheduler(ctx context.Context, creds *credentials, extra []string) error {
	port, args, err := cp.componentArgs("kube-scheduler", creds.caCert, "system:kube-scheduler", creds.schedulerToken)
	if err != nil {
		return err
	}
	p, err := cp.run("kube-scheduler", append(args, extra...)...)
	if err != nil {
		return err
	}
	return waitReady(ctx, p, insecureClient, fmt.Sprintf("https://127.0.0.1:%d/readyz", port), "")
}

// insecureClient probes the health endpoints of kube-controller-manager and kube-scheduler, which
// serve a self-signed certificate on loopback.
var insecureClient = &http.Client{Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback health probe
}}

// waitReady polls url until it answers 200 OK.
func waitReady(ctx context.Context, p *Process, client *http.Client, url, token string) error {
	return waitFor(ctx, p, url, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, nil // not listening yet
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// waitFor polls cond until it holds, the process exits, or ctx ends; errors carry the end of the
// process's log, which is nearly always what explains the failure.
func waitFor(ctx context.Context, p *Process, what string, cond func(context.Context) (bool, error)) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: waiting for %s: %w", p.Name, what, err)
		}
		select {
		case <-p.Done():
			log := Tail(p.LogPath, 20)
			err := fmt.Errorf("%s exited before %s was ready: %v; last lines of %s:\n%s", p.Name, what, p.Err(), p.LogPath, log)
			if strings.Contains(log, "address already in use") {
				err = fmt.Errorf("%w: %w", errPortInUse, err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("%s: %s not ready: %w; last lines of %s:\n%s", p.Name, what, ctx.Err(), p.LogPath, Tail(p.LogPath, 20))
		case <-tick.C:
		}
	}
}

// writeKubeconfig writes a kubeconfig with one cluster, user and context.
func writeKubeconfig(path, server string, caCert []byte, user, token string) error {
	return os.WriteFile(path, kubeconfigYAML(server, caCert, user, token), 0o600)
}
