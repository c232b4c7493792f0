package datasource

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

func TestParseParams(t *testing.T) {
	for _, tc := range []struct {
		name      string
		params    map[string]string
		ephemeral bool
		wantCode  codes.Code
		check     func(t *testing.T, s *Spec)
	}{
		{name: "no source", params: map[string]string{"pool": "fast"}, check: func(t *testing.T, s *Spec) {
			if s != nil {
				t.Fatalf("spec %+v, want nil", s)
			}
		}},
		{name: "s3 with everything", params: map[string]string{
			"source": "s3://models/llama/7b/", "endpoint": "http://minio:9000", "region": "eu-west-1",
			"pathStyle": "true", "include": "*.safetensors, *.json", "exclude": "old/**",
			"pool": "fast", "csi.storage.k8s.io/pvc/name": "x",
		}, check: func(t *testing.T, s *Spec) {
			if s.Bucket != "models" || s.Prefix != "llama/7b/" || !s.PathStyle || len(s.Include) != 2 || len(s.Exclude) != 1 {
				t.Fatalf("bad spec %+v", s)
			}
		}},
		{name: "s3 whole bucket", params: map[string]string{"source": "s3://data"}, check: func(t *testing.T, s *Spec) {
			if s.Bucket != "data" || s.Prefix != "" {
				t.Fatalf("bad spec %+v", s)
			}
		}},
		{name: "nfs", params: map[string]string{"source": "nfs://filer:2049/export/data"}, check: func(t *testing.T, s *Spec) {
			if s.Host != "filer:2049" || s.Path != "/export/data" {
				t.Fatalf("bad spec %+v", s)
			}
		}},
		{name: "file", params: map[string]string{"source": "file:///srv/datasets/imagenet"}, check: func(t *testing.T, s *Spec) {
			if s.Path != "/srv/datasets/imagenet" {
				t.Fatalf("bad spec %+v", s)
			}
		}},
		{name: "failure case - unknown key", params: map[string]string{"source": "s3://b", "bucket": "x"}, wantCode: codes.InvalidArgument},
		{name: "failure case - endpoint without source", params: map[string]string{"endpoint": "http://x"}, wantCode: codes.InvalidArgument},
		{name: "failure case - bad scheme", params: map[string]string{"source": "http://x/y"}, wantCode: codes.InvalidArgument},
		{name: "failure case - credentials in URL", params: map[string]string{"source": "s3://AKIA:secret@bucket/x"}, wantCode: codes.InvalidArgument},
		{name: "failure case - traversal in prefix", params: map[string]string{"source": "s3://b/a/../../x"}, wantCode: codes.InvalidArgument},
		{name: "failure case - traversal in file path", params: map[string]string{"source": "file:///srv/../etc"}, wantCode: codes.InvalidArgument},
		{name: "failure case - bad pathStyle", params: map[string]string{"source": "s3://b", "pathStyle": "yes please"}, wantCode: codes.InvalidArgument},
		{name: "failure case - bad endpoint", params: map[string]string{"source": "s3://b", "endpoint": "minio:9000"}, wantCode: codes.InvalidArgument},
		{name: "failure case - endpoint on nfs", params: map[string]string{"source": "nfs://h/x", "endpoint": "http://x"}, wantCode: codes.InvalidArgument},
		{name: "failure case - file in ephemeral volume", params: map[string]string{"source": "file:///srv/x"}, ephemeral: true, wantCode: codes.PermissionDenied},
		{name: "failure case - bad glob", params: map[string]string{"source": "s3://b", "include": "[a"}, wantCode: codes.InvalidArgument},
		{name: "failure case - too many globs", params: map[string]string{"source": "s3://b", "exclude": strings.Repeat("a,", 65)}, wantCode: codes.InvalidArgument},
		{name: "failure case - glob too deep", params: map[string]string{"source": "s3://b", "include": strings.Repeat("**/", 40) + "x"}, wantCode: codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseParams(tc.params, tc.ephemeral)
			if got := Code(err); got != tc.wantCode {
				t.Fatalf("ParseParams: code %v (%v), want %v", got, err, tc.wantCode)
			}
			if tc.check != nil {
				tc.check(t, s)
			}
		})
	}
}

func TestSpecID(t *testing.T) {
	a, _ := ParseParams(map[string]string{"source": "s3://b/p", "pool": "x"}, false)
	b, _ := ParseParams(map[string]string{"source": "s3://b/p/", "pool": "y"}, false)
	c, _ := ParseParams(map[string]string{"source": "s3://b/p", "include": "*.json"}, false)
	if a.ID() != b.ID() {
		t.Fatal("the same dataset in two pools must share an ID")
	}
	if a.ID() == c.ID() {
		t.Fatal("different filters must not share an ID")
	}
}

func TestCredentialsFromSecrets(t *testing.T) {
	c, err := CredentialsFromSecrets(map[string]string{"accessKeyID": "a", "secretAccessKey": "s", "other": "x"})
	if err != nil || c.AccessKeyID != "a" || c.SecretAccessKey != "s" {
		t.Fatalf("got %+v, %v", c, err)
	}
	if c.String() == "a" || c.String() == "s" {
		t.Fatal("credentials leak into String")
	}
	if _, err := CredentialsFromSecrets(map[string]string{"accessKeyID": "a"}); Code(err) != codes.InvalidArgument {
		t.Fatalf("half a key pair: %v", err)
	}
}
