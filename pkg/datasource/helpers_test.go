package datasource_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// randBytes returns n deterministic pseudo-random bytes.
func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)}))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// dataset is a test tree: relative key -> content.
type dataset map[string][]byte

func (d dataset) upload(t *testing.T, s *testpeers.S3, bucket, prefix string) {
	for k, v := range d {
		s.Put(t, bucket, prefix+k, v)
	}
}

func (d dataset) writeDir(t *testing.T, dir string) {
	for k, v := range d {
		p := filepath.Join(dir, filepath.FromSlash(k))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, v, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func smallTree(seed uint64, n, size int) dataset {
	d := dataset{}
	for i := range n {
		d[fmt.Sprintf("d%02d/e%d/f%05d.bin", i%7, i%3, i)] = randBytes(seed+uint64(i), size+i)
	}
	return d
}

// checkTree asserts dir holds exactly want's regular files, byte for byte.
func checkTree(t *testing.T, dir string, want dataset) {
	t.Helper()
	got := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			got[filepath.ToSlash(rel)] = sha256.Sum256(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		h, ok := got[k]
		if !ok {
			t.Errorf("missing %s", k)
			continue
		}
		if h != sha256.Sum256(v) {
			t.Errorf("%s differs", k)
		}
		delete(got, k)
	}
	for k := range got {
		t.Errorf("unexpected file %s", k)
	}
}

func newManager(t *testing.T, cfg datasource.Config) *datasource.Manager {
	t.Helper()
	m, err := datasource.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func testCtx(t *testing.T) context.Context {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// stage waits until the dataset is ready or staging fails.
func stage(ctx context.Context, t *testing.T, m *datasource.Manager, req datasource.Request) (datasource.Status, error) {
	t.Helper()
	for {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := m.Wait(wctx, req)
		cancel()
		if err != nil || st.Ready() {
			return st, err
		}
		klog.FromContext(ctx).Info("waiting", "status", st.String())
		if ctx.Err() != nil {
			t.Fatalf("staging did not finish: %s", st)
		}
	}
}

func s3Params(s *testpeers.S3, endpoint, src string) map[string]string {
	if endpoint == "" {
		endpoint = s.Endpoint
	}
	return map[string]string{"source": src, "endpoint": endpoint, "pathStyle": "true"}
}

func mustSpec(t *testing.T, m map[string]string) *datasource.Spec {
	t.Helper()
	v, err := params.Parse(m, params.StorageClass)
	if err != nil {
		t.Fatal(err)
	}
	return datasource.SpecOf(v.Dataset)
}

func creds(s *testpeers.S3) datasource.Credentials {
	return datasource.Credentials{AccessKeyID: s.AccessKey, SecretAccessKey: s.SecretKey}
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

var _ = bytes.Equal
