package chart

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// everyPod renders every pod the chart can make: both components and a labelled pools profile.
const everyPod = "snapshots: {enabled: true}\nleaderWorkerSet: {upstreamAPI: true}\npools: {labelledProfiles: [nvme]}\n"

// TestChartPodSettings: the settings every pod and container of the chart takes reach each of
// them: pull secrets, pod annotations, the extra (proxy) variables besides the container's own.
func TestChartPodSettings(t *testing.T) {
	objs := helmObjects(t, everyPod, `
imagePullSecrets: [{name: regcred}]
podAnnotations: {example.com/team: storage}
env: [{name: HTTPS_PROXY, value: "http://proxy.example.com:3128"}, {name: NO_PROXY, value: .svc}]
`)
	ps := pods(objs)
	if len(ps) != 4 {
		t.Errorf("%d pod templates, want 4 (two node DaemonSets, the FUSE keeper, the controller): %v", len(ps), slices.Sorted(maps.Keys(ps)))
	}
	for k, spec := range ps {
		if d := cmp.Diff([]any{map[string]any{"name": "regcred"}}, spec["imagePullSecrets"]); d != "" {
			t.Errorf("%s: imagePullSecrets (-want +got):\n%s", k, d)
		}
		annotations, _ := nested(objs[k], "spec", "template", "metadata", "annotations").(map[string]any)
		if annotations["example.com/team"] != "storage" {
			t.Errorf("%s: pod annotations %v", k, annotations)
		}
		for _, c := range containers(spec) {
			// (parse sorts them by name.)
			env, _ := c["env"].([]any)
			vars := map[string]any{}
			for _, e := range env {
				vars[e.(map[string]any)["name"].(string)] = e.(map[string]any)["value"]
			}
			if vars["HTTPS_PROXY"] != "http://proxy.example.com:3128" || vars["NO_PROXY"] != ".svc" {
				t.Errorf("%s: container %s has variables %v, want HTTPS_PROXY and NO_PROXY", k, c["name"], vars)
			}
		}
	}
}

// TestChartServiceAccounts: each ServiceAccount a pod runs as takes its annotations (a cloud
// role, as EKS's IRSA reads it).
func TestChartServiceAccounts(t *testing.T) {
	objs := helmObjects(t, `
node: {serviceAccount: {annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::1:role/node"}}}
workloadController: {serviceAccount: {annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::1:role/controller"}}}
`)
	for sa, role := range map[string]string{"cistern-node": "node", "cistern-workload-controller": "controller"} {
		annotations, _ := nested(objs["ServiceAccount "+namespace+"/"+sa], "metadata", "annotations").(map[string]any)
		if annotations["eks.amazonaws.com/role-arn"] != "arn:aws:iam::1:role/"+role {
			t.Errorf("ServiceAccount %s: annotations %v", sa, annotations)
		}
	}
}

