package s3source

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestPrivateCA: versitygw on HTTPS with a certificate of its own CA is read with that CA's
// bundle, and refused without it (or with another CA's) as a configuration error, not retried.
func TestPrivateCA(t *testing.T) {
	s := testpeers.StartS3TLS(t, "")
	s.Bucket(t, "data")
	s.Put(t, "data", "set/a.bin", []byte("hello over TLS"))
	other := testpeers.StartS3TLS(t, "")
	open := func(bundle []byte) (*Source, error) {
		cfg := Config{Bucket: "data", Prefix: "set/", Endpoint: s.Endpoint, PathStyle: true,
			AccessKeyID: s.AccessKey, SecretAccessKey: s.SecretKey}
		if bundle != nil {
			roots, err := ParseCABundle("test", bundle)
			if err != nil {
				t.Fatal(err)
			}
			cfg.TLS.RootCAs = roots
		}
		return New(cfg)
	}
	list := func(src *Source) ([]source.Object, error) {
		var objs []source.Object
		err := src.List(context.Background(), func(o source.Object) error { objs = append(objs, o); return nil })
		return objs, err
	}

	t.Run("with the bundle", func(t *testing.T) {
		src, err := open(s.CAPEM)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		objs, err := list(src)
		if err != nil || len(objs) != 1 || objs[0].Key != "a.bin" {
			t.Fatalf("list: %v %+v", err, objs)
		}
		rc, err := src.Open(context.Background(), objs[0], 0, objs[0].Size)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(b) != "hello over TLS" {
			t.Fatalf("read %q, %v", b, err)
		}
	})
	for _, tc := range []struct {
		name   string
		bundle []byte
	}{
		{"failure case - system roots", nil},
		{"failure case - another CA's bundle", other.CAPEM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := open(tc.bundle)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			_, err = list(src)
			if source.KindOf(err) != source.Invalid || !strings.Contains(err.Error(), "certificate is not trusted") {
				t.Fatalf("got %v (%v), want Invalid: certificate is not trusted", source.KindOf(err), err)
			}
		})
	}
	if _, err := ParseCABundle("empty", []byte("not a certificate")); source.KindOf(err) != source.Invalid {
		t.Fatalf("a bundle without certificates: %v", err)
	}
}

// TestPlainHTTPEndpoints: plain HTTP is refused off the node unless the administrator allows it;
// loopback and HTTPS always pass. New refuses before any connection.
func TestPlainHTTPEndpoints(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		allow    bool
		refused  bool
	}{
		{"http://10.0.0.1:9000", false, true},
		{"http://minio.storage.svc:9000", false, true},
		{"HTTP://minio.storage.svc:9000", false, true},
		{"http://[fd00::1]:9000", false, true},
		{"http://10.0.0.1:9000", true, false},
		{"http://127.0.0.1:9000", false, false},
		{"http://[::1]:9000", false, false},
		{"http://localhost:9000", false, false},
		{"https://10.0.0.1:9000", false, false},
		{"", false, false}, // AWS, over HTTPS
	} {
		_, err := New(Config{Bucket: "b", Endpoint: tc.endpoint, TLS: TLS{AllowPlainHTTP: tc.allow}})
		if refused := err != nil; refused != tc.refused {
			t.Errorf("%q (allow %v): err %v, want refused %v", tc.endpoint, tc.allow, err, tc.refused)
		}
		if tc.refused && (source.KindOf(err) != source.Denied || !strings.Contains(err.Error(), "--s3-allow-plain-http")) {
			t.Errorf("%q: %v (%v), want Denied naming the flag", tc.endpoint, source.KindOf(err), err)
		}
	}
}
