package datasource_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// podContext is NodePublishVolume's volume context for a pod with a token for audience.
func podContext(t *testing.T, pod, audience, token string) map[string]string {
	t.Helper()
	ns, name, _ := strings.Cut(pod, "/")
	b, err := json.Marshal(map[string]map[string]string{audience: {"token": token, "expirationTimestamp": "2030-01-01T00:00:00Z"}})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{"csi.storage.k8s.io/serviceAccount.tokens": string(b),
		"csi.storage.k8s.io/pod.namespace": ns, "csi.storage.k8s.io/pod.name": name}
}

// TestWebIdentityTenants: a private dataset staged for a pod through its ServiceAccount's role
// (no Secret) is served from the cache to another pod only after that pod's own exchange and
// proof: a pod of a ServiceAccount the role does not trust is refused even though the data is
// on the node, and a pod whose role the STS grants other keys is a principal of its own, refused
// when those keys cannot read the bucket.
func TestWebIdentityTenants(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "private")
	want := smallTree(11, 8, 1500)
	want.upload(t, s, "private", "set/")
	const audience = datasource.DefaultWebIdentityAudience
	const roleA, roleB = "arn:aws:iam::000000000000:role/team-a", "arn:aws:iam::000000000000:role/team-b"
	issuer := testpeers.StartOIDCIssuer(t)
	sts := testpeers.StartSTS(t, issuer.URL, audience, map[string]testpeers.Role{
		roleA: {Trusts: []string{"system:serviceaccount:team-a:trainer", "system:serviceaccount:team-a:eval"}, AccessKey: s.AccessKey, SecretKey: s.SecretKey},
		roleB: {Trusts: []string{"system:serviceaccount:team-b:trainer"}, AccessKey: s.AccessKey, SecretKey: "not-the-secret"},
	})
	pool := t.TempDir()
	m := newManager(t, datasource.Config{STSEndpoint: sts.URL, AccessProofTTL: time.Hour})
	ds := datasource.NewDatasets(m, nil)
	stageAs := func(sa, role string) error {
		params := s3Params(s, "", "s3://private/set")
		params["credentials"], params["roleARN"] = "webIdentity", role
		spec := mustSpec(t, params)
		vc := podContext(t, sa+"-pod", audience, issuer.Token(t, sa, audience))
		creds, err := ds.Credentials(context.Background(), spec, nil, vc)
		if err != nil {
			return err
		}
		if creds.AccessKeyID != "" || creds.RoleARN != role {
			t.Fatalf("credentials %+v", creds)
		}
		_, err = stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds, Pool: pool})
		return err
	}

	if err := stageAs("team-a/trainer", roleA); err != nil {
		t.Fatalf("the trusted ServiceAccount: %v", err)
	}
	tree, err := m.TreePath(pool, mustSpec(t, s3Params(s, "", "s3://private/set")))
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, tree, want)
	exchanges := sts.Exchanges()

	if err := stageAs("team-a/eval", roleA); err != nil {
		t.Fatalf("another ServiceAccount the role trusts: %v", err)
	}
	if sts.Exchanges() == exchanges {
		t.Error("a second pod was served from the cache without its own exchange")
	}
	for _, tc := range []struct{ name, sa, role string }{
		{"failure case - a ServiceAccount the role does not trust", "team-b/trainer", roleA},
		{"failure case - a role whose keys cannot read the bucket", "team-b/trainer", roleB},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := stageAs(tc.sa, tc.role)
			if datasource.Code(err) != codes.PermissionDenied {
				t.Fatalf("got %v (%v), want PermissionDenied although the dataset is cached", datasource.Code(err), err)
			}
		})
	}

	t.Run("failure case - no token for the audience", func(t *testing.T) {
		params := s3Params(s, "", "s3://private/set")
		params["credentials"], params["roleARN"] = "webIdentity", roleA
		spec := mustSpec(t, params)
		for _, vc := range []map[string]string{
			nil, // NodeStageVolume: no pod
			podContext(t, "team-a/trainer-pod", "cistern-peer", issuer.Token(t, "team-a/trainer", "cistern-peer")),
		} {
			_, err := ds.Credentials(context.Background(), spec, nil, vc)
			if datasource.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "tokenRequests") {
				t.Fatalf("got %v (%v), want InvalidArgument naming tokenRequests", datasource.Code(err), err)
			}
		}
	})
}
