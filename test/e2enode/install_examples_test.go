package e2enode

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework/realnode"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// The examples of deploy/csi/examples, run on the install. The suite applies the files as they
// are, copied into an overlay whose patches only point them at this machine's servers: the
// dataset class at an S3 server running as a pod (versitygw, behind a Service) and its Secret
// at that server's credentials, the notebook job at a git server on the host. Their images
// keep their names: the registry serves the notebook image and the controller's git image
// (alpine/git, its --git-image default) as the papermill and git stand-ins.

// installExamples are the example files applied. Not the VolumeManager: it stages a dataset
// on two nodes, and the install has one.
var installExamples = []string{
	"storageclass-fast.yaml", "pvc-fast.yaml", "leaderworkerset.yaml",
	"storageclass-dataset.yaml", "notebookvalidationjob.yaml",
}

const (
	// installGitImage is the workload-controller's --git-image default, which deploy/csi keeps.
	installGitImage = "alpine/git:2.49.1"

	// What storageclass-dataset.yaml names: its Secret, its class, and its source
	// s3://datasets/imagenet/ with include "train/**,labels.csv".
	exampleS3Secret      = "imagenet-s3"
	exampleS3Class       = "cistern-imagenet"
	exampleS3Bucket      = "datasets"
	exampleS3Prefix      = "imagenet/"
	exampleS3Claim       = "imagenet"
	s3Port               = 7070
	installS3Access      = "cistern-install"
	installS3Secret      = "cistern-install-secret"
	exampleNotebookInput = "rows,label\n1,tench\n2,goldfish\n"
)

// exampleNotebook reads notebookvalidationjob.yaml.
func exampleNotebook(t *testing.T) *v1alpha1.NotebookValidationJob {
	t.Helper()
	root, err := realnode.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "csi", "examples", "notebookvalidationjob.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var job v1alpha1.NotebookValidationJob
	if err := yaml.UnmarshalStrict(data, &job); err != nil {
		t.Fatalf("notebookvalidationjob.yaml: %v", err)
	}
	return &job
}

// runExamples starts the servers the examples need, applies them through the overlay, and
// checks each: the pool claim's pod runs, the LeaderWorkerSet's pods run on their claims, a
// claim of the dataset class holds the bucket's files byte for byte, the notebook job succeeds.
func (in *install) runExamples(t *testing.T, nb *v1alpha1.NotebookValidationJob) {
	t.Helper()
	s3, d := in.startS3(t)
	in.s3Endpoint, in.exampleData = s3, d
	git := realnode.StartGitServer(t, installPodSubnet, installPodGateway)
	nbDir := filepath.Dir(nb.Spec.Notebook.Path)
	gitURL := git.CreateRepo(t, "notebooks", map[string]string{
		nb.Spec.Notebook.Path: notebookJSON(t, "the example's notebook",
			"# the example's claim, where the job mounts it\nls /data\ndf /data",
			"# the clone, from the notebook's directory\ncat input.csv"),
		filepath.Join(nbDir, "input.csv"): exampleNotebookInput,
	})
	in.writeExamplesOverlay(t, s3, gitURL, nb.Name)
	out := framework.Kubectl(t, in.cp, "apply", "--server-side", "-k", in.examples)
	t.Logf("kubectl apply --server-side -k examples overlay:\n%s", out)

	// A claim of the dataset class, read by a checker pod. The class reads its Secret from the
	// claim's namespace, as the example says: a copy of the example's Secret goes there.
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: exampleS3Secret, Namespace: in.ns},
		StringData: map[string]string{"accessKeyID": installS3Access, "secretAccessKey": installS3Secret}}
	if _, err := in.cp.Client.CoreV1().Secrets(in.ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := in.cp.Client.CoreV1().PersistentVolumeClaims(in.ns).Create(ctx, pvc(exampleS3Claim, exampleS3Class, "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const reader = "imagenet-reader"
	createPod(t, in.cp, in.ns, in.checker(reader, exampleS3Claim, "-hash"))

	waitPodRunning(t, in.cp, "default", "scratch-user")
	var running int
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := in.cp.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "leaderworkerset.sigs.k8s.io/name=llm"})
		if err != nil {
			return false, nil
		}
		running = 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == 4, nil
	})
	if err != nil {
		t.Errorf("LeaderWorkerSet llm: %d of 4 pods running: %v", running, err)
	}

	waitPodRunning(t, in.cp, in.ns, reader)
	d.checkFiles(t, reader, readResult(t, in.resultsDir, reader).Dirs[0])

	in.checkExampleNotebook(t, nb, git)

	claims, err := in.cp.Client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bound := 0
	for _, c := range claims.Items {
		if c.Status.Phase == corev1.ClaimBound {
			bound++
		}
	}
	if bound != 5 {
		t.Errorf("%d of the examples' 5 claims are bound", bound)
	}
}

