package notebook

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/workloads/notebook/compare"
)

// allowedSources are the volume sources a notebook may use, by their JSON names.
var allowedSources = []string{"persistentVolumeClaim", "configMap", "secret", "emptyDir", "csi"}

// Validate checks a job. rawVolumes are the volumes as the user sent them (JSON objects), so that
// volume types the API does not have, such as hostPath, are refused by name; nil skips that check
// (the typed object cannot carry them anyway). Warnings name user variables the controller's own
// replace.
func Validate(job *v1alpha1.NotebookValidationJob, rawVolumes []map[string]any) (field.ErrorList, []string) {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	nb := spec.Child("notebook")
	if u := job.Spec.Notebook.Git.URL; u == "" {
		errs = append(errs, field.Required(nb.Child("git", "url"), "the repository to clone"))
	} else if strings.HasPrefix(u, "-") {
		errs = append(errs, field.Invalid(nb.Child("git", "url"), u, "must not start with '-'"))
	}
	if r := job.Spec.Notebook.Git.Ref; strings.HasPrefix(r, "-") {
		errs = append(errs, field.Invalid(nb.Child("git", "ref"), r, "must not start with '-'"))
	}
	if cs := job.Spec.Notebook.Git.CredentialsSecret; cs != "" {
		errs = append(errs, validateObjectName(nb.Child("git", "credentialsSecret"), cs)...)
	}
	errs = append(errs, validateRelPath(nb.Child("path"), job.Spec.Notebook.Path, true)...)
	errs = append(errs, validateGolden(spec.Child("goldenNotebook"), job.Spec.GoldenNotebook)...)
	if !strings.HasSuffix(job.Spec.Notebook.Path, ".ipynb") {
		errs = append(errs, field.Invalid(nb.Child("path"), job.Spec.Notebook.Path, "must name a .ipynb file"))
	}
	if t := job.Spec.Timeout; t != nil && t.Duration <= 0 {
		errs = append(errs, field.Invalid(spec.Child("timeout"), t.Duration.String(), "must be positive"))
	}
	pc := spec.Child("podConfig")
	if job.Spec.PodConfig.ContainerImage == "" {
		errs = append(errs, field.Required(pc.Child("containerImage"), "an image with papermill"))
	}
	volNames := sets.New[string]()
	for i, v := range job.Spec.PodConfig.Volumes {
		var raw map[string]any
		if i < len(rawVolumes) {
			raw = rawVolumes[i]
		}
		errs = append(errs, validateVolume(pc.Child("volumes").Index(i), v, raw, volNames)...)
		errs = append(errs, validateVolumeSource(pc.Child("volumes").Index(i), v)...)
	}
	mountPaths := sets.New[string]()
	for i, m := range job.Spec.PodConfig.VolumeMounts {
		mp := pc.Child("volumeMounts").Index(i)
		if !volNames.Has(m.Name) {
			errs = append(errs, field.NotFound(mp.Child("name"), m.Name))
		}
		errs = append(errs, validateMountPath(mp.Child("mountPath"), m.MountPath, mountPaths)...)
		if m.SubPath != "" {
			errs = append(errs, validateRelPath(mp.Child("subPath"), m.SubPath, false)...)
		}
	}
	errs = append(errs, validateOutput(spec.Child("output"), job.Spec.Output, job.Spec.PodConfig.Volumes)...)
	errs = append(errs, validateEnv(pc.Child("env"), job.Spec.PodConfig.Env)...)
	errs = append(errs, validateEnvFrom(pc.Child("envFrom"), job.Spec.PodConfig.EnvFrom)...)
	errs = append(errs, validatePlacement(pc, &job.Spec.PodConfig)...)
	if sa := job.Spec.PodConfig.ServiceAccountName; sa != "" {
		errs = append(errs, validateObjectName(pc.Child("serviceAccountName"), sa)...)
	}
	errs = append(errs, validateResources(pc.Child("resources"), job.Spec.PodConfig.Resources)...)
	errs = append(errs, validateResources(pc.Child("helperResources"), job.Spec.PodConfig.HelperResources)...)
	for i, s := range job.Spec.PodConfig.ImagePullSecrets {
		errs = append(errs, validateObjectName(pc.Child("imagePullSecrets").Index(i).Child("name"), s.Name)...)
	}
	var warnings []string
	if job.Spec.PodConfig.Resources == nil {
		warnings = append(warnings, pc.Child("resources").String()+" is unset: in a namespace whose ResourceQuota counts requests or limits, "+
			"and that has no LimitRange, the pod will be refused")
	}
	for i, e := range job.Spec.PodConfig.Env {
		if slices.Contains(ReservedEnv, e.Name) {
			warnings = append(warnings, fmt.Sprintf("%s: %s is set by the controller; this value is ignored",
				pc.Child("env").Index(i).Child("name"), e.Name))
		}
	}
	return errs, warnings
}

