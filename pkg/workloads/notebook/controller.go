package notebook

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook/compare"
)

// DefaultTimeout bounds a run whose spec sets no timeout.
const DefaultTimeout = 30 * time.Minute

// missingVolumeRetry is how often a job waiting for a PVC or ConfigMap looks again.
const missingVolumeRetry = 10 * time.Second

// cacheLag is how soon a job whose pod the API server has and the cache not yet looks again
// (the pod's own event usually comes first).
const cacheLag = time.Second

// podCreateRetry is how often a job whose pod was refused for a reason that may pass (quota, an
// admission webhook, a server error) tries again.
const podCreateRetry = 15 * time.Second

// Reconciler drives NotebookValidationJobs: it creates the pod once every referenced PVC and
// ConfigMap exists, follows the pod's phase, and enforces the timeout.
type Reconciler struct {
	client.Client
	// APIReader reads PVCs and ConfigMaps directly, so the controller need not cache them all.
	APIReader client.Reader
	Images    Images
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// +kubebuilder:rbac:groups=workloads.cistern.dev,resources=notebookvalidationjobs,verbs=get;list;watch
// +kubebuilder:rbac:groups=workloads.cistern.dev,resources=notebookvalidationjobs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=workloads.cistern.dev,resources=notebookvalidationjobs/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims;configmaps,verbs=get

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile moves one job forward.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := klog.FromContext(ctx).WithValues("notebookvalidationjob", req.NamespacedName)
	ctx = klog.NewContext(ctx, logger)
	var job v1alpha1.NotebookValidationJob
	if err := r.Get(ctx, req.NamespacedName, &job); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if job.DeletionTimestamp != nil || isDone(&job) {
		return ctrl.Result{}, nil
	}
	st := job.Status.DeepCopy()
	st.ObservedGeneration = job.Generation
	res, err := r.step(ctx, &job, st)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !apiequality.Semantic.DeepEqual(*st, job.Status) {
		job.Status = *st
		if err := r.Status().Update(ctx, &job); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{}, nil // a newer version is on its way through the cache; it will be reconciled
			}
			return ctrl.Result{}, err
		}
		logger.V(4).Info("status", "phase", st.Phase, "message", st.Message)
	}
	return res, nil
}

func isDone(job *v1alpha1.NotebookValidationJob) bool {
	return job.Status.Phase == v1alpha1.NotebookPhaseSucceeded || job.Status.Phase == v1alpha1.NotebookPhaseFailed
}

func (r *Reconciler) step(ctx context.Context, job *v1alpha1.NotebookValidationJob, st *v1alpha1.NotebookValidationJobStatus) (ctrl.Result, error) {
	// Admission already refused invalid jobs; this guards against a missing webhook.
	if errs, _ := Validate(job, nil); len(errs) > 0 {
		r.finish(st, v1alpha1.NotebookPhaseFailed, "Invalid", errs.ToAggregate().Error())
		return ctrl.Result{}, nil
	}
	var pod corev1.Pod
	err := r.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: PodName(job)}, &pod)
	if apierrors.IsNotFound(err) {
		if st.PodName != "" {
			// The cache may not have seen the pod this job just created (its status update
			// can come back first): only the API server tells that the pod is gone.
			err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: st.PodName}, &pod)
			switch {
			case err == nil:
				return ctrl.Result{RequeueAfter: cacheLag}, nil
			case !apierrors.IsNotFound(err):
				return ctrl.Result{}, err
			}
			r.finish(st, v1alpha1.NotebookPhaseFailed, v1alpha1.ReasonPodDeleted, fmt.Sprintf("pod %s was deleted before it finished", st.PodName))
			return ctrl.Result{}, nil
		}
		return r.createPod(ctx, job, st)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if !metav1.IsControlledBy(&pod, job) {
		r.finish(st, v1alpha1.NotebookPhaseFailed, "PodConflict", fmt.Sprintf("pod %s exists and does not belong to this job", pod.Name))
		return ctrl.Result{}, nil
	}
	st.PodName = pod.Name
	recordCommits(&pod, st)
	if r.retry(ctx, job, &pod, st) {
		// The status update (Retries) brings the job back, to create the next pod.
		return ctrl.Result{}, nil
	}
	if r.observe(job, &pod, st) {
		return ctrl.Result{}, nil
	}
	return r.enforceTimeout(ctx, job, &pod, st)
}

