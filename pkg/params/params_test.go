package params

import (
	"errors"
	"strings"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// kind is the error's source.Kind; -1 for no error.
func kind(err error) source.Kind {
	if err == nil {
		return -1
	}
	var e *source.Error
	if !errors.As(err, &e) {
		return -2
	}
	return e.Kind
}

func TestParseDataset(t *testing.T) {
	for _, tc := range []struct {
		name      string
		params    map[string]string
		ephemeral bool
		wantKind  source.Kind
		check     func(t *testing.T, s *Dataset)
	}{
		{name: "no source", params: map[string]string{"pool": "fast"}, check: func(t *testing.T, s *Dataset) {
			if s != nil {
				t.Fatalf("spec %+v, want nil", s)
			}
		}},
		{name: "s3 with everything", params: map[string]string{
			"source": "s3://models/llama/7b/", "endpoint": "http://minio:9000", "region": "eu-west-1",
			"pathStyle": "true", "include": "*.safetensors, *.json", "exclude": "old/**",
			"pool": "fast", "csi.storage.k8s.io/pvc/name": "x",
		}, check: func(t *testing.T, s *Dataset) {
			if s.Bucket != "models" || s.Prefix != "llama/7b/" || !s.PathStyle || len(s.Include) != 2 || len(s.Exclude) != 1 {
				t.Fatalf("bad spec %+v", s)
			}
		}},
		{name: "s3 whole bucket", params: map[string]string{"source": "s3://data"}, check: func(t *testing.T, s *Dataset) {
			if s.Bucket != "data" || s.Prefix != "" {
				t.Fatalf("bad spec %+v", s)
			}
		}},
		{name: "nfs", params: map[string]string{"source": "nfs://filer:2049/export/data"}, check: func(t *testing.T, s *Dataset) {
			if s.Host != "filer:2049" || s.Path != "/export/data" {
				t.Fatalf("bad spec %+v", s)
			}
		}},
		{name: "nfs version 4", params: map[string]string{"source": "nfs://filer/data", "nfsVersion": "4"}, ephemeral: true, check: func(t *testing.T, s *Dataset) {
			v3 := *s
			v3.NFSVersion = ""
			if s.NFSVersion != "4" || s.Host != "filer" || s.Path != "/data" || s.ID() == v3.ID() {
				t.Fatalf("bad spec %+v (NFSv4 and NFSv3 paths are distinct datasets)", s)
			}
		}},
		{name: "nfs version 3 is the default", params: map[string]string{"source": "nfs://filer/data", "nfsVersion": "3"}, check: func(t *testing.T, s *Dataset) {
			if s.NFSVersion != "" || s.ID() != (&Dataset{Source: s.Source, Scheme: SchemeNFS, Host: "filer", Path: "/data"}).ID() {
				t.Fatalf("bad spec %+v (nfsVersion=3 names the same dataset as no nfsVersion)", s)
			}
		}},
		{name: "failure case - nfs version 4.1", params: map[string]string{"source": "nfs://filer/data", "nfsVersion": "4.1"}, wantKind: source.Invalid},
		{name: "failure case - nfsVersion on s3", params: map[string]string{"source": "s3://b", "nfsVersion": "4"}, wantKind: source.Invalid},
		{name: "failure case - nfsVersion on file", params: map[string]string{"source": "file:///srv/x", "nfsVersion": "4"}, wantKind: source.Invalid},
		{name: "failure case - nfsVersion without source", params: map[string]string{"nfsVersion": "4"}, wantKind: source.Invalid},
		{name: "file", params: map[string]string{"source": "file:///srv/datasets/imagenet"}, check: func(t *testing.T, s *Dataset) {
			if s.Path != "/srv/datasets/imagenet" {
				t.Fatalf("bad spec %+v", s)
			}
		}},
		{name: "caBundle", params: map[string]string{"source": "s3://b", "endpoint": "https://minio:9000", "caBundle": "minio-ca.pem"}, check: func(t *testing.T, s *Dataset) {
			plain := *s
			plain.CABundle = ""
			if s.CABundle != "minio-ca.pem" || s.ID() != plain.ID() {
				t.Fatalf("bad spec %+v (the bundle must not change the dataset's identity)", s)
			}
		}},
		{name: "failure case - caBundle with a path", params: map[string]string{"source": "s3://b", "endpoint": "https://minio:9000", "caBundle": "../etc/ca.pem"}, wantKind: source.Invalid},
		{name: "failure case - caBundle dot-dot", params: map[string]string{"source": "s3://b", "endpoint": "https://minio:9000", "caBundle": ".."}, wantKind: source.Invalid},
		{name: "failure case - caBundle on plain http", params: map[string]string{"source": "s3://b", "endpoint": "http://minio:9000", "caBundle": "ca.pem"}, wantKind: source.Invalid},
		{name: "failure case - caBundle on nfs", params: map[string]string{"source": "nfs://h/x", "caBundle": "ca.pem"}, wantKind: source.Invalid},
		{name: "web identity", params: map[string]string{"source": "s3://b", "credentials": "webIdentity", "roleARN": "arn:aws:iam::1:role/r"}, ephemeral: true, check: func(t *testing.T, s *Dataset) {
			plain := *s
			plain.Credentials, plain.RoleARN = "", ""
			if s.Credentials != "webIdentity" || s.RoleARN != "arn:aws:iam::1:role/r" || s.ID() != plain.ID() {
				t.Fatalf("bad spec %+v (credentials must not change the dataset's identity)", s)
			}
		}},
		{name: "web identity, role from the ServiceAccount", params: map[string]string{"source": "s3://b", "credentials": "webIdentity", "roleFrom": "serviceAccount"}, ephemeral: true, check: func(t *testing.T, s *Dataset) {
			if s.Credentials != "webIdentity" || s.RoleFrom != "serviceAccount" || s.RoleARN != "" {
				t.Fatalf("bad spec %+v", s)
			}
		}},
		{name: "failure case - roleARN and roleFrom", params: map[string]string{"source": "s3://b", "credentials": "webIdentity", "roleARN": "arn:aws:iam::1:role/r", "roleFrom": "serviceAccount"}, wantKind: source.Invalid},
		{name: "failure case - roleFrom without webIdentity", params: map[string]string{"source": "s3://b", "roleFrom": "serviceAccount"}, wantKind: source.Invalid},
		{name: "failure case - unknown roleFrom", params: map[string]string{"source": "s3://b", "credentials": "webIdentity", "roleFrom": "node"}, wantKind: source.Invalid},
		{name: "failure case - webIdentity without roleARN", params: map[string]string{"source": "s3://b", "credentials": "webIdentity"}, wantKind: source.Invalid},
		{name: "failure case - roleARN without webIdentity", params: map[string]string{"source": "s3://b", "roleARN": "arn:aws:iam::1:role/r"}, wantKind: source.Invalid},
		{name: "failure case - unknown credentials", params: map[string]string{"source": "s3://b", "credentials": "instanceProfile"}, wantKind: source.Invalid},
		{name: "failure case - webIdentity on nfs", params: map[string]string{"source": "nfs://h/x", "credentials": "webIdentity", "roleARN": "r"}, wantKind: source.Invalid},
		{name: "failure case - endpoint without source", params: map[string]string{"endpoint": "http://x"}, wantKind: source.Invalid},
		{name: "failure case - bad scheme", params: map[string]string{"source": "http://x/y"}, wantKind: source.Invalid},
		{name: "failure case - credentials in URL", params: map[string]string{"source": "s3://AKIA:secret@bucket/x"}, wantKind: source.Invalid},
		{name: "failure case - traversal in prefix", params: map[string]string{"source": "s3://b/a/../../x"}, wantKind: source.Invalid},
		{name: "failure case - traversal in file path", params: map[string]string{"source": "file:///srv/../etc"}, wantKind: source.Invalid},
		{name: "failure case - bad pathStyle", params: map[string]string{"source": "s3://b", "pathStyle": "yes please"}, wantKind: source.Invalid},
		{name: "failure case - bad endpoint", params: map[string]string{"source": "s3://b", "endpoint": "minio:9000"}, wantKind: source.Invalid},
		{name: "failure case - endpoint on nfs", params: map[string]string{"source": "nfs://h/x", "endpoint": "http://x"}, wantKind: source.Invalid},
		{name: "failure case - file in ephemeral volume", params: map[string]string{"source": "file:///srv/x"}, ephemeral: true, wantKind: source.Denied},
		{name: "failure case - bad glob", params: map[string]string{"source": "s3://b", "include": "[a"}, wantKind: source.Invalid},
		{name: "failure case - too many globs", params: map[string]string{"source": "s3://b", "exclude": strings.Repeat("a,", 65)}, wantKind: source.Invalid},
		{name: "failure case - glob too deep", params: map[string]string{"source": "s3://b", "include": strings.Repeat("**/", 40) + "x"}, wantKind: source.Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			use := StorageClass
			if tc.ephemeral {
				use = Inline
			}
			v, err := Parse(tc.params, use)
			want := tc.wantKind
			if tc.check != nil {
				want = -1
			}
			if got := kind(err); got != want {
				t.Fatalf("Parse: kind %v (%v), want %v", got, err, want)
			}
			if tc.check != nil {
				tc.check(t, v.Dataset)
			}
		})
	}
}

