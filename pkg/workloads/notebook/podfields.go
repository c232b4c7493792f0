package notebook

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	v1alpha1 "github.com/cistern-csi/cistern/pkg/apis/workloads/v1alpha1"
)

// The checks below are those the API server makes of the pod fields a job copies into its pod
// (k8s.io/kubernetes pkg/apis/core/validation), so that a job whose pod would be refused is
// refused at admission, naming the job's own field, instead of failing later at pod creation.

// maxFileMode is the largest mode of a projected file (0777), as the API server allows.
const maxFileMode = 0o777

// hugePagesMedium is HugePages-<page size>, e.g. HugePages-2Mi.
var hugePagesMedium = regexp.MustCompile(`^HugePages-(.+)$`)

// validateVolumeSource checks one volume's source as the API server would check it in the pod.
func validateVolumeSource(p *field.Path, v v1alpha1.PodVolume) field.ErrorList {
	var errs field.ErrorList
	switch {
	case v.ConfigMap != nil:
		cp := p.Child("configMap")
		errs = append(errs, validateObjectName(cp.Child("name"), v.ConfigMap.Name)...)
		errs = append(errs, validateKeyToPaths(cp, v.ConfigMap.Items, v.ConfigMap.DefaultMode)...)
	case v.Secret != nil:
		sp := p.Child("secret")
		errs = append(errs, validateObjectName(sp.Child("secretName"), v.Secret.SecretName)...)
		errs = append(errs, validateKeyToPaths(sp, v.Secret.Items, v.Secret.DefaultMode)...)
	case v.EmptyDir != nil:
		ep := p.Child("emptyDir")
		if !validMedium(v.EmptyDir.Medium) {
			errs = append(errs, field.NotSupported(ep.Child("medium"), v.EmptyDir.Medium,
				[]string{"", string(corev1.StorageMediumMemory), string(corev1.StorageMediumHugePages), "HugePages-<page size>"}))
		}
		if q := v.EmptyDir.SizeLimit; q != nil && q.Sign() < 0 {
			errs = append(errs, field.Invalid(ep.Child("sizeLimit"), q.String(), "must not be negative"))
		}
	case v.CSI != nil:
		if ref := v.CSI.NodePublishSecretRef; ref != nil {
			errs = append(errs, validateObjectName(p.Child("csi", "nodePublishSecretRef", "name"), ref.Name)...)
		}
	}
	return errs
}

func validMedium(m corev1.StorageMedium) bool {
	switch m {
	case corev1.StorageMediumDefault, corev1.StorageMediumMemory, corev1.StorageMediumHugePages:
		return true
	}
	sub := hugePagesMedium.FindStringSubmatch(string(m))
	if sub == nil {
		return false
	}
	q, err := resource.ParseQuantity(sub[1])
	return err == nil && q.Sign() > 0
}

func validateObjectName(p *field.Path, name string) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

// validateKeyToPaths checks items[].key, items[].path (relative, no '..'), items[].mode and
// defaultMode of a ConfigMap or Secret volume.
func validateKeyToPaths(p *field.Path, items []corev1.KeyToPath, defaultMode *int32) field.ErrorList {
	var errs field.ErrorList
	if defaultMode != nil {
		errs = append(errs, validateMode(p.Child("defaultMode"), *defaultMode)...)
	}
	for i, it := range items {
		ip := p.Child("items").Index(i)
		if it.Key == "" {
			errs = append(errs, field.Required(ip.Child("key"), ""))
		} else {
			for _, msg := range validation.IsConfigMapKey(it.Key) {
				errs = append(errs, field.Invalid(ip.Child("key"), it.Key, msg))
			}
		}
		errs = append(errs, validateLocalPath(ip.Child("path"), it.Path)...)
		if it.Mode != nil {
			errs = append(errs, validateMode(ip.Child("mode"), *it.Mode)...)
		}
	}
	return errs
}

func validateMode(p *field.Path, mode int32) field.ErrorList {
	if mode < 0 || mode > maxFileMode {
		return field.ErrorList{field.Invalid(p, fmt.Sprintf("0%o", mode), "must be a number between 0 and 0777 (octal), both inclusive")}
	}
	return nil
}