// checkExampleNotebook waits for the example's NotebookValidationJob to succeed, its pod having
// cloned from the git server over the pod network.
func (in *install) checkExampleNotebook(t *testing.T, nb *v1alpha1.NotebookValidationJob, git *realnode.GitServer) {
	t.Helper()
	crlog.SetLogger(klog.Background()) // the client logs through controller-runtime
	cl, err := client.New(in.cp.Config, client.Options{Scheme: workloads.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	job := waitJobDone(t, in.cp, cl, nb)
	if job.Status.Phase != v1alpha1.NotebookPhaseSucceeded {
		t.Fatalf("NotebookValidationJob %s is %s: %s\n%s", job.Name, job.Status.Phase, job.Status.Message, describe(in.cp, job.Namespace, "Pod", job.Status.PodName, nil))
	}
	t.Logf("NotebookValidationJob %s: %s", job.Name, job.Status.Message)
	pod, err := in.cp.Client.CoreV1().Pods(job.Namespace).Get(context.Background(), job.Status.PodName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, subnet, _ := net.ParseCIDR(installPodSubnet); pod.Spec.HostNetwork || !subnet.Contains(net.ParseIP(pod.Status.PodIP)) {
		t.Errorf("pod %s ran with IP %q, hostNetwork %v; want an address of the pod network %s", pod.Name, pod.Status.PodIP, pod.Spec.HostNetwork, installPodSubnet)
	}
	if git.PodRequests.Load() == 0 {
		t.Errorf("the git server saw no request from the pod network")
	}
}

// startS3 runs versitygw as a pod of the pod network behind a Service, reached at the Service's
// ClusterIP from the node plugin's pod (on the pod network too) and this host, and fills the
// example's bucket:
// files the class's include patterns take, and files they leave out. It returns the endpoint
// and the files a claim must hold.
func (in *install) startS3(t *testing.T) (string, *dataset) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	labels := map[string]string{"app.kubernetes.io/name": "versitygw"}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "versitygw", Labels: labels},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:            "versitygw",
				Image:           in.registry + "/" + strings.TrimPrefix(in.bins.Images["versitygw"].Ref, "localhost/"),
				ImagePullPolicy: corev1.PullIfNotPresent,
				Args: []string{"--port", fmt.Sprintf(":%d", s3Port), "--access", installS3Access, "--secret", installS3Secret,
					"--keep-alive", "posix", "/data"},
				Ports:          []corev1.ContainerPort{{Name: "s3", ContainerPort: s3Port}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("s3")}}, PeriodSeconds: 1},
				VolumeMounts:   []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
	createPod(t, in.cp, in.ns, pod)
	svc, err := in.cp.Client.CoreV1().Services(in.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "s3"},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{
			{Name: "s3", Port: s3Port, TargetPort: intstr.FromString("s3")},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveService(t, in.cp, svc)
	endpoint := "http://" + addr
	s3 := &testpeers.S3{Endpoint: endpoint, AccessKey: installS3Access, SecretKey: installS3Secret}
	s3.Client = s3.NewClient(endpoint)
	// Ready once the Service answers: the pod's readiness, its endpoint, the relay.
	var lastErr error
	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		_, lastErr = s3.Client.ListBuckets(ctx, nil)
		return lastErr == nil, nil
	})
	if err != nil {
		t.Fatalf("the S3 Service %s does not answer: %v\n%s", endpoint, lastErr, describe(in.cp, in.ns, "Pod", pod.Name, nil))
	}
	s3.Bucket(t, exampleS3Bucket)
	d := &dataset{s3: s3, source: "s3://" + exampleS3Bucket + "/" + exampleS3Prefix, files: map[string]string{}}
	for key, size := range map[string]int{
		"train/n01440764/n01440764_10026.JPEG": 1<<20 + 311,
		"train/n01440764/n01440764_10027.JPEG": 96 << 10,
		"train/n01443537/n01443537_10007.JPEG": 2 << 20,
		"labels.csv":                           4 << 10,
		"val/ILSVRC2012_val_00000001.JPEG":     64 << 10, // left out by include
		"README.txt":                           1 << 10,  // left out by include
	} {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		s3.Put(t, exampleS3Bucket, exampleS3Prefix+key, data)
		if strings.HasPrefix(key, "train/") || key == "labels.csv" {
			sum := sha256.Sum256(data)
			d.files[key] = hex.EncodeToString(sum[:])
		}
	}
	return endpoint, d
}

// writeExamplesOverlay copies the example files unchanged into the examples overlay, whose
// patches set the dataset class's endpoint, its Secret's credentials and the notebook job's
// repository URL; nothing else.
func (in *install) writeExamplesOverlay(t *testing.T, s3Endpoint, gitURL, job string) {
	t.Helper()
	root, err := realnode.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	in.examples = filepath.Join(in.dir, "examples")
	if err := os.MkdirAll(in.examples, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range installExamples {
		data, err := os.ReadFile(filepath.Join(root, "deploy", "csi", "examples", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(in.examples, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
patches:
- patch: |-
    apiVersion: v1
    kind: Secret
    metadata: {name: %s, namespace: default}
    stringData: {accessKeyID: %s, secretAccessKey: %s}
- patch: |-
    apiVersion: storage.k8s.io/v1
    kind: StorageClass
    metadata: {name: %s}
    parameters: {endpoint: %q}
- patch: |-
    apiVersion: workloads.cistern.dev/v1alpha1
    kind: NotebookValidationJob
    metadata: {name: %s, namespace: default}
    spec: {notebook: {git: {url: %q}}}
`, strings.Join(installExamples, "\n- "), exampleS3Secret, installS3Access, installS3Secret, exampleS3Class, s3Endpoint, job, gitURL)
	if err := os.WriteFile(filepath.Join(in.examples, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
}

// deleteExamples deletes the examples' objects, the claims the LeaderWorkerSet's templates left,
// and the pods that used them (the notebook job's).
func (in *install) deleteExamples(t *testing.T) {
	t.Helper()
	if in.examples != "" {
		// Deleting the examples deletes nothing of the install: the node plugins still release
		// the examples' volumes below (TestKustomizationsBuild checks the two share no object).
		kubectlOutput(in.cp, "delete", "--ignore-not-found", "--wait=true", "--timeout=3m", "-k", in.examples)
	}
	kubectlOutput(in.cp, "delete", "pod", "--all", "-n", "default", "--wait=true", "--timeout=3m")
	kubectlOutput(in.cp, "delete", "pvc", "--all", "-n", "default", "--wait=true", "--timeout=3m")
}
