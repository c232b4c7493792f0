package notebook

import (
	"context"
	"encoding/json"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// ValidatePath is where the NotebookValidationJob validating webhook is served.
const ValidatePath = "/validate-notebookvalidationjob"

// RegisterWebhooks adds the NotebookValidationJob validating webhook to srv.
func RegisterWebhooks(srv webhook.Server) {
	srv.Register(ValidatePath, &webhook.Admission{Handler: validator{}})
}

// validator reads the raw object as well as the typed one: volume types the API does not know
// are kept by the schema (x-kubernetes-preserve-unknown-fields) precisely so this can refuse them.
type validator struct{}

type rawJob struct {
	Spec struct {
		PodConfig struct {
			Volumes []map[string]any `json:"volumes"`
		} `json:"podConfig"`
	} `json:"spec"`
}

func (validator) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	var job v1alpha1.NotebookValidationJob
	if err := json.Unmarshal(req.Object.Raw, &job); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	var raw rawJob
	if err := json.Unmarshal(req.Object.Raw, &raw); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	errs, warnings := Validate(&job, raw.Spec.PodConfig.Volumes)
	if len(errs) > 0 {
		gk := v1alpha1.GroupVersion.WithKind("NotebookValidationJob").GroupKind()
		status := apierrors.NewInvalid(gk, job.Name, errs).ErrStatus
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
			Allowed: false, Result: &status, Warnings: warnings}}
	}
	return admission.Allowed("").WithWarnings(warnings...)
}