// TestChartControllerScheduling: the controller's scheduling values reach its pod, its default
// resources request something, and its two replicas have a PodDisruptionBudget of one (none
// with one replica, whose budget would block every drain).
func TestChartControllerScheduling(t *testing.T) {
	const deployment = "Deployment " + namespace + "/cistern-workload-controller"
	const pdb = "PodDisruptionBudget " + namespace + "/cistern-workload-controller"
	objs := helmObjects(t)
	spec := pods(objs)[deployment]
	requests, _ := nested(containers(spec)[0], "resources", "requests").(map[string]any)
	if requests["cpu"] == nil || requests["memory"] == nil {
		t.Errorf("the controller requests %v, want cpu and memory", requests)
	}
	if got := nested(objs[pdb], "spec", "minAvailable"); got != float64(1) {
		t.Errorf("%s minAvailable %v, want 1", pdb, got)
	}
	if d := cmp.Diff(nested(objs[deployment], "spec", "selector", "matchLabels"), nested(objs[pdb], "spec", "selector", "matchLabels")); d != "" {
		t.Errorf("the budget selects other pods than the Deployment's:\n%s", d)
	}
	if objs := helmObjects(t, "workloadController: {replicas: 1}"); objs[pdb] != nil {
		t.Errorf("one replica rendered %s", pdb)
	}

	set := map[string]any{
		"nodeSelector":      map[string]any{"node-role.kubernetes.io/control-plane": ""},
		"tolerations":       []any{map[string]any{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}},
		"affinity":          map[string]any{"podAntiAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{"topologyKey": "kubernetes.io/hostname"}}}},
		"priorityClassName": "system-cluster-critical",
	}
	values := "workloadController:\n"
	for k, v := range set {
		values += fmt.Sprintf("  %s: %s\n", k, toJSON(t, v))
	}
	spec = pods(helmObjects(t, values))[deployment]
	for k, want := range set {
		if d := cmp.Diff(want, spec[k]); d != "" {
			t.Errorf("the controller's %s (-want +got):\n%s", k, d)
		}
	}
}

// TestChartImages: every image of the chart's pods, and the images the controller gives its
// notebook comparison and stager pods, is image.registry's or a CSI sidecar's of
// registry.k8s.io; none names Docker Hub, where the project owns no namespace.
func TestChartImages(t *testing.T) {
	objs := helmObjects(t, everyPod, "image: {registry: mirror.example.com/cistern, tag: v9.9.9}")
	sidecars := map[string]bool{}
	for _, img := range []string{"csi-node-driver-registrar", "csi-provisioner", "livenessprobe", "csi-snapshotter"} {
		sidecars[img] = false
	}
	for k, spec := range pods(objs) {
		for _, c := range containers(spec) {
			images := []string{c["image"].(string)}
			env, _ := c["env"].([]any)
			for _, e := range env {
				if n := e.(map[string]any)["name"].(string); n == "COMPARE_IMAGE" || n == "STAGER_IMAGE" {
					images = append(images, e.(map[string]any)["value"].(string))
				}
			}
			for _, img := range images {
				repo, _, _ := strings.Cut(img, ":")
				switch {
				case strings.HasPrefix(img, "mirror.example.com/cistern/") && strings.HasSuffix(img, ":v9.9.9"):
				case strings.HasPrefix(img, "registry.k8s.io/sig-storage/"):
					sidecars[repo[strings.LastIndex(repo, "/")+1:]] = true
				default:
					t.Errorf("%s: container %s names %s, neither image.registry's nor a CSI sidecar", k, c["name"], img)
				}
			}
		}
	}
	for img, seen := range sidecars {
		if !seen {
			t.Errorf("no container runs %s", img)
		}
	}
}

// TestChartPodSecurity: every pod runs with the runtime's default seccomp profile, and every pod
// but the node plugin's (privileged: loop devices, mounts) meets the restricted Pod Security
// Standard, as the API server's pod security admission checks it. The FUSE keeper is the one
// other exception, for its hostPath: its socket directory must outlive the plugin's pods, and a
// hostPath, which no Pod Security level but privileged admits, is the only volume that does; it
// runs as root, the owner of that directory, with no capability (docs/upgrading.md).
func TestChartPodSecurity(t *testing.T) {
	for k, spec := range pods(helmObjects(t, everyPod)) {
		if got := nested(spec, "securityContext", "seccompProfile", "type"); got != "RuntimeDefault" {
			t.Errorf("%s: seccompProfile %v, want RuntimeDefault", k, got)
		}
		if strings.Contains(k, "/cistern-node") {
			continue
		}
		exempt := map[string]bool{}
		if strings.HasSuffix(k, "/cistern-fuse-keeper") {
			exempt = map[string]bool{"hostPath": true, "runAsNonRoot": true}
		}
		for _, v := range restrictedViolations(spec) {
			if !exempt[strings.Fields(v)[0]] {
				t.Errorf("%s: not restricted: %s", k, v)
			}
		}
	}
}

// TestChartControllerNonRoot: the controller can run as a user other than root: it binds only
// ports above 1024 (the webhook, metrics and probe ports, and the metrics bind address), and the
// only path it writes is an emptyDir under its read-only root filesystem.
func TestChartControllerNonRoot(t *testing.T) {
	spec := pods(helmObjects(t))["Deployment "+namespace+"/cistern-workload-controller"]
	c := containers(spec)[0]
	ports, _ := c["ports"].([]any)
	for _, p := range ports {
		if n := p.(map[string]any)["containerPort"].(float64); n <= 1024 {
			t.Errorf("the controller listens on port %v", n)
		}
	}
	for _, a := range c["args"].([]any) {
		arg := a.(string)
		if strings.HasPrefix(arg, "--webhook-port=") || strings.HasPrefix(arg, "--metrics-bind-address=") {
			_, value, _ := strings.Cut(arg, "=")
			port, err := strconv.Atoi(value[strings.LastIndex(value, ":")+1:])
			if err != nil || port <= 1024 {
				t.Errorf("the controller binds %s", arg)
			}
		}
	}
	if nested(spec, "securityContext", "runAsUser") != float64(65532) || nested(c, "securityContext", "readOnlyRootFilesystem") != true {
		t.Errorf("the controller runs as %v with a read-only root filesystem %v", nested(spec, "securityContext", "runAsUser"), nested(c, "securityContext", "readOnlyRootFilesystem"))
	}
	for _, v := range spec["volumes"].([]any) {
		if v.(map[string]any)["emptyDir"] == nil {
			t.Errorf("the controller mounts %v", v)
		}
	}
	// A port at or under 1024 would need root or CAP_NET_BIND_SERVICE: the schema refuses it.
	if out, err := helmTemplate(t, "metrics: {controllerPort: 443}"); err == nil {
		t.Errorf("metrics.controllerPort 443 rendered:\n%s", out)
	}
}

// restrictedViolations are the ways a pod spec breaks the restricted Pod Security Standard
// (https://kubernetes.io/docs/concepts/security/pod-security-standards/, v1.37), each starting
// with the field's name.
func restrictedViolations(spec map[string]any) []string {
	var vs []string
	for _, f := range []string{"hostNetwork", "hostPID", "hostIPC"} {
		if spec[f] == true {
			vs = append(vs, f+" true")
		}
	}
	vols, _ := spec["volumes"].([]any)
	allowed := []string{"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
	for _, v := range vols {
		for field := range v.(map[string]any) {
			if field != "name" && !slices.Contains(allowed, field) {
				vs = append(vs, fmt.Sprintf("%s volume %v", field, v.(map[string]any)["name"]))
			}
		}
	}
	podNonRoot := nested(spec, "securityContext", "runAsNonRoot") == true
	podSeccomp := nested(spec, "securityContext", "seccompProfile", "type")
	for _, c := range containers(spec) {
		name := c["name"]
		sc, _ := c["securityContext"].(map[string]any)
		if sc["privileged"] == true {
			vs = append(vs, fmt.Sprintf("privileged container %v", name))
		}
		if sc["allowPrivilegeEscalation"] != false {
			vs = append(vs, fmt.Sprintf("allowPrivilegeEscalation of container %v: %v", name, sc["allowPrivilegeEscalation"]))
		}
		drop, _ := nested(sc, "capabilities", "drop").([]any)
		if !slices.Contains(drop, any("ALL")) {
			vs = append(vs, fmt.Sprintf("capabilities of container %v drop %v, not ALL", name, drop))
		}
		add, _ := nested(sc, "capabilities", "add").([]any)
		for _, a := range add {
			if a != "NET_BIND_SERVICE" {
				vs = append(vs, fmt.Sprintf("capabilities of container %v add %v", name, a))
			}
		}
		if nonRoot, set := sc["runAsNonRoot"]; nonRoot == false || (!set && !podNonRoot) {
			vs = append(vs, fmt.Sprintf("runAsNonRoot of container %v not true", name))
		}
		if uid, ok := sc["runAsUser"]; ok && uid == float64(0) {
			vs = append(vs, fmt.Sprintf("runAsUser of container %v 0", name))
		}
		seccomp := podSeccomp
		if t := nested(sc, "seccompProfile", "type"); t != nil {
			seccomp = t
		}
		if seccomp != "RuntimeDefault" && seccomp != "Localhost" {
			vs = append(vs, fmt.Sprintf("seccompProfile of container %v: %v", name, seccomp))
		}
		ports, _ := c["ports"].([]any)
		for _, p := range ports {
			if hp := p.(map[string]any)["hostPort"]; hp != nil && hp != float64(0) {
				vs = append(vs, fmt.Sprintf("hostPort %v of container %v", hp, name))
			}
		}
	}
	if uid := nested(spec, "securityContext", "runAsUser"); uid == float64(0) {
		vs = append(vs, "runAsUser 0")
	}
	return vs
}

func toJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
