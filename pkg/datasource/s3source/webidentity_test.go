package s3source

import (
	"context"
	"strings"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestWebIdentity: a pod's ServiceAccount token, exchanged at an STS that verifies it against
// the issuer's OIDC discovery and JWKS, reads a private bucket with the role's keys; a token of
// a ServiceAccount the role does not trust, a forged token and one for another audience are
// refused as Denied, and no request reaches the bucket anonymously.
func TestWebIdentity(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "private")
	s.Put(t, "private", "set/a.bin", []byte("only for team-a"))
	const audience, role = "sts.amazonaws.com", "arn:aws:iam::000000000000:role/team-a-datasets"
	issuer := testpeers.StartOIDCIssuer(t)
	sts := testpeers.StartSTS(t, issuer.URL, audience, map[string]testpeers.Role{
		role: {Trusts: []string{"system:serviceaccount:team-a:trainer"}, AccessKey: s.AccessKey, SecretKey: s.SecretKey},
	})
	list := func(token string) ([]source.Object, error) {
		src, err := New(Config{Bucket: "private", Prefix: "set/", Endpoint: s.Endpoint, PathStyle: true,
			WebIdentity: &WebIdentity{RoleARN: role, Token: StaticToken(token), STSEndpoint: sts.URL, SessionName: "team-a-trainer-pod"}})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		var objs []source.Object
		err = src.List(context.Background(), func(o source.Object) error { objs = append(objs, o); return nil })
		return objs, err
	}

	objs, err := list(issuer.Token(t, "team-a/trainer", audience))
	if err != nil || len(objs) != 1 || objs[0].Key != "a.bin" {
		t.Fatalf("the trusted ServiceAccount's token: %v %+v", err, objs)
	}
	if sts.Exchanges() != 1 {
		t.Fatalf("%d exchanges, want 1 (the keys are cached for the listing's requests)", sts.Exchanges())
	}
	for _, tc := range []struct{ name, token string }{
		{"failure case - a ServiceAccount the role does not trust", issuer.Token(t, "team-b/trainer", audience)},
		{"failure case - a forged token", issuer.ForgedToken(t, "team-a/trainer", audience)},
		{"failure case - another audience", issuer.Token(t, "team-a/trainer", "cistern-peer")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := list(tc.token)
			if source.KindOf(err) != source.Denied || !strings.Contains(err.Error(), "access denied") {
				t.Fatalf("got %v (%v), want Denied", source.KindOf(err), err)
			}
		})
	}
	if sts.Exchanges() != 1 {
		t.Fatalf("%d exchanges, want only the trusted one", sts.Exchanges())
	}
}
