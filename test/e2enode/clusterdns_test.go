package e2enode

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/framework/realnode"
)

// installClusterDNS is the nameserver kubelet gives the install's pods (its clusterDNS): an
// address of the Service range, held by the Service kube-system/kube-dns as on a cluster, so no
// other Service gets it.
const installClusterDNS = "10.0.0.10"

// clusterDomain is kubelet's clusterDomain when it has a clusterDNS.
const clusterDomain = "svc.cluster.local."

// serveClusterDNS answers, as a cluster's DNS does for Services, A queries for
// <service>.<namespace>.svc.cluster.local with the Service's ClusterIP, from this host and the
// pods (whose route to the Service range goes through the host); every other name does not
// exist. What the quick start's class names its S3 server by (deploy/quickstart), which the
// install would otherwise not resolve: kube-proxy and CoreDNS do not run here.
func serveClusterDNS(t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := cp.Client.CoreV1().Services("kube-system").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns"},
		Spec: corev1.ServiceSpec{ClusterIP: installClusterDNS, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	realnode.Run(t, "ip", "addr", "replace", installClusterDNS+"/32", "dev", "lo")
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "addr", "del", installClusterDNS+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Logf("cleanup: removing %s from lo: %v: %s", installClusterDNS, err, out)
		}
	})
	conn, err := net.ListenPacket("udp", net.JoinHostPort(installClusterDNS, "53"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, addr, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			if reply, err := answerDNS(buf[:n], func(name string) (net.IP, bool) { return serviceIP(cp, name) }); err == nil {
				_, _ = conn.WriteTo(reply, addr)
			}
		}
	}()
}

// answerDNS builds the reply to one query, the address of a name from lookup.
func answerDNS(query []byte, lookup func(name string) (net.IP, bool)) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	// Authoritative, recursion available: Go's resolver takes an empty answer of any other
	// server for a lame referral.
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	ip, found := lookup(q.Name.String())
	if !found {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if ip4 := ip.To4(); found && q.Type == dnsmessage.TypeA && ip4 != nil {
		var a dnsmessage.AResource
		copy(a.A[:], ip4)
		if err := b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, a); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// serviceIP is the ClusterIP of the Service a name of the cluster domain names.
func serviceIP(cp *framework.ControlPlane, name string) (net.IP, bool) {
	rest, ok := strings.CutSuffix(strings.ToLower(name), "."+clusterDomain)
	if !ok {
		return nil, false
	}
	svc, ns, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(ns, ".") {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := cp.Client.CoreV1().Services(ns).Get(ctx, svc, metav1.GetOptions{})
	if err != nil || s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil, false
	}
	ip := net.ParseIP(s.Spec.ClusterIP)
	return ip, ip != nil
}
