package nodevolume

import (
	"fmt"
	"os"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The Secret references a volume of a StorageClass carries are the class's templates, resolved as
// external-provisioner v6 resolves them (pkg/controller's getSecretReference, which is not an
// importable API): the same parameter keys, the same fallback to csi.storage.k8s.io/secret-name,
// the same tokens. Kept here because the webhook must arrive at the very references the
// provisioner wrote, and a difference refuses the provisioner's own volumes (TestSecretReferences
// holds the cases).

// kinds names the Secret references of a CSI PersistentVolume.
var kinds = []string{"controllerPublish", "nodeStage", "nodePublish", "controllerExpand", "nodeExpand"}

// secretParams are one reference's parameter keys: csi.storage.k8s.io/<prefix>-secret-name and
// -namespace, and for some the older csi<Deprecated>SecretName and -Namespace.
type secretParams struct{ prefix, deprecated string }

var (
	kindParams = map[string]secretParams{
		"controllerPublish": {"controller-publish", "ControllerPublish"},
		"nodeStage":         {"node-stage", "NodeStage"},
		"nodePublish":       {"node-publish", "NodePublish"},
		"controllerExpand":  {"controller-expand", ""},
		"nodeExpand":        {"node-expand", ""},
	}
	defaultParams = secretParams{prefix: ""}
)

// SecretReferences are the references a volume named pvName of a class with these parameters gets
// for pvc, by kind (kinds); a kind the class names no Secret for is absent.
func SecretReferences(params map[string]string, pvName string, pvc *corev1.PersistentVolumeClaim) (map[string]corev1.SecretReference, error) {
	out := map[string]corev1.SecretReference{}
	for _, kind := range kinds {
		name, namespace, err := templates(kindParams[kind], params)
		if err == nil && name == "" && namespace == "" {
			name, namespace, err = templates(defaultParams, params)
		}
		if err != nil {
			return nil, fmt.Errorf("%s secret: %w", kind, err)
		}
		if name == "" && namespace == "" {
			continue
		}
		ref, err := resolve(name, namespace, pvName, pvc)
		if err != nil {
			return nil, fmt.Errorf("%s secret: %w", kind, err)
		}
		out[kind] = ref
	}
	return out, nil
}

// secretReferencesOf are the references csi carries, by kind.
func secretReferencesOf(csi *corev1.CSIPersistentVolumeSource) map[string]corev1.SecretReference {
	out := map[string]corev1.SecretReference{}
	for kind, ref := range map[string]*corev1.SecretReference{
		"controllerPublish": csi.ControllerPublishSecretRef, "nodeStage": csi.NodeStageSecretRef,
		"nodePublish": csi.NodePublishSecretRef, "controllerExpand": csi.ControllerExpandSecretRef,
		"nodeExpand": csi.NodeExpandSecretRef,
	} {
		if ref != nil {
			out[kind] = *ref
		}
	}
	return out
}

// templates are the name and namespace templates p's keys hold in params: both or neither, each
// set once (by the current or the deprecated key), neither empty.
func templates(p secretParams, params map[string]string) (name, namespace string, err error) {
	keys := func(suffix, deprecatedSuffix string) []string {
		k := "csi.storage.k8s.io/" + p.prefix + "-secret-" + suffix
		if p.prefix == "" {
			k = "csi.storage.k8s.io/secret-" + suffix
		}
		if p.deprecated == "" {
			return []string{k}
		}
		return []string{"csi" + p.deprecated + "Secret" + deprecatedSuffix, k}
	}
	pick := func(keys []string) (string, int) {
		v, n := "", 0
		for _, k := range keys {
			if t, ok := params[k]; ok {
				v, n = t, n+1
			}
		}
		return v, n
	}
	name, names := pick(keys("name", "Name"))
	namespace, namespaces := pick(keys("namespace", "Namespace"))
	switch {
	case names > 1 || namespaces > 1:
		return "", "", fmt.Errorf("named by both the csi.storage.k8s.io/ key and the older one")
	case names != namespaces:
		return "", "", fmt.Errorf("a name or a namespace alone: both must be set")
	case names == 1 && (name == "" || namespace == ""):
		return "", "", fmt.Errorf("an empty name or namespace")
	}
	return name, namespace, nil
}

// resolve expands the templates: ${pv.name} and ${pvc.namespace} in the namespace, also
// ${pvc.name} and ${pvc.annotations['<key>']} in the name.
func resolve(nameTemplate, namespaceTemplate, pvName string, pvc *corev1.PersistentVolumeClaim) (corev1.SecretReference, error) {
	nsParams := map[string]string{"pv.name": pvName, "pvc.namespace": pvc.Namespace}
	namespace, err := expand(namespaceTemplate, nsParams)
	if err != nil {
		return corev1.SecretReference{}, err
	}
	if len(validation.IsDNS1123Label(namespace)) > 0 {
		return corev1.SecretReference{}, fmt.Errorf("%q is not a valid namespace name", namespace)
	}
	nameParams := map[string]string{"pv.name": pvName, "pvc.namespace": pvc.Namespace, "pvc.name": pvc.Name}
	for k, v := range pvc.Annotations {
		nameParams["pvc.annotations['"+k+"']"] = v
	}
	name, err := expand(nameTemplate, nameParams)
	if err != nil {
		return corev1.SecretReference{}, err
	}
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		return corev1.SecretReference{}, fmt.Errorf("%q is not a valid Secret name", name)
	}
	return corev1.SecretReference{Name: name, Namespace: namespace}, nil
}

// expand is os.Expand over params, failing on a token params lacks (as the provisioner does).
func expand(template string, params map[string]string) (string, error) {
	var missing []string
	out := os.Expand(template, func(k string) string {
		v, ok := params[k]
		if !ok {
			missing = append(missing, k)
		}
		return v
	})
	if len(missing) > 0 {
		sort.Strings(missing)
		return "", fmt.Errorf("%q: unknown tokens %s", template, strings.Join(missing, ", "))
	}
	return out, nil
}
