package datasource_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/streamfs"
	"github.com/cistern-csi/cistern/test/testpeers"
)

const mib = 1 << 20

// putParts uploads data to key in parts of partSize, with user metadata meta (nil: none).
func putParts(t *testing.T, s *testpeers.S3, key string, data []byte, partSize int, meta map[string]string) {
	t.Helper()
	ctx := context.Background()
	up, err := s.Client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("data"), Key: aws.String(key), Metadata: meta})
	if err != nil {
		t.Fatal(err)
	}
	var parts []types.CompletedPart
	for i, off := int32(1), 0; off < len(data); i, off = i+1, off+partSize {
		out, err := s.Client.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("data"), Key: aws.String(key), UploadId: up.UploadId,
			PartNumber: aws.Int32(i), Body: bytes.NewReader(data[off:min(off+partSize, len(data))])})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(i)})
	}
	if _, err := s.Client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("data"), Key: aws.String(key),
		UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		t.Fatal(err)
	}
}

// flips is a legacy server that also flips the first byte of the object GETs damage chooses,
// and counts them.
type flips struct {
	n      atomic.Int64
	damage func(r *http.Request) bool
}

func (f *flips) choose(r *http.Request, n int64) testpeers.Fault {
	fault := testpeers.LegacyS3(r, n)
	if r.Method == http.MethodGet && !r.URL.Query().Has("list-type") && f.damage(r) {
		fault.Flip = true
		f.n.Add(1)
	}
	return fault
}

// unverifiableCount is cistern_dataset_unverifiable_objects_total{action}.
func unverifiableCount(t *testing.T, m *datasource.Manager, action string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "cistern_dataset_unverifiable_objects_total" {
			for _, mt := range mf.GetMetric() {
				if label(mt, "action") == action {
					return mt.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestStageLegacyS3 stages multipart objects from a server that reports neither checksums nor
// part sizes (an old Ceph RGW: the proxy's legacy mode), each checked by its multipart ETag under
// the part size inferred from its size and part count, or recorded by its uploader: a byte
// damaged on the way is caught and read again, one damaged at every read is refused, never
// published.
func TestStageLegacyS3(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := dataset{
		// 7 parts of 5 MiB: 5 MiB is the only whole MiB that gives 7 parts (aligned ranges).
		"many.bin": randBytes(31, 6*5*mib+1234),
		// 2 parts: 5, 6, 7 and 8 MiB all give 2, checked at once once the object is in.
		"two.bin": randBytes(32, 9*mib),
		// Read whole (under two chunks), 2 parts.
		"small.bin": randBytes(33, 5*mib+100),
		// Parts of no whole MiB, the size recorded by the uploader (as Cistern's write-back does).
		"hinted.bin": randBytes(34, 2*(5*mib+7)+mib),
		"plain.bin":  randBytes(35, 3000),
		// One part (ETag "<md5>-1"): the object whole, in parallel ranges.
		"one.bin": randBytes(36, 9*mib),
	}
	for k, v := range want {
		switch k {
		case "plain.bin":
			s.Put(t, "data", "ok/"+k, v)
		case "one.bin":
			putParts(t, s, "ok/"+k, v, 16*mib, nil)
		case "hinted.bin":
			putParts(t, s, "ok/"+k, v, 5*mib+7, map[string]string{source.PartSizeMetadata: strconv.Itoa(5*mib + 7)})
		default:
			putParts(t, s, "ok/"+k, v, 5*mib, nil)
		}
	}
	putParts(t, s, "one/many.bin", want["many.bin"], 5*mib, nil)

	t.Run("a damaged first read of each object is caught and read again", func(t *testing.T) {
		var seen keyCounter
		f := &flips{damage: func(r *http.Request) bool { return seen.first(r.URL.Path + r.Header.Get("Range")) }}
		proxy := testpeers.StartProxy(t, s.Endpoint, f.choose)
		spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data/ok"))
		m := newManager(t, datasource.Config{Concurrency: 4, ChunkSize: 4 * mib})
		pool := t.TempDir()
		if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
			t.Fatal(err)
		}
		tree, err := m.TreePath(pool, spec)
		if err != nil {
			t.Fatal(err)
		}
		checkTree(t, tree, want)
		if f.n.Load() < int64(len(want)) || proxy.Delivered("legacy") == 0 {
			t.Fatalf("%d reads damaged, %d answered as an old server: the test tested nothing", f.n.Load(), proxy.Delivered("legacy"))
		}
		if n := unverifiableCount(t, m, "refused") + unverifiableCount(t, m, "served"); n != 0 {
			t.Errorf("%v objects counted unverifiable, want 0: each is checked by its ETag", n)
		}
	})
	t.Run("failure case - every read damaged", func(t *testing.T) {
		f := &flips{damage: func(*http.Request) bool { return true }}
		proxy := testpeers.StartProxy(t, s.Endpoint, f.choose)
		spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data/one"))
		m := newManager(t, datasource.Config{Concurrency: 4, ChunkSize: 4 * mib, Retries: 2})
		pool := t.TempDir()
		_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool})
		if datasource.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `"many.bin"`) {
			t.Fatalf("got %v (%v), want many.bin refused as unverifiable", datasource.Code(err), err)
		}
		if _, err := m.TreePath(pool, spec); err == nil {
			t.Fatal("a damaged dataset was published")
		}
	})
}