func validateVolume(p *field.Path, v v1alpha1.PodVolume, raw map[string]any, seen sets.Set[string]) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(v.Name) {
		errs = append(errs, field.Invalid(p.Child("name"), v.Name, msg))
	}
	switch {
	case v.Name == GitCloneVolume || v.Name == NotebookDataVolume || v.Name == GitCredentialsVolume || v.Name == GoldenCredentialsVolume ||
		strings.HasPrefix(v.Name, ServiceAccountVolumePrefix):
		errs = append(errs, field.Invalid(p.Child("name"), v.Name,
			fmt.Sprintf("is used by the controller (reserved: %s, %s, %s, %s, %s*)", GitCloneVolume, NotebookDataVolume, GitCredentialsVolume,
				GoldenCredentialsVolume, ServiceAccountVolumePrefix)))
	case seen.Has(v.Name):
		errs = append(errs, field.Duplicate(p.Child("name"), v.Name))
	}
	seen.Insert(v.Name)

	for k := range raw {
		if k != "name" && !slices.Contains(allowedSources, k) {
			errs = append(errs, field.Forbidden(p.Child(k),
				fmt.Sprintf("volume type %s is not allowed; use one of %s", k, strings.Join(allowedSources, ", "))))
		}
	}
	var set []string
	for _, s := range []struct {
		name string
		on   bool
	}{
		{"persistentVolumeClaim", v.PersistentVolumeClaim != nil}, {"configMap", v.ConfigMap != nil},
		{"secret", v.Secret != nil}, {"emptyDir", v.EmptyDir != nil}, {"csi", v.CSI != nil},
	} {
		if s.on {
			set = append(set, s.name)
		}
	}
	switch {
	case len(set) == 0 && len(errs) == 0:
		errs = append(errs, field.Required(p, "exactly one volume source: "+strings.Join(allowedSources, ", ")))
	case len(set) > 1:
		errs = append(errs, field.Invalid(p, strings.Join(set, ", "), "must have exactly one volume source"))
	}
	if v.CSI != nil && v.CSI.Driver != consts.DriverName {
		errs = append(errs, field.NotSupported(p.Child("csi", "driver"), v.CSI.Driver, []string{consts.DriverName}))
	}
	return errs
}

func validateMountPath(p *field.Path, mp string, seen sets.Set[string]) field.ErrorList {
	if !path.IsAbs(mp) {
		return field.ErrorList{field.Invalid(p, mp, "must be an absolute path")}
	}
	clean := path.Clean(mp)
	var errs field.ErrorList
	for _, own := range []string{WorkspacePath, OutputPath} {
		if clean == own || strings.HasPrefix(clean, own+"/") {
			errs = append(errs, field.Invalid(p, mp, fmt.Sprintf("collides with the controller's mount %s (volumes %s, %s)", own, GitCloneVolume, NotebookDataVolume)))
		}
	}
	if seen.Has(clean) {
		errs = append(errs, field.Duplicate(p, mp))
	}
	seen.Insert(clean)
	return errs
}

