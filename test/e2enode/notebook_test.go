package e2enode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/test/framework/realnode"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook"
	"github.com/cistern-csi/cistern/test/framework"
)

// The notebook scenarios run NotebookValidationJobs end to end: the workload-controller builds
// the pod, the git stand-in (hack/images/git) clones the test's repository over the pod network,
// and the papermill stand-in (hack/images/papermill) runs the notebook's statements in the
// user's volumes. The executed notebook lives in an emptyDir that kubelet removes once the pod
// ends, so the notebook leaves its findings on its claim, and a checker pod reads them back;
// the output scenario keeps it through write-back (spec.output) and reads it from versitygw.

const (
	notebookClaim     = "notebook-work"
	notebookConfigMap = "notebook-settings"
	notebookGreeting  = "hello from a ConfigMap\n"
	notebookInput     = "input data from the repository\n"
	notebookFailure   = "the model answered 41, expected 42"
)

// notebookJSON is an nbformat 4 notebook of a markdown cell and one code cell per source.
func notebookJSON(t *testing.T, title string, sources ...string) string {
	t.Helper()
	cells := []map[string]any{{"cell_type": "markdown", "metadata": map[string]any{}, "source": "# " + title}}
	for _, src := range sources {
		cells = append(cells, map[string]any{"cell_type": "code", "metadata": map[string]any{},
			"execution_count": nil, "outputs": []any{}, "source": src})
	}
	data, err := json.Marshal(map[string]any{"cells": cells, "nbformat": 4, "nbformat_minor": 5,
		"metadata": map[string]any{"kernelspec": map[string]any{"name": "python3", "language": "python"}}})
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// notebookRepo is the repository the jobs clone: one notebook per scenario, and a file the
// first one reads relative to its working directory.
func notebookRepo(t *testing.T) map[string]string {
	return map[string]string{
		"notebooks/input.txt": notebookInput,
		"notebooks/volumes.ipynb": notebookJSON(t, "every volume where the job mounts it",
			"# the clone, from the notebook's directory\ncat input.txt > /mnt/work/repository.txt",
			"cat /etc/notebook-settings/greeting.txt > /mnt/work/configmap.txt",
			"sha256 /mnt/model > /mnt/work/dataset.sha256",
			"df /mnt/work > /mnt/work/df.txt"),
		"notebooks/fail.ipynb":    notebookJSON(t, "a failing cell", "print starting", "fail "+notebookFailure, "print unreachable"),
		"notebooks/timeout.ipynb": notebookJSON(t, "never ends", "sleep 10m"),
	}
}

func newNotebookJob(ns, name, url, ref, path, image string) *v1alpha1.NotebookValidationJob {
	return &v1alpha1.NotebookValidationJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.NotebookValidationJobSpec{
			Notebook: v1alpha1.NotebookSource{Git: v1alpha1.GitSource{URL: url, Ref: ref}, Path: path},
			// The papermill image runs as user 1000, so kubelet gives the volumes its group
			// (Cistern's CSIDriver has fsGroupPolicy File).
			PodConfig: v1alpha1.PodConfig{ContainerImage: image, SecurityContext: &corev1.PodSecurityContext{FSGroup: ptr.To[int64](1000)}},
			Timeout:   &metav1.Duration{Duration: 3 * time.Minute},
		},
	}
}