// TestStageLegacyS3Unverifiable: objects of a server that reports neither checksums nor part
// sizes, whose multipart ETags match under no likely part size (parts of no whole MiB) or have
// none (too many parts for a whole MiB to fit), are refused by default, served unchecked when
// the administrator says so; counted and told either way.
func TestStageLegacyS3Unverifiable(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := dataset{
		"odd.bin":  randBytes(41, 2*(5*mib+7)+mib), // 3 parts: 4 and 5 MiB fit, neither matches
		"none.bin": randBytes(42, 6*(5*mib+7)+9),   // 7 parts: no whole MiB fits
		"ok.bin":   randBytes(43, 1000),
	}
	putParts(t, s, "odd/odd.bin", want["odd.bin"], 5*mib+7, nil)
	putParts(t, s, "odd/none.bin", want["none.bin"], 5*mib+7, nil)
	s.Put(t, "data", "odd/ok.bin", want["ok.bin"])
	proxy := testpeers.StartProxy(t, s.Endpoint, testpeers.LegacyS3)
	spec := mustSpec(t, s3Params(s, proxy.URL, "s3://data/odd"))

	var mu sync.Mutex
	var events []datasource.UnverifiableEvent
	record := func(e datasource.UnverifiableEvent) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}
	t.Run("refused by default", func(t *testing.T) {
		events = nil
		m := newManager(t, datasource.Config{Concurrency: 4, ChunkSize: 4 * mib, OnUnverifiable: record})
		pool := t.TempDir()
		_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool})
		if datasource.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), ".bin") {
			t.Fatalf("got %v (%v), want an unverifiable object refused", datasource.Code(err), err)
		}
		if _, err := m.TreePath(pool, spec); err == nil {
			t.Fatal("a dataset with an unverifiable object was published")
		}
		mu.Lock()
		defer mu.Unlock()
		if n := unverifiableCount(t, m, "refused"); n < 1 || int(n) != len(events) {
			t.Fatalf("%v refusals counted, %d told, want as many, at least one", n, len(events))
		}
		for _, e := range events {
			if e.Served || e.Key != "odd.bin" && e.Key != "none.bin" || e.Dataset != spec.ID() || e.Reason == "" {
				t.Errorf("event %+v", e)
			}
		}
	})
	t.Run("served with the flag", func(t *testing.T) {
		events = nil
		m := newManager(t, datasource.Config{Concurrency: 4, ChunkSize: 4 * mib, OnUnverifiable: record,
			UnverifiableObjects: datasource.ServeUnverifiable})
		pool := t.TempDir()
		if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Creds: creds(s), Pool: pool}); err != nil {
			t.Fatal(err)
		}
		tree, err := m.TreePath(pool, spec)
		if err != nil {
			t.Fatal(err)
		}
		checkTree(t, tree, want)
		mu.Lock()
		defer mu.Unlock()
		if n := unverifiableCount(t, m, "served"); n != 2 || len(events) != 2 {
			t.Fatalf("%v served counted, %d told, want 2 (odd.bin, none.bin)", n, len(events))
		}
		for _, e := range events {
			if !e.Served {
				t.Errorf("event %+v", e)
			}
		}
	})
}