// validateLocalPath refuses an empty or absolute path, a '..' segment and a leading '..', as the
// API server does for files projected into a volume.
func validateLocalPath(p *field.Path, s string) field.ErrorList {
	switch {
	case s == "":
		return field.ErrorList{field.Required(p, "")}
	case strings.HasPrefix(s, "/"):
		return field.ErrorList{field.Invalid(p, s, "must be a relative path")}
	case strings.HasPrefix(s, ".."):
		return field.ErrorList{field.Invalid(p, s, "must not start with '..'")}
	}
	for _, seg := range strings.Split(s, "/") {
		if seg == ".." {
			return field.ErrorList{field.Invalid(p, s, "must not contain '..'")}
		}
	}
	return nil
}

// fieldRefPaths are the pod fields an environment variable may read.
var fieldRefPaths = []string{"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
	"spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"}

// resourceFieldRefs are the container resources an environment variable may read.
var resourceFieldRefs = []string{"limits.cpu", "limits.memory", "limits.ephemeral-storage",
	"requests.cpu", "requests.memory", "requests.ephemeral-storage"}

// validateEnv checks names and sources of the notebook container's variables.
func validateEnv(p *field.Path, env []corev1.EnvVar) field.ErrorList {
	var errs field.ErrorList
	for i, e := range env {
		ep := p.Index(i)
		if e.Name == "" {
			errs = append(errs, field.Required(ep.Child("name"), ""))
		} else {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				errs = append(errs, field.Invalid(ep.Child("name"), e.Name, msg))
			}
		}
		if e.ValueFrom != nil {
			errs = append(errs, validateEnvSource(ep.Child("valueFrom"), e.ValueFrom, e.Value != "")...)
		}
	}
	return errs
}

func validateEnvSource(p *field.Path, s *corev1.EnvVarSource, hasValue bool) field.ErrorList {
	var errs field.ErrorList
	if hasValue {
		errs = append(errs, field.Invalid(p, "", "may not be specified when `value` is not empty"))
	}
	n := 0
	if s.FieldRef != nil {
		n++
		path := s.FieldRef.FieldPath
		if !isFieldRefPath(path) {
			errs = append(errs, field.NotSupported(p.Child("fieldRef", "fieldPath"), path, fieldRefPaths))
		}
	}
	if s.ResourceFieldRef != nil {
		n++
		if r := s.ResourceFieldRef.Resource; !slices.Contains(resourceFieldRefs, r) && !strings.HasPrefix(r, "limits.hugepages-") && !strings.HasPrefix(r, "requests.hugepages-") {
			errs = append(errs, field.NotSupported(p.Child("resourceFieldRef", "resource"), r, resourceFieldRefs))
		}
		if c := s.ResourceFieldRef.ContainerName; c != "" && c != NotebookContainer {
			errs = append(errs, field.Invalid(p.Child("resourceFieldRef", "containerName"), c, "must be "+NotebookContainer))
		}
	}
	if s.ConfigMapKeyRef != nil {
		n++
		errs = append(errs, validateKeyRef(p.Child("configMapKeyRef"), s.ConfigMapKeyRef.Name, s.ConfigMapKeyRef.Key)...)
	}
	if s.SecretKeyRef != nil {
		n++
		errs = append(errs, validateKeyRef(p.Child("secretKeyRef"), s.SecretKeyRef.Name, s.SecretKeyRef.Key)...)
	}
	if s.FileKeyRef != nil {
		n++
		errs = append(errs, field.Forbidden(p.Child("fileKeyRef"), "not supported for notebook jobs"))
	}
	switch {
	case n == 0:
		errs = append(errs, field.Invalid(p, "", "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"))
	case n > 1:
		errs = append(errs, field.Invalid(p, "", "may not have more than one field specified at a time"))
	}
	return errs
}

func isFieldRefPath(path string) bool {
	if slices.Contains(fieldRefPaths, path) {
		return true
	}
	for _, prefix := range []string{"metadata.labels['", "metadata.annotations['"} {
		if strings.HasPrefix(path, prefix) && strings.HasSuffix(path, "']") && len(path) > len(prefix)+2 {
			return true
		}
	}
	return false
}

func validateKeyRef(p *field.Path, name, key string) field.ErrorList {
	var errs field.ErrorList
	if name == "" {
		errs = append(errs, field.Required(p.Child("name"), ""))
	} else {
		errs = append(errs, validateObjectName(p.Child("name"), name)...)
	}
	if key == "" {
		errs = append(errs, field.Required(p.Child("key"), ""))
	} else {
		for _, msg := range validation.IsConfigMapKey(key) {
			errs = append(errs, field.Invalid(p.Child("key"), key, msg))
		}
	}
	return errs
}