// observe moves st to the pod's phase; true when the job is finished.
func (r *Reconciler) observe(job *v1alpha1.NotebookValidationJob, pod *corev1.Pod, st *v1alpha1.NotebookValidationJobStatus) bool {
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		recordResults(job, pod, st)
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		msg := "notebook ran; output in " + OutputFile(job)
		if st.OutputURL != "" {
			msg = "notebook ran; output goes to " + st.OutputURL
		}
		if job.Spec.GoldenNotebook != nil {
			msg = "notebook ran and its outputs match the golden notebook " + job.Spec.GoldenNotebook.Path + "; output in " + OutputFile(job)
			if st.OutputURL != "" {
				msg = "notebook ran and its outputs match the golden notebook " + job.Spec.GoldenNotebook.Path + "; output goes to " + st.OutputURL
			}
		}
		r.finish(st, v1alpha1.NotebookPhaseSucceeded, v1alpha1.ReasonSucceeded, msg)
		return true
	case corev1.PodFailed:
		r.finish(st, v1alpha1.NotebookPhaseFailed, failureReason(pod), failureMessage(pod))
		return true
	case corev1.PodRunning, corev1.PodPending:
		if pod.Status.Phase == corev1.PodPending && !notebookStarted(pod) {
			st.Phase = v1alpha1.NotebookPhasePending
			st.Message = "waiting for the pod to start"
			break
		}
		st.Phase = v1alpha1.NotebookPhaseRunning
		st.Message = "notebook is running"
	default:
		st.Phase = v1alpha1.NotebookPhasePending
		st.Message = "waiting for the pod to start"
	}
	if st.Phase == v1alpha1.NotebookPhaseRunning && st.StartTime == nil {
		t := metav1.NewTime(r.now())
		if pod.Status.StartTime != nil {
			t = *pod.Status.StartTime
		}
		st.StartTime = &t
	}
	return false
}

// failureReason tells a timeout and a golden mismatch from any other failure of a pod.
func failureReason(pod *corev1.Pod) string {
	switch {
	case pod.Status.Reason == "DeadlineExceeded":
		return v1alpha1.ReasonTimedOut
	case containerFailed(pod.Status.ContainerStatuses, CompareContainer):
		return v1alpha1.ReasonGoldenMismatch
	}
	return v1alpha1.ReasonFailed
}

// retry moves a job whose pod failed, within its retry limit, back to Pending for a new pod
// (PodName numbers it by st.Retries); true when it did. A failed clone or notebook run is tried
// again; a timeout or a mismatch would only repeat itself.
func (r *Reconciler) retry(ctx context.Context, job *v1alpha1.NotebookValidationJob, pod *corev1.Pod, st *v1alpha1.NotebookValidationJobStatus) bool {
	limit := ptr.Deref(job.Spec.Retries, 0)
	if pod.Status.Phase != corev1.PodFailed || failureReason(pod) != v1alpha1.ReasonFailed || st.Retries >= limit {
		return false
	}
	st.Retries++
	st.Phase, st.PodName, st.StartTime = v1alpha1.NotebookPhasePending, "", nil
	st.Message = fmt.Sprintf("run failed, retrying (%d of %d): %s", st.Retries, limit, failureMessage(pod))
	klog.FromContext(ctx).Info("retrying", "pod", klog.KObj(pod), "retry", st.Retries, "of", limit)
	return true
}

// enforceTimeout requeues the job for its deadline, or, past it, deletes the pod and fails it.
func (r *Reconciler) enforceTimeout(ctx context.Context, job *v1alpha1.NotebookValidationJob, pod *corev1.Pod, st *v1alpha1.NotebookValidationJobStatus) (ctrl.Result, error) {
	// The clock runs from the start of the run, or from the pod's creation while it has not
	// started, so a pod that never starts times out too.
	timeout := DefaultTimeout
	if job.Spec.Timeout != nil {
		timeout = job.Spec.Timeout.Duration
	}
	from := pod.CreationTimestamp.Time
	if st.StartTime != nil {
		from = st.StartTime.Time
	}
	if from.IsZero() {
		return ctrl.Result{RequeueAfter: timeout}, nil
	}
	left := from.Add(timeout).Sub(r.now())
	if left > 0 {
		return ctrl.Result{RequeueAfter: left}, nil
	}
	if err := r.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	r.finish(st, v1alpha1.NotebookPhaseFailed, v1alpha1.ReasonTimedOut, fmt.Sprintf("did not finish within %s; pod deleted", timeout))
	return ctrl.Result{}, nil
}

