package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const certManagerOn = "workloadController: {webhook: {certManager: {enabled: true}}}"

// TestChartWebhookCertManager: workloadController.webhook.certManager renders cert-manager's
// Certificate for the webhook Service into a Secret of its own (not the controller's Opaque one),
// signed by a CA of the release's own (self-signed Issuer, CA Certificate, CA Issuer) or by the
// issuerRef given; the webhook configurations take their CA from it (inject-ca-from); the
// controller mounts the Secret where it serves from and is told not to provision; and its roles
// lose exactly the rules on Secrets and webhook configurations it needed to.
func TestChartWebhookCertManager(t *testing.T) {
	const ns = "storage"
	def := renderChart(t, ns, "")
	got := renderChart(t, ns, certManagerOn)

	for _, k := range []string{"Issuer storage/cistern-webhook-selfsigned", "Certificate storage/cistern-webhook-ca",
		"Issuer storage/cistern-webhook-ca", "Certificate storage/cistern-workload-webhook"} {
		if got[k] == nil {
			t.Errorf("no %s", k)
		}
		if def[k] != nil {
			t.Errorf("the defaults render %s", k)
		}
		if v := got[k]["apiVersion"]; v != "cert-manager.io/v1" {
			t.Errorf("%s: apiVersion %v", k, v)
		}
	}
	if nested(got["Certificate storage/cistern-webhook-ca"], "spec", "isCA") != true ||
		nested(got["Certificate storage/cistern-webhook-ca"], "spec", "issuerRef", "name") != "cistern-webhook-selfsigned" ||
		nested(got["Issuer storage/cistern-webhook-selfsigned"], "spec", "selfSigned") == nil ||
		nested(got["Issuer storage/cistern-webhook-ca"], "spec", "ca", "secretName") != nested(got["Certificate storage/cistern-webhook-ca"], "spec", "secretName") {
		t.Errorf("the release's CA is not a self-signed CA Certificate backing the CA Issuer:\n%v\n%v", got["Certificate storage/cistern-webhook-ca"], got["Issuer storage/cistern-webhook-ca"])
	}
	serving := got["Certificate storage/cistern-workload-webhook"]
	if d := cmp.Diff(map[string]any{"name": "cistern-webhook-ca", "kind": "Issuer", "group": "cert-manager.io"}, nested(serving, "spec", "issuerRef")); d != "" {
		t.Errorf("serving certificate's issuerRef (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]any{"cistern-workload-webhook.storage.svc", "cistern-workload-webhook.storage.svc.cluster.local"}, nested(serving, "spec", "dnsNames")); d != "" {
		t.Errorf("serving certificate's dnsNames (-want +got):\n%s", d)
	}
	secret := nested(serving, "spec", "secretName")
	if secret != "cistern-workload-webhook-tls" {
		t.Errorf("serving certificate's Secret %v", secret)
	}
	// The Service the configurations call is the one the certificate names.
	if def["Service storage/cistern-workload-webhook"] == nil {
		t.Error("no webhook Service cistern-workload-webhook")
	}

	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		k := kind + " /cistern-workload-controller"
		if a := nested(got[k], "metadata", "annotations", "cert-manager.io/inject-ca-from"); a != "storage/cistern-workload-webhook" {
			t.Errorf("%s: inject-ca-from %v, want storage/cistern-workload-webhook", k, a)
		}
		if a := nested(def[k], "metadata", "annotations", "cert-manager.io/inject-ca-from"); a != nil {
			t.Errorf("the defaults annotate %s with inject-ca-from %v", k, a)
		}
	}

	spec := pods(got)["Deployment storage/cistern-workload-controller"]
	c := containers(spec)[0]
	args := c["args"].([]any)
	if !slices.Contains(args, any("--webhook-cert-provisioning=false")) {
		t.Errorf("the controller is not told to serve a mounted certificate: %v", args)
	}
	dir := ""
	for _, a := range args {
		if v, ok := strings.CutPrefix(a.(string), "--webhook-cert-dir="); ok {
			dir = v
		}
		if strings.HasPrefix(a.(string), "--webhook-secret-name=") {
			t.Errorf("the controller is given a Secret to keep: %s", a)
		}
	}
	mounted := false
	for _, m := range c["volumeMounts"].([]any) {
		m := m.(map[string]any)
		if m["mountPath"] != dir {
			continue
		}
		for _, v := range spec["volumes"].([]any) {
			v := v.(map[string]any)
			if v["name"] == m["name"] && nested(v, "secret", "secretName") == secret && m["readOnly"] == true {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("Secret %v is not mounted read-only at --webhook-cert-dir %q: %v %v", secret, dir, c["volumeMounts"], spec["volumes"])
	}

	// Least privilege: only the rules on Secrets and webhook configurations go.
	for _, k := range []string{"ClusterRole /cistern-workload-controller", "Role storage/cistern-workload-controller"} {
		var kept []any
		dropped := 0
		for _, r := range def[k]["rules"].([]any) {
			r := r.(map[string]any)
			groups, _ := r["apiGroups"].([]any)
			resources, _ := r["resources"].([]any)
			if slices.Contains(groups, any("admissionregistration.k8s.io")) || slices.Contains(resources, any("secrets")) {
				dropped++
				continue
			}
			kept = append(kept, r)
		}
		if dropped == 0 {
			t.Errorf("%s of the defaults has no rule on Secrets or webhook configurations to drop", k)
		}
		if d := cmp.Diff(kept, got[k]["rules"]); d != "" {
			t.Errorf("%s with cert-manager (-defaults less Secrets and webhook configurations +got):\n%s", k, d)
		}
	}

	// An issuer of the cluster's: no CA of the release's own.
	got = renderChart(t, ns, "workloadController: {webhook: {certManager: {enabled: true, issuerRef: {name: corp-ca, kind: ClusterIssuer}}}}")
	for _, k := range []string{"Issuer storage/cistern-webhook-selfsigned", "Certificate storage/cistern-webhook-ca", "Issuer storage/cistern-webhook-ca"} {
		if got[k] != nil {
			t.Errorf("with an issuerRef, the chart renders %s", k)
		}
	}
	if d := cmp.Diff(map[string]any{"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"},
		nested(got["Certificate storage/cistern-workload-webhook"], "spec", "issuerRef")); d != "" {
		t.Errorf("serving certificate's issuerRef (-want +got):\n%s", d)
	}
}
