package workloads_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/framework"
)

// TestExplainShowsFieldDocs: the CRDs carry their fields' Go doc comments, and kubectl explain
// shows them from the API server's published schema, for each Cistern CRD.
func TestExplainShowsFieldDocs(t *testing.T) {
	cp := setup(t)
	for _, tc := range []struct{ field, apiVersion, want string }{
		{"leaderworkersets.spec.leaderWorkerTemplate.size", "workloads.cistern.dev/v1alpha1", "number of pods"},
		{"leaderworkersets.spec.leaderWorkerTemplate.schedulingPolicy.replicaUniqueNodeSelector", "workloads.cistern.dev/v1alpha1", ""},
		{"leaderworkersets.status.conditions", "workloads.cistern.dev/v1alpha1", ""},
		{"notebookvalidationjobs.spec.goldenNotebook.ignorePatterns", "workloads.cistern.dev/v1alpha1", "regular expressions"},
		{"notebookvalidationjobs.spec.notebook.git.ref", "workloads.cistern.dev/v1alpha1", "commit SHA"},
		{"volumemanagers.spec.volumes.replicas", "data.cistern.dev/v1alpha1", ""},
	} {
		// The API server publishes a new CRD's OpenAPI schema a moment after the CRD is
		// Established; until then explain answers "couldn't find resource".
		var out string
		framework.Eventually(t, time.Minute, "kubectl explain "+tc.field, func(context.Context) error {
			var err error
			if out, err = framework.KubectlOutput(cp, "", "explain", tc.field, "--api-version", tc.apiVersion); err != nil {
				return fmt.Errorf("%w\n%s", err, out)
			}
			return nil
		})
		_, desc, ok := strings.Cut(out, "DESCRIPTION:")
		desc = strings.TrimSpace(desc)
		if !ok || desc == "" || strings.HasPrefix(desc, "<empty>") || !strings.Contains(strings.Join(strings.Fields(desc), " "), tc.want) {
			t.Errorf("kubectl explain %s: no description (want %q):\n%s", tc.field, tc.want, out)
		}
	}
}
