package s3compat

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2/ktesting"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/stage"
	"github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// randBytes returns n deterministic pseudo-random bytes.
func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// tree is a dataset: relative key -> content.
type tree map[string][]byte

func (d tree) upload(t *testing.T, s *testpeers.S3, bucket, prefix string) {
	t.Helper()
	for k, v := range d {
		s.Put(t, bucket, prefix+k, v)
	}
}

// checkTree asserts dir holds exactly want's regular files, byte for byte.
func checkTree(t *testing.T, dir string, want tree) {
	t.Helper()
	got := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		got[filepath.ToSlash(rel)] = sha256.Sum256(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if h, ok := got[k]; !ok {
			t.Errorf("missing %q", k)
		} else if h != sha256.Sum256(v) {
			t.Errorf("%q differs", k)
		}
		delete(got, k)
	}
	for k := range got {
		t.Errorf("unexpected file %q", k)
	}
}

func testCtx(t *testing.T) context.Context {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newManager(t *testing.T) *datasource.Manager {
	t.Helper()
	m, err := datasource.NewManager(datasource.Config{Concurrency: 4, ChunkSize: 2 << 20, Retries: 2})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func spec(t *testing.T, endpoint, src string) *datasource.Spec {
	t.Helper()
	v, err := params.Parse(map[string]string{"source": src, "endpoint": endpoint, "pathStyle": "true"}, params.StorageClass)
	if err != nil {
		t.Fatal(err)
	}
	return datasource.SpecOf(v.Dataset)
}

func request(s *testpeers.S3, sp *datasource.Spec, pool string) datasource.Request {
	return datasource.Request{Spec: sp, Pool: pool, Capacity: 1 << 30,
		Creds: datasource.Credentials{AccessKeyID: s.AccessKey, SecretAccessKey: s.SecretKey}}
}

// waitStaged waits until the dataset is ready or staging fails.
func waitStaged(ctx context.Context, t *testing.T, m *datasource.Manager, req datasource.Request) error {
	t.Helper()
	for {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := m.Wait(wctx, req)
		cancel()
		if err != nil || st.Ready() {
			return err
		}
		if ctx.Err() != nil {
			t.Fatalf("staging did not finish: %s", st)
		}
	}
}

// verified is what the engine checked staged files against, from
// cistern_dataset_verified_files_total: "md5(3)+crc64nvme(1)", by label. A file staged
// unchecked fails the test.
func verified(t *testing.T, m *datasource.Manager) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "cistern_dataset_verified_files_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			check, n := mt.GetLabel()[0].GetValue(), int(mt.GetCounter().GetValue())
			if check == stage.CheckedNone {
				// Bytes compared equal here, but the engine itself checked nothing.
				t.Errorf("%d files staged with no check against the source", n)
			}
			out = append(out, fmt.Sprintf("%s(%d)", check, n))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "+")
}

// objects reads every object under prefix.
func objects(t *testing.T, c *s3.Client, bucket, prefix string) tree {
	t.Helper()
	ctx := context.Background()
	got := tree{}
	p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page.Contents {
			out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: o.Key})
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(out.Body)
			out.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			got[strings.TrimPrefix(aws.ToString(o.Key), prefix)] = b
		}
	}
	return got
}

// sameTree asserts got and want hold the same keys and bytes.
func sameTree(t *testing.T, got, want tree) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("missing %q", k)
		} else if !bytes.Equal(g, v) {
			t.Errorf("%q differs: %d bytes, want %d", k, len(g), len(v))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %q", k)
		}
	}
}