func (r *Reconciler) createPod(ctx context.Context, job *v1alpha1.NotebookValidationJob, st *v1alpha1.NotebookValidationJobStatus) (ctrl.Result, error) {
	missing, err := r.missingVolumes(ctx, job)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(missing) > 0 {
		st.Phase = v1alpha1.NotebookPhasePending
		st.Message = "waiting for " + strings.Join(missing, ", ")
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.NotebookConditionVolumesReady,
			Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonVolumeMissing, Message: strings.Join(missing, "; "), ObservedGeneration: job.Generation})
		return ctrl.Result{RequeueAfter: missingVolumeRetry}, nil
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.NotebookConditionVolumesReady,
		Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonVolumesFound, Message: "every referenced volume exists", ObservedGeneration: job.Generation})
	pod := BuildPod(job, r.Images)
	if err := controllerutil.SetControllerReference(job, pod, r.Scheme()); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return r.podCreateFailed(ctx, job, st, err)
	}
	meta.RemoveStatusCondition(&st.Conditions, v1alpha1.NotebookConditionPodCreated)
	klog.FromContext(ctx).V(3).Info("created validation pod", "pod", klog.KObj(pod))
	st.Phase = v1alpha1.NotebookPhasePending
	st.PodName = pod.Name
	st.Message = "pod created"
	return ctrl.Result{}, nil
}

// podCreateFailed records a refused pod. A pod the API server finds invalid (or malformed) can
// never be created from this spec, so the job fails with the API server's message; anything else
// (quota, an admission webhook, the server itself) may pass later, so the job stays Pending with
// PodCreated=False and the message, and is tried again.
func (r *Reconciler) podCreateFailed(ctx context.Context, job *v1alpha1.NotebookValidationJob, st *v1alpha1.NotebookValidationJobStatus, err error) (ctrl.Result, error) {
	msg := "creating pod " + PodName(job) + ": " + err.Error()
	klog.FromContext(ctx).Info("pod refused", "pod", PodName(job), "err", err)
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		r.finish(st, v1alpha1.NotebookPhaseFailed, v1alpha1.ReasonPodCreateFailed, msg)
		return ctrl.Result{}, nil
	}
	st.Phase = v1alpha1.NotebookPhasePending
	st.Message = msg
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.NotebookConditionPodCreated,
		Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPodCreateFailed, Message: msg, ObservedGeneration: job.Generation})
	return ctrl.Result{RequeueAfter: podCreateRetry}, nil
}

// missingVolumes names every PersistentVolumeClaim and non-optional ConfigMap the job mounts that
// does not exist.
func (r *Reconciler) missingVolumes(ctx context.Context, job *v1alpha1.NotebookValidationJob) ([]string, error) {
	var missing []string
	for _, v := range job.Spec.PodConfig.Volumes {
		var obj client.Object
		var what, name string
		switch {
		case v.PersistentVolumeClaim != nil:
			obj, what, name = &corev1.PersistentVolumeClaim{}, "PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName
		case v.ConfigMap != nil && (v.ConfigMap.Optional == nil || !*v.ConfigMap.Optional):
			obj, what, name = &corev1.ConfigMap{}, "ConfigMap", v.ConfigMap.Name
		default:
			continue
		}
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: name}, obj)
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, fmt.Sprintf("%s %q (volume %q) not found", what, name, v.Name))
		case err != nil:
			return nil, err
		}
	}
	return missing, nil
}

func (r *Reconciler) finish(st *v1alpha1.NotebookValidationJobStatus, phase v1alpha1.NotebookPhase, reason, msg string) {
	now := metav1.NewTime(r.now())
	st.Phase, st.Message, st.CompletionTime = phase, msg, &now
	status := metav1.ConditionTrue
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.NotebookConditionComplete,
		Status: status, Reason: reason, Message: msg, ObservedGeneration: st.ObservedGeneration})
}