func testNotebooks(t *testing.T, c *cluster, d *dataset) {
	ctx := context.Background()
	cl, err := client.New(c.cp.Config, client.Options{Scheme: workloads.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	git := realnode.StartGitServer(t, realnode.PodSubnet, realnode.PodGateway)
	url := git.CreateRepo(t, "notebooks", notebookRepo(t), "v1")
	image := c.bins.Images["papermill"].Ref

	settings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: notebookConfigMap},
		Data: map[string]string{"greeting.txt": notebookGreeting}}
	if _, err := c.cp.Client.CoreV1().ConfigMaps(c.ns).Create(ctx, settings, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Create(ctx, pvc(notebookClaim, c.storageClass, "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A claim of the pool class, a ConfigMap and an inline dataset volume, each where asked.
	volumes := newNotebookJob(c.ns, "volumes", url, "main", "notebooks/volumes.ipynb", image)
	model := d.attributes()
	model["size"] = "64Mi"
	volumes.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{
		{Name: "work", PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: notebookClaim}},
		{Name: "settings", ConfigMap: &v1alpha1.ConfigMapVolumeSource{Name: notebookConfigMap}},
		{Name: "model", CSI: &v1alpha1.CSIVolumeSource{Driver: consts.DriverName, ReadOnly: ptr.To(true),
			VolumeAttributes: model, NodePublishSecretRef: &corev1.LocalObjectReference{Name: datasetSecret}}},
	}
	volumes.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{
		{Name: "work", MountPath: "/mnt/work"},
		{Name: "settings", MountPath: "/etc/notebook-settings", ReadOnly: true},
		{Name: "model", MountPath: "/mnt/model", ReadOnly: true},
	}
	// A tag as the ref, so the clone resolves one.
	failing := newNotebookJob(c.ns, "failing", url, "v1", "notebooks/fail.ipynb", image)
	timeout := newNotebookJob(c.ns, "timeout", url, "", "notebooks/timeout.ipynb", image)
	timeout.Spec.Timeout = &metav1.Duration{Duration: 20 * time.Second}
	badRef := newNotebookJob(c.ns, "bad-ref", url, "no-such-branch", "notebooks/fail.ipynb", image)

	createJobs(t, cl, volumes, failing, timeout, badRef)

	t.Run("volumes", func(t *testing.T) {
		job := waitJobDone(t, c.cp, cl, volumes)
		if job.Status.Phase != v1alpha1.NotebookPhaseSucceeded {
			t.Fatalf("job %s is %s: %s\n%s", job.Name, job.Status.Phase, job.Status.Message, describe(c.cp, c.ns, "Pod", notebook.PodName(job), nil))
		}
		pod, err := c.cp.Client.CoreV1().Pods(c.ns).Get(ctx, job.Status.PodName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, subnet, _ := net.ParseCIDR(realnode.PodSubnet); pod.Spec.HostNetwork || !subnet.Contains(net.ParseIP(pod.Status.PodIP)) {
			t.Errorf("pod %s ran with IP %q, hostNetwork %v; want an address of the pod network %s", pod.Name, pod.Status.PodIP, pod.Spec.HostNetwork, realnode.PodSubnet)
		}
		if git.PodRequests.Load() == 0 {
			t.Errorf("the git server saw no request from the pod network")
		}
		// kubelet tears the volumes of an ended pod down before the pod is deleted.
		waitNoPodMounts(t, c, pod.UID)
		checkNotebookFindings(t, c, d)
		deletePodAndWait(t, c.cp, c.ns, pod.Name)
	})

	t.Run("failing-cell", func(t *testing.T) {
		job := waitJobDone(t, c.cp, cl, failing)
		complete := meta.FindStatusCondition(job.Status.Conditions, v1alpha1.NotebookConditionComplete)
		if job.Status.Phase != v1alpha1.NotebookPhaseFailed || complete == nil || complete.Reason != v1alpha1.ReasonFailed {
			t.Fatalf("job %s: phase %s, Complete condition %+v, want Failed with reason %s", job.Name, job.Status.Phase, complete, v1alpha1.ReasonFailed)
		}
		// The message names the container and carries papermill's error from the log's tail.
		for _, want := range []string{
			"container notebook exited with code 1",
			`Exception encountered at "In [2]"`,
			"NotebookFailure: " + notebookFailure,
		} {
			if !strings.Contains(job.Status.Message, want) {
				t.Errorf("job message %q lacks %q", job.Status.Message, want)
			}
		}
		t.Logf("failed job's message: %q", job.Status.Message)
		deletePodAndWait(t, c.cp, c.ns, notebook.PodName(job))
	})

	t.Run("clone-failure", func(t *testing.T) {
		job := waitJobDone(t, c.cp, cl, badRef)
		if job.Status.Phase != v1alpha1.NotebookPhaseFailed {
			t.Fatalf("job %s is %s: %s", job.Name, job.Status.Phase, job.Status.Message)
		}
		for _, want := range []string{
			"container git-clone exited with code 128",
			"fatal: Remote branch no-such-branch not found in upstream origin",
		} {
			if !strings.Contains(job.Status.Message, want) {
				t.Errorf("job message %q lacks %q", job.Status.Message, want)
			}
		}
		deletePodAndWait(t, c.cp, c.ns, notebook.PodName(job))
	})

	t.Run("timeout", func(t *testing.T) {
		job := waitJobDone(t, c.cp, cl, timeout)
		complete := meta.FindStatusCondition(job.Status.Conditions, v1alpha1.NotebookConditionComplete)
		if job.Status.Phase != v1alpha1.NotebookPhaseFailed || complete == nil || complete.Reason != v1alpha1.ReasonTimedOut {
			t.Fatalf("job %s: phase %s, Complete condition %+v, want Failed with reason %s", job.Name, job.Status.Phase, complete, v1alpha1.ReasonTimedOut)
		}
		t.Logf("timed-out job's message: %s", job.Status.Message)
		deletePodAndWait(t, c.cp, c.ns, notebook.PodName(job))
	})

	t.Run("private-repository-golden", func(t *testing.T) { testPrivateGolden(t, c, cl, git) })
	t.Run("restricted-sha-timestamps", func(t *testing.T) { testRestrictedTimestamps(t, c, cl, git) })
	t.Run("output", func(t *testing.T) { testNotebookOutput(t, c, cl, git, d) })

	if err := c.cp.Client.CoreV1().PersistentVolumeClaims(c.ns).Delete(ctx, notebookClaim, metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	if err := c.cp.Client.CoreV1().ConfigMaps(c.ns).Delete(ctx, notebookConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
}

// checkNotebookFindings reads what the notebook left on its claim with a checker pod and compares
// it with what each volume holds.
func checkNotebookFindings(t *testing.T, c *cluster, d *dataset) {
	t.Helper()
	const reader = "notebook-findings"
	createPod(t, c.cp, c.ns, checkerPod(c.checkerImage, c.resultsDir, reader,
		[]corev1.Volume{pvcVolume("work", notebookClaim)},
		[]corev1.VolumeMount{{Name: "work", MountPath: "/data"}},
		"-dir", "/data", "-read"))
	defer deletePodAndWait(t, c.cp, c.ns, reader)
	dr := readResult(t, c.resultsDir, reader).Dirs[0]
	if dr.ReadError != "" {
		t.Errorf("reading the claim: %s", dr.ReadError)
	}
	found := dr.Contents
	if got := found["repository.txt"]; got != notebookInput {
		t.Errorf("the notebook read %q from input.txt in its working directory, want the repository's %q", got, notebookInput)
	}
	if got := found["configmap.txt"]; got != notebookGreeting {
		t.Errorf("the notebook read %q from the ConfigMap at /etc/notebook-settings, want %q", got, notebookGreeting)
	}
	var want strings.Builder
	for _, path := range slices.Sorted(maps.Keys(d.files)) {
		fmt.Fprintf(&want, "%s  %s\n", d.files[path], path)
	}
	if got := found["dataset.sha256"]; got != want.String() {
		t.Errorf("the notebook saw a dataset at /mnt/model that differs from the source:\n got\n%s want\n%s", got, want.String())
	}
	// The claim's own filesystem, not the container's root: about the requested 64 MiB.
	var total, free uint64
	if _, err := fmt.Sscanf(found["df.txt"], "df /mnt/work total=%d free=%d", &total, &free); err != nil {
		t.Errorf("df.txt %q: %v", found["df.txt"], err)
	} else if total > 64<<20 || total < 32<<20 {
		t.Errorf("the notebook saw a %d-byte filesystem at /mnt/work for a 64 MiB claim", total)
	}
}

// waitJobDone waits for the job to reach Succeeded or Failed.
func waitJobDone(t *testing.T, cp *framework.ControlPlane, cl client.Client, j *v1alpha1.NotebookValidationJob) *v1alpha1.NotebookValidationJob {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	var job v1alpha1.NotebookValidationJob
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := cl.Get(ctx, types.NamespacedName{Namespace: j.Namespace, Name: j.Name}, &job); err != nil {
			return false, nil
		}
		return job.Status.Phase == v1alpha1.NotebookPhaseSucceeded || job.Status.Phase == v1alpha1.NotebookPhaseFailed, nil
	})
	if err != nil {
		pod, perr := cp.Client.CoreV1().Pods(j.Namespace).Get(context.Background(), notebook.PodName(j), metav1.GetOptions{})
		if perr != nil {
			pod = nil
		}
		t.Fatalf("NotebookValidationJob %s did not finish: %v; phase %q: %s\npod: %s", j.Name, err, job.Status.Phase, job.Status.Message,
			describe(cp, j.Namespace, "Pod", notebook.PodName(j), pod))
	}
	return &job
}

// waitNoPodMounts waits until no CSI mount of the pod is left in kubelet's directory.
func waitNoPodMounts(t *testing.T, c *cluster, uid types.UID) {
	t.Helper()
	var left []string
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		left = left[:0]
		for _, mp := range volumeMounts(t, c) {
			if strings.Contains(mp, "/pods/"+string(uid)+"/") {
				left = append(left, mp)
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Errorf("the ended pod's volumes are still mounted: %v", left)
	}
}

// The private repository's credentials: a kubernetes.io/basic-auth Secret with a token.
const (
	privateUser  = "notebook-reader"
	privateToken = "e2e-token-7c1d93"
)

// goldenJSON is an executed notebook as the golden one: a markdown cell, then one code cell per
// stdout text.
func goldenJSON(t *testing.T, stdouts ...string) string {
	t.Helper()
	cells := []map[string]any{{"cell_type": "markdown", "metadata": map[string]any{}, "source": "# golden"}}
	for i, out := range stdouts {
		cells = append(cells, map[string]any{"cell_type": "code", "metadata": map[string]any{}, "execution_count": i + 1,
			"source": "", "outputs": []any{map[string]any{"output_type": "stream", "name": "stdout", "text": out}}})
	}
	data, err := json.Marshal(map[string]any{"cells": cells, "nbformat": 4, "nbformat_minor": 5, "metadata": map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// testPrivateGolden: a repository the git server serves only with basic auth, cloned with a
// credentials Secret, and the executed notebook compared with golden notebooks: one within the
// tolerance (Succeeded), one whose first code cell is off (Failed, GoldenMismatch, naming the
// cell); without the Secret the clone is refused.
func testPrivateGolden(t *testing.T, c *cluster, cl client.Client, git *realnode.GitServer) {
	ctx := context.Background()
	url := git.CreateRepo(t, "private", map[string]string{
		"notebooks/report.ipynb":    notebookJSON(t, "report", "print accuracy 0.9120 loss 12.5", "print done"),
		"golden/report.ipynb":       goldenJSON(t, "accuracy 0.9125 loss 12.51\n", "done\n"),
		"golden/report-wrong.ipynb": goldenJSON(t, "accuracy 0.9500 loss 12.5\n", "done\n"),
	})
	git.Protect("private", privateUser, privateToken)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "git-creds"}, Type: corev1.SecretTypeBasicAuth,
		StringData: map[string]string{corev1.BasicAuthUsernameKey: privateUser, corev1.BasicAuthPasswordKey: privateToken}}
	if _, err := c.cp.Client.CoreV1().Secrets(c.ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	image := c.bins.Images["papermill"].Ref
	job := func(name, golden string, creds bool) *v1alpha1.NotebookValidationJob {
		j := newNotebookJob(c.ns, name, url, "main", "notebooks/report.ipynb", image)
		if creds {
			j.Spec.Notebook.Git.CredentialsSecret = secret.Name
		}
		j.Spec.GoldenNotebook = &v1alpha1.GoldenNotebook{Path: golden, NumericTolerance: "1e-3"}
		return j
	}
	matching := job("golden-match", "golden/report.ipynb", true)
	mismatch := job("golden-mismatch", "golden/report-wrong.ipynb", true)
	anonymous := job("golden-anonymous", "golden/report.ipynb", false)
	t.Cleanup(func() {
		_ = c.cp.Client.CoreV1().Secrets(c.ns).Delete(context.Background(), secret.Name, metav1.DeleteOptions{})
	})
	jobs := createJobs(t, cl, matching, mismatch, anonymous) // deleted before the Secret

	var messages []string
	got := waitJobDone(t, c.cp, cl, matching)
	messages = append(messages, got.Status.Message)
	if got.Status.Phase != v1alpha1.NotebookPhaseSucceeded || !strings.Contains(got.Status.Message, "match the golden notebook") {
		t.Errorf("job %s is %s: %s\n%s", got.Name, got.Status.Phase, got.Status.Message, describe(c.cp, c.ns, "Pod", notebook.PodName(got), nil))
	}
	got = waitJobDone(t, c.cp, cl, mismatch)
	messages = append(messages, got.Status.Message)
	complete := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionComplete)
	if got.Status.Phase != v1alpha1.NotebookPhaseFailed || complete == nil || complete.Reason != v1alpha1.ReasonGoldenMismatch ||
		!strings.Contains(got.Status.Message, `cell 1: stream stdout differs: got "accuracy 0.9120 loss 12.5\n", golden "accuracy 0.9500 loss 12.5\n"`) {
		t.Errorf("job %s: phase %s, condition %+v, message %q", got.Name, got.Status.Phase, complete, got.Status.Message)
	}
	t.Logf("golden mismatch: %s", got.Status.Message)
	got = waitJobDone(t, c.cp, cl, anonymous)
	messages = append(messages, got.Status.Message)
	if got.Status.Phase != v1alpha1.NotebookPhaseFailed || !strings.Contains(got.Status.Message, "container git-clone exited with code 128") {
		t.Errorf("clone without credentials: %s: %s", got.Status.Phase, got.Status.Message)
	}
	if git.Refused.Load() == 0 {
		t.Error("the git server refused nothing: the repository was not private")
	}
	for _, m := range messages {
		if strings.Contains(m, privateToken) {
			t.Errorf("a job's message shows the token: %q", m)
		}
	}
	for _, j := range jobs {
		deletePodAndWait(t, c.cp, c.ns, notebook.PodName(j))
	}
}

// createJobs creates the NotebookValidationJobs and deletes them when the test ends.
func createJobs(t *testing.T, cl client.Client, jobs ...*v1alpha1.NotebookValidationJob) []*v1alpha1.NotebookValidationJob {
	t.Helper()
	for _, j := range jobs {
		if err := cl.Create(context.Background(), j); err != nil {
			t.Fatalf("creating NotebookValidationJob %s: %v", j.Name, err)
		}
	}
	t.Cleanup(func() {
		for _, j := range jobs {
			_ = cl.Delete(context.Background(), j)
		}
	})
	return jobs
}

// testNotebookOutput: a job keeps its executed notebook through a writable dataset volume whose
// write-back uploads it to versitygw once the pod has ended; the object is the file the pod
// wrote (its SHA-256, taken in the pod, is in the status) and holds the run's outputs, and the
// status has each code cell's result against the golden notebook.
func testNotebookOutput(t *testing.T, c *cluster, cl client.Client, git *realnode.GitServer, d *dataset) {
	const bucket = "notebook-outputs"
	d.s3.Bucket(t, bucket)
	url := git.CreateRepo(t, "kept", map[string]string{
		"notebooks/kept.ipynb": notebookJSON(t, "kept", "print accuracy 0.9120", "sha256 /mnt/model/config.json", "print done"),
		"golden/kept.ipynb":    goldenJSON(t, "accuracy 0.9125\n", d.files["config.json"]+"  .\n", "finished\n"),
	})
	job := newNotebookJob(c.ns, "kept", url, "main", "notebooks/kept.ipynb", c.bins.Images["papermill"].Ref)
	job.Spec.GoldenNotebook = &v1alpha1.GoldenNotebook{Path: "golden/kept.ipynb", NumericTolerance: "1e-3"}
	attrs := d.attributes()
	attrs["size"] = "64Mi"
	job.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "model", CSI: &v1alpha1.CSIVolumeSource{Driver: consts.DriverName,
		VolumeAttributes: attrs, NodePublishSecretRef: &corev1.LocalObjectReference{Name: datasetSecret}}}}
	job.Spec.PodConfig.VolumeMounts = []v1alpha1.VolumeMount{{Name: "model", MountPath: "/mnt/model"}}
	job.Spec.Output = &v1alpha1.NotebookOutput{Volume: "model", Target: "s3://" + bucket + "/runs"}
	createJobs(t, cl, job)

	got := waitJobDone(t, c.cp, cl, job)
	complete := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.NotebookConditionComplete)
	if got.Status.Phase != v1alpha1.NotebookPhaseFailed || complete == nil || complete.Reason != v1alpha1.ReasonGoldenMismatch {
		t.Fatalf("job %s: phase %s, condition %+v, message %q\n%s", got.Name, got.Status.Phase, complete, got.Status.Message,
			describe(c.cp, c.ns, "Pod", notebook.PodName(got), nil))
	}
	want := []v1alpha1.CellResult{{Index: 1, Result: v1alpha1.CellPassed}, {Index: 2, Result: v1alpha1.CellPassed},
		{Index: 3, Result: v1alpha1.CellFailed, Reason: `stream stdout differs: got "done\n", golden "finished\n" (numeric tolerance 0.001)`}}
	if fmt.Sprint(got.Status.Cells) != fmt.Sprint(want) {
		t.Errorf("cells %+v\nwant  %+v", got.Status.Cells, want)
	}
	if !strings.Contains(got.Status.Message, "cell 3: stream stdout differs") || strings.Contains(got.Status.Message, "cistern-results") {
		t.Errorf("message %q", got.Status.Message)
	}
	key := "runs/" + got.Status.PodName + "/kept.output.ipynb"
	if got.Status.OutputURL != "s3://"+bucket+"/"+key || len(got.Status.OutputSHA256) != 64 {
		t.Fatalf("outputURL %q, outputSHA256 %q", got.Status.OutputURL, got.Status.OutputSHA256)
	}

	// The node uploads once kubelet lets the volume go, after the pod ended.
	var body []byte
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		out, err := d.s3.Client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
		if err != nil {
			return false, nil
		}
		defer out.Body.Close()
		body, err = io.ReadAll(out.Body)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the executed notebook never reached s3://%s/%s: %v", bucket, key, err)
	}
	sum := sha256.Sum256(body)
	if hex.EncodeToString(sum[:]) != got.Status.OutputSHA256 {
		t.Errorf("the object (%d bytes, sha256 %x) is not the notebook the pod wrote (sha256 %s)", len(body), sum, got.Status.OutputSHA256)
	}
	for _, out := range []string{"accuracy 0.9120", d.files["config.json"] + "  .", "done"} {
		if !strings.Contains(string(body), out) {
			t.Errorf("the uploaded notebook lacks the run's output %q:\n%s", out, body)
		}
	}
	// Only what the pod wrote is uploaded: the dataset's own files are not.
	list, err := d.s3.Client.ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range list.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	if len(keys) != 1 || keys[0] != key {
		t.Errorf("objects under s3://%s: %v, want only %s", bucket, keys, key)
	}
	deletePodAndWait(t, c.cp, c.ns, got.Status.PodName)
}
