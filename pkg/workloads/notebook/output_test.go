package notebook

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook/compare"
)

// withOutput gives the job a writable dataset volume "work" and keeps the notebook through it.
func withOutput(j *v1alpha1.NotebookValidationJob) {
	j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "work", CSI: &v1alpha1.CSIVolumeSource{Driver: consts.DriverName,
		VolumeAttributes:     map[string]string{"source": "s3://datasets/model", "size": "1Gi"},
		NodePublishSecretRef: &corev1.LocalObjectReference{Name: "team-s3"}}}}
	j.Spec.Output = &v1alpha1.NotebookOutput{Volume: "work", Target: "s3://results/notebooks/"}
}

// The output volume replaces the emptyDir at /output, carries outputTarget with the pod's name
// under the target, and the results container checks the cells although there is no golden
// notebook. The job's own spec is left as it was.
func TestBuildPodOutput(t *testing.T) {
	job := testJob(withOutput)
	job.Status.Retries = 1
	pod := BuildPod(job, Images{Git: "git:1", Compare: "controller:1"})
	var work *corev1.Volume
	for i, v := range pod.Spec.Volumes {
		if v.Name == NotebookDataVolume {
			t.Errorf("the emptyDir %s is still there: %+v", NotebookDataVolume, v)
		}
		if v.Name == "work" {
			work = &pod.Spec.Volumes[i]
		}
	}
	if work == nil || work.CSI == nil {
		t.Fatalf("no output volume: %+v", pod.Spec.Volumes)
	}
	if got, want := work.CSI.VolumeAttributes[consts.ParamOutputTarget], "s3://results/notebooks/nb-validation-1"; got != want {
		t.Errorf("outputTarget %q, want %q", got, want)
	}
	if _, ok := job.Spec.PodConfig.Volumes[0].CSI.VolumeAttributes[consts.ParamOutputTarget]; ok {
		t.Error("BuildPod changed the job's volume attributes")
	}
	if got, want := OutputURL(job, PodName(job)), "s3://results/notebooks/nb-validation-1/train.output.ipynb"; got != want {
		t.Errorf("OutputURL %q, want %q", got, want)
	}
	if len(pod.Spec.InitContainers) != 2 || len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != CompareContainer {
		t.Fatalf("containers: init %d, main %v", len(pod.Spec.InitContainers), pod.Spec.Containers)
	}
	check := pod.Spec.Containers[0]
	if args := strings.Join(check.Args, " "); args != "--executed /output/train.output.ipynb --results-file /dev/termination-log" {
		t.Errorf("results container args %q", args)
	}
	for _, c := range []corev1.Container{pod.Spec.InitContainers[1], check} {
		found := false
		for _, m := range c.VolumeMounts {
			found = found || m.Name == "work" && m.MountPath == OutputPath
		}
		if !found {
			t.Errorf("%s does not mount the output volume at %s: %+v", c.Name, OutputPath, c.VolumeMounts)
		}
	}
}

func TestValidateOutput(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*v1alpha1.NotebookValidationJob)
		want string
	}{
		{name: "valid output", mod: withOutput},
		{name: "failure case - target not s3", mod: func(j *v1alpha1.NotebookValidationJob) {
			withOutput(j)
			j.Spec.Output.Target = "nfs://server/export"
		}, want: `spec.output.target: Invalid value: "nfs://server/export"`},
		{name: "failure case - target with a placeholder", mod: func(j *v1alpha1.NotebookValidationJob) {
			withOutput(j)
			j.Spec.Output.Target = "s3://results/${pod.name}"
		}, want: "without ${...} placeholders"},
		{name: "failure case - no such volume", mod: func(j *v1alpha1.NotebookValidationJob) {
			withOutput(j)
			j.Spec.Output.Volume = "other"
		}, want: `spec.output.volume: Not found: "other"`},
		{name: "failure case - not a csi volume", mod: func(j *v1alpha1.NotebookValidationJob) {
			withOutput(j)
			j.Spec.PodConfig.Volumes = []v1alpha1.PodVolume{{Name: "work", EmptyDir: &v1alpha1.EmptyDirVolumeSource{}}}
		}, want: "must name a csi volume"},
		{name: "failure case - read-only volume", mod: func(j *v1alpha1.NotebookValidationJob) {
			withOutput(j)
			j.Spec.PodConfig.Volumes[0].CSI.ReadOnly = ptr.To(true)
		}, want: "names a readOnly volume"},
		{name: "failure case - no S3 dataset", mod: func(j *v1alpha1.NotebookValidationJob) {
			withOutput(j)
			j.Spec.PodConfig.Volumes[0].CSI.VolumeAttributes["source"] = "nfs://server/export"
		}, want: "without an S3 dataset"},
		{name: "failure case - volume sets its own target", mod: func(j *v1alpha1.NotebookValidationJob) {
			withOutput(j)
			j.Spec.PodConfig.Volumes[0].CSI.VolumeAttributes[consts.ParamOutputTarget] = "s3://elsewhere"
		}, want: "sets its own outputTarget"},
		{name: "failure case - no credentials", mod: func(j *v1alpha1.NotebookValidationJob) {
			withOutput(j)
			j.Spec.PodConfig.Volumes[0].CSI.NodePublishSecretRef = nil
		}, want: "without nodePublishSecretRef"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := Validate(testJob(tc.mod), nil)
			got := ""
			if len(errs) > 0 {
				got = errs.ToAggregate().Error()
			}
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("errors %q, want %q", got, tc.want)
			}
		})
	}
}

// The results container's termination message becomes status.cells, outputSHA256 and the
// message without the results line; a run that never reached it records only where its
// notebook goes.
func TestRecordResults(t *testing.T) {
	job := testJob(withOutput)
	sha := strings.Repeat("ab", 32)
	line := compare.Results{SHA256: sha, Passed: []int{3, 1}, Failed: []compare.FailedCell{{Cell: 2, Reason: "raised ValueError: bad"}}, Omitted: 2}.Encode(compare.ResultsBudget)
	pod := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: CompareContainer,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "output differs: cell 2\n" + line + "\n"}}}}}}
	pod.Name = "nb-validation"
	var st v1alpha1.NotebookValidationJobStatus
	recordResults(job, pod, &st)
	want := []v1alpha1.CellResult{{Index: 1, Result: v1alpha1.CellPassed}, {Index: 2, Result: v1alpha1.CellFailed, Reason: "raised ValueError: bad"},
		{Index: 3, Result: v1alpha1.CellPassed}}
	if len(st.Cells) != len(want) || st.CellsOmitted != 2 || st.OutputSHA256 != sha || st.OutputURL != "s3://results/notebooks/nb-validation/train.output.ipynb" {
		t.Fatalf("status %+v", st)
	}
	for i := range want {
		if st.Cells[i] != want[i] {
			t.Errorf("cell %d: %+v, want %+v", i, st.Cells[i], want[i])
		}
	}
	if got := failureMessage(pod); got != "container golden-compare exited with code 1: output differs: cell 2" {
		t.Errorf("failureMessage %q", got)
	}

	// papermill failed: no results container ran.
	pod.Status.ContainerStatuses = nil
	st = v1alpha1.NotebookValidationJobStatus{}
	recordResults(job, pod, &st)
	if st.Cells != nil || st.OutputSHA256 != "" || st.OutputURL == "" {
		t.Errorf("without results: %+v", st)
	}
}