// recordCommits copies the commits the clone used (its termination message, "commit=<sha>
// [golden-commit=<sha>]") into the status once it has succeeded.
func recordCommits(pod *corev1.Pod, st *v1alpha1.NotebookValidationJobStatus) {
	for _, cs := range pod.Status.InitContainerStatuses {
		t := cs.State.Terminated
		if cs.Name != GitCloneContainer || t == nil || t.ExitCode != 0 {
			continue
		}
		for _, f := range strings.Fields(t.Message) {
			k, v, _ := strings.Cut(f, "=")
			if !isCommit(v) {
				continue
			}
			switch k {
			case "commit":
				st.Commit = v
			case "golden-commit":
				st.GoldenCommit = v
			}
		}
	}
}

// maxCells bounds status.cells; the rest are counted in cellsOmitted.
const maxCells = 256

// recordResults copies the results container's per-cell results and the executed notebook's
// SHA-256 (its termination message) into the status, and where the notebook is uploaded. The
// controller never reads the notebook itself.
func recordResults(job *v1alpha1.NotebookValidationJob, pod *corev1.Pod, st *v1alpha1.NotebookValidationJobStatus) {
	st.OutputURL = OutputURL(job, pod.Name)
	for _, cs := range pod.Status.ContainerStatuses {
		t := cs.State.Terminated
		if cs.Name != CompareContainer || t == nil {
			continue
		}
		_, r, ok := compare.ParseResults(t.Message)
		if !ok {
			return
		}
		if isSHA256(r.SHA256) {
			st.OutputSHA256 = r.SHA256
		}
		cells := make([]v1alpha1.CellResult, 0, len(r.Passed)+len(r.Failed))
		for _, i := range r.Passed {
			cells = append(cells, v1alpha1.CellResult{Index: int32(i), Result: v1alpha1.CellPassed})
		}
		for _, f := range r.Failed {
			cells = append(cells, v1alpha1.CellResult{Index: int32(f.Cell), Result: v1alpha1.CellFailed, Reason: clip(f.Reason, compare.ReasonMax)})
		}
		slices.SortFunc(cells, func(a, b v1alpha1.CellResult) int { return cmp.Compare(a.Index, b.Index) })
		omitted := r.Omitted
		if len(cells) > maxCells {
			omitted += len(cells) - maxCells
			cells = cells[:maxCells]
		}
		st.Cells, st.CellsOmitted = cells, int32(omitted)
	}
}

func isSHA256(s string) bool {
	return len(s) == 64 && strings.Trim(s, "0123456789abcdef") == ""
}

// clip shortens s to at most n runes.
func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// isCommit says whether s is a full SHA-1 or SHA-256 commit name.
func isCommit(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	return strings.Trim(s, "0123456789abcdef") == ""
}

// notebookStarted says whether the notebook runs, or ran: with a golden notebook papermill is an
// init container, so the pod is Pending while it runs.
func notebookStarted(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.InitContainerStatuses {
		if cs.Name == NotebookContainer && (cs.State.Running != nil || cs.State.Terminated != nil) {
			return true
		}
	}
	return false
}

func containerFailed(statuses []corev1.ContainerStatus, name string) bool {
	for _, cs := range statuses {
		if cs.Name == name && cs.State.Terminated != nil && cs.State.Terminated.ExitCode != 0 {
			return true
		}
	}
	return false
}

// failureMessage explains a failed pod from its containers' terminated states.
func failureMessage(pod *corev1.Pod) string {
	var parts []string
	for _, cs := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			s := fmt.Sprintf("container %s exited with code %d", cs.Name, t.ExitCode)
			if t.Reason != "" {
				s += " (" + t.Reason + ")"
			}
			if msg, _, _ := compare.ParseResults(t.Message); msg != "" {
				s += ": " + msg
			}
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		if pod.Status.Message != "" {
			return pod.Status.Message
		}
		return "pod failed"
	}
	return strings.Join(parts, "; ")
}

// SetupWithManager registers the reconciler for jobs and the pods they own.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("notebookvalidationjob").
		For(&v1alpha1.NotebookValidationJob{}).
		Owns(&corev1.Pod{}).
		Complete(r)
}
