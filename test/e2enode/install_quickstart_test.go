package e2enode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/framework/realnode"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// The quick start of the README (deploy/quickstart), run as written on the install: `kubectl
// apply -k` of an overlay that only points its S3 server's image at the loopback registry (the
// image the project builds, which the kustomization names), then what the README has the user
// look at, the reader pod's log.

// What deploy/quickstart names.
const (
	quickstartNamespace = "cistern-quickstart"
	quickstartClass     = "cistern-quickstart"
	quickstartService   = "quickstart-s3"
	quickstartSecret    = "quickstart-s3"
	quickstartClaim     = "quickstart-data"
	quickstartReader    = "quickstart-reader"
	quickstartBucket    = "datasets"
	quickstartPrefix    = "quickstart/"
)

// quickstartFiles are the files the seed container of deploy/quickstart/s3-server.yaml writes.
var quickstartFiles = []string{"README.txt", "labels.csv", "train/0001.txt", "train/0002.txt"}

// sumLine is a line of sha256sum's output for a file under the reader's working directory.
var sumLine = regexp.MustCompile(`^([0-9a-f]{64})  \./(.+)$`)

// runQuickstart applies the quick start, checks that the reader pod's log lists every object the
// server holds with the object's sha256, then deletes it: nothing of it stays, the claim's volume
// and mount included, and nothing of the install goes.
func (in *install) runQuickstart(t *testing.T) {
	t.Helper()
	root, err := realnode.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(root, "deploy", "quickstart")
	// The image the kustomization names is the one the project builds (and make
	// kind-load-quickstart loads): the overlay only moves it to the registry.
	ref := in.bins.Images["versitygw"].Ref
	if out := framework.Kubectl(t, in.cp, "kustomize", base); !strings.Contains(out, "image: "+ref+"\n") {
		t.Fatalf("deploy/quickstart does not name the S3 server image the project builds, %s:\n%s", ref, out)
	}
	repo, _, _ := strings.Cut(ref, ":")
	dir := filepath.Join(in.dir, "quickstart-"+filepath.Base(filepath.Dir(t.Name())))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, base)
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\nimages:\n- name: %s\n  newName: %s/%s\n",
		rel, repo, in.registry, strings.TrimPrefix(repo, "localhost/"))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}

	mountsBefore := csiMounts(t)
	t.Logf("kubectl apply -k deploy/quickstart:\n%s", framework.Kubectl(t, in.cp, "apply", "-k", dir))
	deleted := false
	defer func() {
		if !deleted {
			kubectlOutput(in.cp, "delete", "--ignore-not-found", "--wait=true", "--timeout=3m", "-k", dir)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	svc, err := in.cp.Client.CoreV1().Services(quickstartNamespace).Get(ctx, quickstartService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The Service's ClusterIP, as kube-proxy would serve it; its name, as the cluster's DNS.
	endpoint := "http://" + serveService(t, in.cp, svc)
	in.checkQuickstartName(t, ctx, svc)

	reader := waitPodRunning(t, in.cp, quickstartNamespace, quickstartReader)
	in.podUIDs[string(reader.UID)] = true
	servers, err := in.cp.Client.CoreV1().Pods(quickstartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + quickstartService})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range servers.Items {
		in.podUIDs[string(p.UID)] = true
	}
	read := quickstartLog(t, in, reader)
	seeded := quickstartObjects(t, ctx, in, endpoint)
	if names := slices.Sorted(maps.Keys(seeded)); !slices.Equal(names, quickstartFiles) {
		t.Errorf("the server holds %v under s3://%s/%s, want the seed's %v", names, quickstartBucket, quickstartPrefix, quickstartFiles)
	}
	if !maps.Equal(read, seeded) {
		t.Errorf("the reader's log: files and sha256\n%v\nthe server's objects:\n%v", read, seeded)
	}

	claim, err := in.cp.Client.CoreV1().PersistentVolumeClaims(quickstartNamespace).Get(ctx, quickstartClaim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv := claim.Spec.VolumeName
	out := kubectlOutput(in.cp, "delete", "--wait=true", "--timeout=3m", "-k", dir)
	deleted = true
	t.Logf("kubectl delete -k deploy/quickstart:\n%s", out)
	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		_, nsErr := in.cp.Client.CoreV1().Namespaces().Get(ctx, quickstartNamespace, metav1.GetOptions{})
		_, scErr := in.cp.Client.StorageV1().StorageClasses().Get(ctx, quickstartClass, metav1.GetOptions{})
		_, pvErr := in.cp.Client.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		return apierrors.IsNotFound(nsErr) && apierrors.IsNotFound(scErr) && apierrors.IsNotFound(pvErr), nil
	})
	if err != nil {
		t.Errorf("left after kubectl delete -k deploy/quickstart (namespace %s, StorageClass %s, PersistentVolume %s): %v",
			quickstartNamespace, quickstartClass, pv, err)
	}
	if after := csiMounts(t); !slices.Equal(after, mountsBefore) {
		t.Errorf("CSI mounts before the quick start %v, after its deletion %v", mountsBefore, after)
	}
	// The install is untouched: its node pod still Ready, its namespace there.
	in.waitNodePodReady(t, "", 0)
}