func TestSpecID(t *testing.T) {
	a, _ := Parse(map[string]string{"source": "s3://b/p", "pool": "x"}, StorageClass)
	b, _ := Parse(map[string]string{"source": "s3://b/p/", "pool": "y"}, StorageClass)
	c, _ := Parse(map[string]string{"source": "s3://b/p", "include": "*.json"}, StorageClass)
	if a.Dataset.ID() != b.Dataset.ID() {
		t.Fatal("the same dataset in two pools must share an ID")
	}
	if a.Dataset.ID() == c.Dataset.ID() {
		t.Fatal("different filters must not share an ID")
	}
}

// TestParseUses: each key is allowed where the table says, and refused by name elsewhere; the
// driver's own keys are typed.
func TestParseUses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		params  map[string]string
		use     Use
		wantErr string
		check   func(t *testing.T, v Volume)
	}{
		{name: "pool and selector", params: map[string]string{"pool": "fast", "poolSelector": "media=ssd"}, use: StorageClass,
			check: func(t *testing.T, v Volume) {
				if v.Pool != "fast" || v.PoolSelector.String() != "media=ssd" || v.Dataset != nil {
					t.Fatalf("got %v", v)
				}
			}},
		{name: "inline size", params: map[string]string{"size": "2Mi", "csi.storage.k8s.io/ephemeral": "true"}, use: Inline,
			check: func(t *testing.T, v Volume) {
				if v.Size != 2<<20 {
					t.Fatalf("size %d", v.Size)
				}
			}},
		{name: "static PV with a dataset", params: map[string]string{"source": "nfs://h/x", "pool": "fast"}, use: StaticPV,
			check: func(t *testing.T, v Volume) {
				if v.Dataset == nil || v.Dataset.Host != "h" || v.Pool != "fast" {
					t.Fatalf("got %v", v)
				}
			}},
		{name: "static PV capacity", params: map[string]string{"source": "s3://b/p", "capacity": "20Gi"}, use: StaticPV,
			check: func(t *testing.T, v Volume) {
				if v.Capacity != 20<<30 || v.Dataset == nil {
					t.Fatalf("got %v, capacity %d", v, v.Capacity)
				}
			}},
		{name: "StorageClass streaming", params: map[string]string{"source": "s3://b/p", "dataMode": "streaming"}, use: StorageClass,
			check: func(t *testing.T, v Volume) {
				if !v.Streaming || v.Dataset == nil {
					t.Fatalf("got %v", v)
				}
			}},
		{name: "failure case - dataMode without a source", params: map[string]string{"dataMode": "streaming"}, use: StorageClass, wantErr: "dataMode"},
		{name: "failure case - capacity in inline attributes", params: map[string]string{"source": "s3://b", "capacity": "1Gi"}, use: Inline, wantErr: `unknown parameter "capacity" in inline volume attributes`},
		{name: "failure case - bad capacity", params: map[string]string{"source": "s3://b", "capacity": "0"}, use: StaticPV, wantErr: `invalid capacity "0"`},
		{name: "failure case - size in a StorageClass", params: map[string]string{"size": "1Gi"}, use: StorageClass, wantErr: `unknown parameter "size" in StorageClass parameters`},
		{name: "failure case - typo names the key and the known ones", params: map[string]string{"pol": "fast"}, use: StorageClass,
			wantErr: `unknown parameter "pol" in StorageClass parameters (known: pool, poolSelector, dataMode, source,`},
		{name: "failure case - bad selector", params: map[string]string{"poolSelector": "a in (b"}, use: StorageClass, wantErr: "invalid poolSelector"},
		{name: "failure case - bad inline size", params: map[string]string{"size": "-1"}, use: Inline, wantErr: `invalid size "-1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Parse(tc.params, tc.use)
			if tc.wantErr != "" {
				if kind(err) != source.Invalid || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want an invalid-parameter error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, v)
		})
	}
}