// TestStreamingLegacyS3 reads multipart objects on demand from a server that reports neither
// checksums nor part sizes: checked by their ETags under the inferred part size, a damaged one
// is refused (EIO), one nothing checks is refused too, or served when the policy says so.
func TestStreamingLegacyS3(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	want := dataset{
		"many.bin": randBytes(51, 6*5*mib+1234),    // one likely part size
		"two.bin":  randBytes(52, 9*mib),           // several
		"odd.bin":  randBytes(53, 2*(5*mib+7)+mib), // none matches
	}
	putParts(t, s, "many.bin", want["many.bin"], 5*mib, nil)
	putParts(t, s, "two.bin", want["two.bin"], 5*mib, nil)
	putParts(t, s, "odd.bin", want["odd.bin"], 5*mib+7, nil)
	// The stream reads an object whole (no Range); the staging under it reads these in ranges.
	var damaging atomic.Bool
	f := &flips{damage: func(r *http.Request) bool { return damaging.Load() && r.Header.Get("Range") == "" }}
	proxy := testpeers.StartProxy(t, s.Endpoint, f.choose)
	m := newManager(t, datasource.Config{Concurrency: 2, ChunkSize: 4 * mib, BandwidthBytesPerSec: 1 << 20})
	req := datasource.Request{Spec: mustSpec(t, s3Params(s, proxy.URL, "s3://data")), Creds: creds(s), Pool: t.TempDir()}
	st, ds, err := m.Stream(ctx, req, "vol-legacy")
	if err != nil || ds == nil {
		t.Fatalf("stream: %v %v (a stream: %v)", st, err, ds != nil)
	}
	t.Cleanup(ds.Release)
	mount := func(policy func(ctx context.Context, obj source.Object, err error) error) string {
		mnt := filepath.Join(t.TempDir(), "mnt")
		if err := os.Mkdir(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		// Never from the cache: every read is fetched on demand and checked here.
		fsm, err := streamfs.Start(mnt, streamfs.Config{Objects: ds.Objects, Scratch: t.TempDir(),
			Cached:  func(source.Object) (*os.File, error) { return nil, nil },
			Fetcher: streamfs.SourceFetcher{Source: ds.Source}, OnFetch: ds.OnFetch, Unverifiable: policy})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := fsm.Close(); err != nil {
				_ = unix.Unmount(mnt, unix.MNT_DETACH)
			}
		})
		return mnt
	}
	read := func(mnt, key string, ok bool) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(mnt, key))
		switch {
		case ok && (err != nil || !bytes.Equal(got, want[key])):
			t.Errorf("%s: %d bytes (MD5 %x), err %v; want the uploaded %d", key, len(got), md5.Sum(got), err, len(want[key]))
		case !ok && !errors.Is(err, syscall.EIO):
			t.Errorf("%s: %d bytes, err %v; want EIO", key, len(got), err)
		}
	}

	damaging.Store(true)
	mnt := mount(ds.Unverifiable)
	read(mnt, "many.bin", false)
	read(mnt, "two.bin", false)
	if f.n.Load() == 0 || proxy.Delivered("legacy") == 0 {
		t.Fatalf("%d reads damaged, %d answered as an old server: the test tested nothing", f.n.Load(), proxy.Delivered("legacy"))
	}
	damaging.Store(false)
	read(mnt, "many.bin", true)
	read(mnt, "two.bin", true)
	read(mnt, "odd.bin", false)
	if n := unverifiableCount(t, m, "refused"); n < 1 {
		t.Errorf("%v refusals counted, want odd.bin's", n)
	}
	served := mount(func(context.Context, source.Object, error) error { return nil })
	read(served, "odd.bin", true)
}