// validateGolden checks the golden notebook's repository, path and tolerance.
func validateGolden(p *field.Path, g *v1alpha1.GoldenNotebook) field.ErrorList {
	if g == nil {
		return nil
	}
	var errs field.ErrorList
	if gs := g.Git; gs != nil {
		gp := p.Child("git")
		switch {
		case gs.URL == "":
			errs = append(errs, field.Required(gp.Child("url"), "the repository to clone"))
		case strings.HasPrefix(gs.URL, "-"):
			errs = append(errs, field.Invalid(gp.Child("url"), gs.URL, "must not start with '-'"))
		}
		if strings.HasPrefix(gs.Ref, "-") {
			errs = append(errs, field.Invalid(gp.Child("ref"), gs.Ref, "must not start with '-'"))
		}
		if gs.CredentialsSecret != "" {
			errs = append(errs, validateObjectName(gp.Child("credentialsSecret"), gs.CredentialsSecret)...)
		}
	}
	errs = append(errs, validateRelPath(p.Child("path"), g.Path, true)...)
	if !strings.HasSuffix(g.Path, ".ipynb") {
		errs = append(errs, field.Invalid(p.Child("path"), g.Path, "must name a .ipynb file"))
	}
	if _, err := compare.ParseTolerance(g.NumericTolerance); err != nil {
		errs = append(errs, field.Invalid(p.Child("numericTolerance"), g.NumericTolerance, "must be a non-negative decimal number"))
	}
	for i, t := range g.IgnoreOutputTypes {
		if !slices.Contains(compare.OutputTypes, string(t)) {
			errs = append(errs, field.NotSupported(p.Child("ignoreOutputTypes").Index(i), t, compare.OutputTypes))
		}
	}
	for i, pat := range g.IgnorePatterns {
		if _, err := regexp.Compile(pat); err != nil {
			errs = append(errs, field.Invalid(p.Child("ignorePatterns").Index(i), pat, "not a regular expression (RE2 syntax): "+err.Error()))
		}
	}
	return errs
}

// validateRelPath refuses absolute paths and any ".." segment (checked per segment, before any
// cleaning, so "a/../../b" cannot slip through).
func validateRelPath(p *field.Path, s string, required bool) field.ErrorList {
	if s == "" {
		if required {
			return field.ErrorList{field.Required(p, "a path relative to the repository")}
		}
		return nil
	}
	if strings.HasPrefix(s, "/") {
		return field.ErrorList{field.Invalid(p, s, "must be a relative path")}
	}
	for _, seg := range strings.Split(s, "/") {
		if seg == ".." {
			return field.ErrorList{field.Invalid(p, s, "must not contain '..'")}
		}
	}
	return nil
}

// outputTargetShape is what spec.output.target may be: s3://bucket[/prefix], a bucket name as S3 has
// them, no placeholders (the controller puts the pod's name under it).
var outputTargetShape = regexp.MustCompile(`^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^${}]*)?$`)

// validateOutput checks that spec.output names a volume the driver can write back: an inline
// Cistern volume of an S3 dataset, writable, with the tenant's credentials (the driver refuses
// web identity with a target, as its token expires with the pod).
func validateOutput(p *field.Path, o *v1alpha1.NotebookOutput, volumes []v1alpha1.PodVolume) field.ErrorList {
	if o == nil {
		return nil
	}
	var errs field.ErrorList
	if !outputTargetShape.MatchString(o.Target) {
		errs = append(errs, field.Invalid(p.Child("target"), o.Target, "must be s3://bucket[/prefix], without ${...} placeholders"))
	}
	i := slices.IndexFunc(volumes, func(v v1alpha1.PodVolume) bool { return v.Name == o.Volume })
	if i < 0 {
		return append(errs, field.NotFound(p.Child("volume"), o.Volume))
	}
	vp, v := p.Child("volume"), volumes[i].CSI
	switch {
	case v == nil:
		errs = append(errs, field.Invalid(vp, o.Volume, "must name a csi volume of the Cistern driver (a writable S3 dataset volume)"))
	case v.ReadOnly != nil && *v.ReadOnly:
		errs = append(errs, field.Invalid(vp, o.Volume, "names a readOnly volume: the notebook is written into it"))
	case !strings.HasPrefix(v.VolumeAttributes[consts.ParamSource], "s3://"):
		errs = append(errs, field.Invalid(vp, o.Volume, "names a volume without an S3 dataset (volumeAttributes.source s3://...): write-back keeps only what is written on one"))
	case v.VolumeAttributes[consts.ParamOutputTarget] != "":
		errs = append(errs, field.Invalid(vp, o.Volume, "names a volume that sets its own "+consts.ParamOutputTarget+": spec.output.target sets it"))
	case v.NodePublishSecretRef == nil || v.NodePublishSecretRef.Name == "":
		errs = append(errs, field.Invalid(vp, o.Volume, "names a volume without nodePublishSecretRef: the upload runs after the pod, with the Secret's credentials"))
	}
	return errs
}