// checkQuickstartName checks that the class's endpoint host, the Service's name, resolves to its
// ClusterIP through the nameserver the install's pods have.
func (in *install) checkQuickstartName(t *testing.T, ctx context.Context, svc *corev1.Service) {
	t.Helper()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(installClusterDNS, "53"))
	}}
	name := svc.Name + "." + svc.Namespace + "." + clusterDomain
	addrs, err := r.LookupHost(ctx, name)
	if err != nil || !slices.Equal(addrs, []string{svc.Spec.ClusterIP}) {
		t.Fatalf("%s resolves to %v (%v), want the Service's ClusterIP %s", name, addrs, err, svc.Spec.ClusterIP)
	}
}

// quickstartLog waits for the reader container's last line, the count, in its log (the file
// kubelet writes, as `kubectl logs` shows it; nobody may call kubelet's API here) and returns
// the files it read with their sha256.
func quickstartLog(t *testing.T, in *install, pod *corev1.Pod) map[string]string {
	t.Helper()
	path := filepath.Join(realnode.KubeletRootDir, "pod-logs",
		fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), pod.Spec.Containers[0].Name, "0.log")
	var lines []string
	err := pollInstall(time.Second, func(context.Context) (bool, error) {
		data, err := os.ReadFile(path)
		if err != nil {
			return false, nil
		}
		lines = lines[:0]
		for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			// CRI log lines: time, stream, tag, then the text.
			if f := strings.SplitN(l, " ", 4); len(f) == 4 && f[1] == "stdout" {
				lines = append(lines, f[3])
			}
		}
		return len(lines) > 0 && strings.HasPrefix(lines[len(lines)-1], "quickstart: "), nil
	})
	if err != nil {
		t.Fatalf("%s has no count line: %v\n%s\n%s", path, err, strings.Join(lines, "\n"), describe(in.cp, pod.Namespace, "Pod", pod.Name, nil))
	}
	t.Logf("kubectl logs -n %s %s:\n%s", pod.Namespace, pod.Name, strings.Join(lines, "\n"))
	sums := map[string]string{}
	for _, l := range lines[:len(lines)-1] {
		m := sumLine.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("not a sha256sum line in the reader's log: %q", l)
			continue
		}
		sums[m[2]] = m[1]
	}
	if want := fmt.Sprintf("quickstart: %d files read", len(sums)); lines[len(lines)-1] != want {
		t.Errorf("the reader's last line is %q, want %q", lines[len(lines)-1], want)
	}
	return sums
}

// quickstartObjects reads every object under the class's source from the server, with the
// credentials of the quick start's Secret, and returns their keys under the prefix with their
// sha256.
func quickstartObjects(t *testing.T, ctx context.Context, in *install, endpoint string) map[string]string {
	t.Helper()
	secret, err := in.cp.Client.CoreV1().Secrets(quickstartNamespace).Get(ctx, quickstartSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := &testpeers.S3{Endpoint: endpoint, AccessKey: string(secret.Data["accessKeyID"]), SecretKey: string(secret.Data["secretAccessKey"])}
	c := srv.NewClient(endpoint)
	sums := map[string]string{}
	p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: aws.String(quickstartBucket), Prefix: aws.String(quickstartPrefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("listing s3://%s/%s at %s: %v", quickstartBucket, quickstartPrefix, endpoint, err)
		}
		for _, o := range page.Contents {
			obj, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(quickstartBucket), Key: o.Key})
			if err != nil {
				t.Fatalf("GetObject %s: %v", *o.Key, err)
			}
			h := sha256.New()
			_, err = io.Copy(h, obj.Body)
			obj.Body.Close()
			if err != nil {
				t.Fatalf("reading %s: %v", *o.Key, err)
			}
			sums[strings.TrimPrefix(*o.Key, quickstartPrefix)] = hex.EncodeToString(h.Sum(nil))
		}
	}
	return sums
}
