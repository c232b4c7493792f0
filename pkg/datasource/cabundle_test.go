package datasource_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestStageS3PrivateCA: a dataset on an HTTPS endpoint with a private CA stages when its class
// names the CA bundle of the administrator's directory (--s3-ca-bundles), and fails, as a
// configuration error, without it.
func TestStageS3PrivateCA(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3TLS(t, "")
	s.Bucket(t, "data")
	want := smallTree(7, 5, 2000)
	want.upload(t, s.S3, "data", "set/")
	bundles := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundles, "private-ca.pem"), s.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("with the bundle", func(t *testing.T) {
		pool := t.TempDir()
		m := newManager(t, datasource.Config{S3CABundleDir: bundles})
		params := s3Params(s.S3, "", "s3://data/set")
		params["caBundle"] = "private-ca.pem"
		spec := mustSpec(t, params)
		if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s.S3), Pool: pool}); err != nil {
			t.Fatal(err)
		}
		tree, err := m.TreePath(pool, spec)
		if err != nil {
			t.Fatal(err)
		}
		checkTree(t, tree, want)
	})
	for _, tc := range []struct {
		name    string
		dir     string
		bundle  string
		wantMsg string
	}{
		{"failure case - no bundle named", bundles, "", "certificate is not trusted"},
		{"failure case - bundle not in the directory", bundles, "other.pem", `CA bundle "other.pem" is not in`},
		{"failure case - driver without a bundle directory", "", "private-ca.pem", "no --s3-ca-bundles directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := t.TempDir()
			m := newManager(t, datasource.Config{S3CABundleDir: tc.dir})
			params := s3Params(s.S3, "", "s3://data/set")
			if tc.bundle != "" {
				params["caBundle"] = tc.bundle
			}
			_, err := stage(ctx, t, m, datasource.Request{Spec: mustSpec(t, params), Creds: creds(s.S3), Pool: pool})
			if datasource.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("got %v (%v), want InvalidArgument containing %q", datasource.Code(err), err, tc.wantMsg)
			}
			if ents, _ := os.ReadDir(filepath.Join(pool, datasource.CacheDirName)); len(ents) != 0 {
				t.Fatalf("left behind: %v", ents)
			}
		})
	}
}

// TestStageS3PlainHTTPRefused: a plain-HTTP endpoint off the node is refused before any
// connection unless the driver allows it.
func TestStageS3PlainHTTPRefused(t *testing.T) {
	ctx := testCtx(t)
	m := newManager(t, datasource.Config{})
	// TEST-NET-1: nothing answers there; the refusal comes before any dial.
	spec := mustSpec(t, map[string]string{"source": "s3://data/set", "endpoint": "http://192.0.2.1:9000"})
	_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: t.TempDir()})
	if datasource.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "--s3-allow-plain-http") {
		t.Fatalf("got %v (%v), want PermissionDenied naming --s3-allow-plain-http", datasource.Code(err), err)
	}
}