// validateResources refuses negative quantities and a request above its limit.
func validateResources(p *field.Path, r *corev1.ResourceRequirements) field.ErrorList {
	if r == nil {
		return nil
	}
	var errs field.ErrorList
	for _, l := range []struct {
		name string
		list corev1.ResourceList
	}{{"limits", r.Limits}, {"requests", r.Requests}} {
		for name, q := range l.list {
			if q.Sign() < 0 {
				errs = append(errs, field.Invalid(p.Child(l.name).Key(string(name)), q.String(), "must be greater than or equal to 0"))
			}
		}
	}
	for name, req := range r.Requests {
		if lim, ok := r.Limits[name]; ok && req.Cmp(lim) > 0 {
			errs = append(errs, field.Invalid(p.Child("requests").Key(string(name)), req.String(),
				fmt.Sprintf("must be less than or equal to %s limit of %s", name, lim.String())))
		}
	}
	return errs
}

// validateEnvFrom checks each source: exactly one of configMapRef and secretRef, a valid name and
// prefix.
func validateEnvFrom(p *field.Path, from []corev1.EnvFromSource) field.ErrorList {
	var errs field.ErrorList
	for i, f := range from {
		fp := p.Index(i)
		if f.Prefix != "" {
			for _, msg := range validation.IsEnvVarName(f.Prefix) {
				errs = append(errs, field.Invalid(fp.Child("prefix"), f.Prefix, msg))
			}
		}
		switch {
		case f.ConfigMapRef != nil && f.SecretRef != nil:
			errs = append(errs, field.Invalid(fp, "", "may not have more than one field specified at a time"))
		case f.ConfigMapRef != nil:
			errs = append(errs, validateObjectName(fp.Child("configMapRef", "name"), f.ConfigMapRef.Name)...)
		case f.SecretRef != nil:
			errs = append(errs, validateObjectName(fp.Child("secretRef", "name"), f.SecretRef.Name)...)
		default:
			errs = append(errs, field.Invalid(fp, "", "must specify one of: `configMapRef` or `secretRef`"))
		}
	}
	return errs
}

// validatePlacement checks nodeSelector and tolerations as the API server does; affinity is left
// to the API server (a refused pod fails the job with its message).
func validatePlacement(p *field.Path, pc *v1alpha1.PodConfig) field.ErrorList {
	var errs field.ErrorList
	for _, k := range slices.Sorted(maps.Keys(pc.NodeSelector)) {
		v := pc.NodeSelector[k]
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(p.Child("nodeSelector").Key(k), k, msg))
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			errs = append(errs, field.Invalid(p.Child("nodeSelector").Key(k), v, msg))
		}
	}
	for i, t := range pc.Tolerations {
		tp := p.Child("tolerations").Index(i)
		if t.Key != "" {
			for _, msg := range validation.IsQualifiedName(t.Key) {
				errs = append(errs, field.Invalid(tp.Child("key"), t.Key, msg))
			}
		}
		switch t.Operator {
		case corev1.TolerationOpEqual, "":
			if t.Key == "" {
				errs = append(errs, field.Invalid(tp.Child("operator"), t.Operator, "operator must be Exists when `key` is empty"))
			}
			for _, msg := range validation.IsValidLabelValue(t.Value) {
				errs = append(errs, field.Invalid(tp.Child("value"), t.Value, msg))
			}
		case corev1.TolerationOpExists:
			if t.Value != "" {
				errs = append(errs, field.Invalid(tp.Child("value"), t.Value, "value must be empty when `operator` is 'Exists'"))
			}
		default:
			errs = append(errs, field.NotSupported(tp.Child("operator"), t.Operator, []string{string(corev1.TolerationOpEqual), string(corev1.TolerationOpExists)}))
		}
		switch t.Effect {
		case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			errs = append(errs, field.NotSupported(tp.Child("effect"), t.Effect, []string{
				string(corev1.TaintEffectNoSchedule), string(corev1.TaintEffectPreferNoSchedule), string(corev1.TaintEffectNoExecute)}))
		}
		if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
			errs = append(errs, field.Invalid(tp.Child("effect"), t.Effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"))
		}
	}
	return errs
}
