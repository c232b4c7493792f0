package s3compat

import (
	"bytes"
	"context"
	"crypto/md5"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sys/unix"

	"github.com/cistern-csi/cistern/pkg/datasource/etag"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/datasource/stage"
	"github.com/cistern-csi/cistern/pkg/streamfs"
	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// A case runs against one server in a bucket of its own and returns what verified the bytes.
type compatCase struct {
	name string
	run  func(t *testing.T, s *testpeers.S3, bucket string) (checksum string)
}

var cases = []compatCase{
	{"staged", caseStaged},
	{"streaming", caseStreaming},
	{"hostile-keys", caseHostileKeys},
	{"changed", caseChanged},
	{"multipart-plain", func(t *testing.T, s *testpeers.S3, b string) string { return caseMultipart(t, s, b, "") }},
	{"multipart-crc32c", func(t *testing.T, s *testpeers.S3, b string) string {
		return caseMultipart(t, s, b, types.ChecksumAlgorithmCrc32c)
	}},
	{"corrupted", caseCorrupted},
	{"write-back", caseWriteBack},
}

var buckets atomic.Int32

// TestCompat runs every case against every server and prints one line per case.
func TestCompat(t *testing.T) {
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			s := srv.start(t)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					checksum := "-"
					t.Cleanup(func() {
						result := "pass"
						if t.Failed() {
							result = "fail"
						}
						fmt.Printf("s3compat: server=%s case=%s result=%s checksum=%s\n", srv.name, c.name, result, checksum)
					})
					bucket := fmt.Sprintf("%s-%d", c.name, buckets.Add(1))
					s.Bucket(t, bucket)
					checksum = c.run(t, s, bucket)
				})
			}
		})
	}
}

// caseStaged stages a tree of small objects and one read in parallel ranges: byte-identical.
func caseStaged(t *testing.T, s *testpeers.S3, bucket string) string {
	ctx := testCtx(t)
	want := tree{"big.bin": randBytes(1, 7<<20+3)}
	for i := range 12 {
		want[fmt.Sprintf("d%d/f%02d.bin", i%3, i)] = randBytes(uint64(10+i), 1000+i*997)
	}
	want.upload(t, s, bucket, "set/")
	s.Put(t, bucket, "other/x", []byte("outside the prefix"))
	m, pool := newManager(t), t.TempDir()
	sp := spec(t, s.Endpoint, "s3://"+bucket+"/set")
	if err := waitStaged(ctx, t, m, request(s, sp, pool)); err != nil {
		t.Fatal(err)
	}
	dir, err := m.TreePath(pool, sp)
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, dir, want)
	return verified(t, m)
}

// caseHostileKeys stages keys S3 allows that URLs, signatures and paths mangle.
func caseHostileKeys(t *testing.T, s *testpeers.S3, bucket string) string {
	ctx := testCtx(t)
	want := tree{}
	for i, k := range []string{"with space/a b.txt", "ünïcødé/日本語.bin", "plus+sign.txt", "percent%2Fslash%20.txt",
		"q?uery=1&x#frag.txt", "tilde~/star*[x].txt", "semi;colon,comma'quote.txt"} {
		want[k] = randBytes(uint64(100+i), 500+i)
	}
	want.upload(t, s, bucket, "")
	m, pool := newManager(t), t.TempDir()
	sp := spec(t, s.Endpoint, "s3://"+bucket)
	if err := waitStaged(ctx, t, m, request(s, sp, pool)); err != nil {
		t.Fatal(err)
	}
	dir, err := m.TreePath(pool, sp)
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, dir, want)
	return verified(t, m)
}

// caseChanged overwrites an object between the listing and its read: the read, pinned to the
// listed ETag, fails the attempt as a change; the next attempt stages the new bytes.
func caseChanged(t *testing.T, s *testpeers.S3, bucket string) string {
	ctx := testCtx(t)
	s.Put(t, bucket, "a.bin", []byte("version one"))
	var overwritten atomic.Bool
	path := "/" + bucket + "/a.bin"
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodGet && r.URL.Path == path && overwritten.CompareAndSwap(false, true) {
			s.Put(t, bucket, "a.bin", []byte("version two!"))
		}
		return testpeers.None
	})
	m, pool := newManager(t), t.TempDir()
	sp := spec(t, proxy.URL, "s3://"+bucket)
	err := waitStaged(ctx, t, m, request(s, sp, pool))
	if !overwritten.Load() {
		t.Fatal("the object was never read")
	}
	if err == nil || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("staging across an overwrite: %v, want the change detected", err)
	}
	if err := waitStaged(ctx, t, m, request(s, sp, pool)); err != nil {
		t.Fatal(err)
	}
	dir, err := m.TreePath(pool, sp)
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, dir, tree{"a.bin": []byte("version two!")})
	return "etag-pinned+" + verified(t, m)
}

// caseMultipart uploads an object in three 5 MiB parts and a short one, with alg's checksums on
// every part (the whole object's, FULL_OBJECT) or none at all, and stages it. Without, it can
// be checked only by its parts' MD5s against the multipart ETag.
func caseMultipart(t *testing.T, s *testpeers.S3, bucket string, alg types.ChecksumAlgorithm) string {
	ctx := testCtx(t)
	data := randBytes(7, 3*(5<<20)+12345)
	putMultipart(t, s, bucket, "mp.bin", data, 5<<20, alg)
	endpoint := s.Endpoint
	if alg == "" {
		// Servers that keep checksums anyway (versitygw adds its own CRC-64/NVME) are made to
		// look like those that keep none: what is left is the multipart ETag.
		endpoint = testpeers.StartProxy(t, s.Endpoint, func(*http.Request, int64) testpeers.Fault {
			return testpeers.Fault{ResetAfter: -1, StripChecksums: true}
		}).URL
	}
	m, pool := newManager(t), t.TempDir()
	sp := spec(t, endpoint, "s3://"+bucket)
	if err := waitStaged(ctx, t, m, request(s, sp, pool)); err != nil {
		t.Fatal(err)
	}
	dir, err := m.TreePath(pool, sp)
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, dir, tree{"mp.bin": data})
	return verified(t, m)
}

// putMultipart uploads data in parts of partSize; alg "" sends no checksum at all (the SDK's
// own are turned off), as older clients and servers do.
func putMultipart(t *testing.T, s *testpeers.S3, bucket, key string, data []byte, partSize int, alg types.ChecksumAlgorithm) {
	t.Helper()
	ctx := context.Background()
	c := s3.New(s.Client.Options(), func(o *s3.Options) {
		if alg == "" {
			o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		}
	})
	in := &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key)}
	if alg != "" {
		in.ChecksumAlgorithm, in.ChecksumType = alg, types.ChecksumTypeFullObject
	}
	up, err := c.CreateMultipartUpload(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	var parts []types.CompletedPart
	for i, off := int32(1), 0; off < len(data); i, off = i+1, off+partSize {
		out, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String(key),
			UploadId: up.UploadId, PartNumber: aws.Int32(i), ChecksumAlgorithm: alg,
			Body: bytes.NewReader(data[off:min(off+partSize, len(data))])})
		if err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(i),
			ChecksumCRC32C: out.ChecksumCRC32C})
	}
	if _, err := c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String(bucket),
		Key: aws.String(key), UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		t.Fatal(err)
	}
}

// caseCorrupted flips the first byte of every object read: staging refuses the dataset and
// publishes nothing. The checksum is the one whose mismatch refused it.
func caseCorrupted(t *testing.T, s *testpeers.S3, bucket string) string {
	ctx := testCtx(t)
	want := tree{"small.bin": randBytes(3, 4000), "big.bin": randBytes(4, 5<<20+1)}
	want.upload(t, s, bucket, "")
	proxy := testpeers.StartProxy(t, s.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if q := r.URL.Query(); r.Method == http.MethodGet && !q.Has("list-type") && !q.Has("uploads") {
			return testpeers.Fault{ResetAfter: -1, Flip: true, Name: "flip"}
		}
		return testpeers.None
	})
	m, pool := newManager(t), t.TempDir()
	sp := spec(t, proxy.URL, "s3://"+bucket)
	err := waitStaged(ctx, t, m, request(s, sp, pool))
	if err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("staging flipped bytes: %v, want a checksum mismatch", err)
	}
	if proxy.Delivered("flip") == 0 {
		t.Fatal("no read was damaged")
	}
	if _, err := m.TreePath(pool, sp); err == nil {
		t.Fatal("a damaged dataset was published")
	}
	return refusedBy(err.Error())
}

var mismatch = regexp.MustCompile(`(multipart MD5|parts' MD5|MD5|\b[A-Z0-9]+ checksum)\b[^:]*does not match`)

// refusedBy names the check in a mismatch error.
func refusedBy(msg string) string {
	m := mismatch.FindStringSubmatch(msg)
	if m == nil {
		return "unknown"
	}
	s := strings.ToLower(strings.TrimSuffix(m[1], " checksum"))
	switch s {
	case "multipart md5", "parts' md5":
		return stage.CheckedMultipartMD5
	}
	return s
}

// caseStreaming reads a dataset through a streaming volume (FUSE) before it is staged:
// byte-identical, each file checked as the streaming reads check it.
func caseStreaming(t *testing.T, s *testpeers.S3, bucket string) string {
	testutil.RequireRoot(t)
	ctx := testCtx(t)
	want := tree{"small.txt": []byte("streamed"), "big.bin": randBytes(5, 6<<20+11)}
	want.upload(t, s, bucket, "")
	m, pool := newManager(t), t.TempDir()
	sp := spec(t, s.Endpoint, "s3://"+bucket)
	_, ds, err := m.Stream(ctx, request(s, sp, pool), "vol-stream")
	if err != nil || ds == nil {
		t.Fatalf("stream: %v (a stream: %v)", err, ds != nil)
	}
	t.Cleanup(ds.Release)
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	fetcher := streamfs.SourceFetcher{Source: ds.Source}
	fsm, err := streamfs.Start(mnt, streamfs.Config{Objects: ds.Objects, Cached: ds.Cached, Scratch: ds.Scratch,
		Fetcher: fetcher, OnFetch: ds.OnFetch})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fsm.Close(); err != nil {
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	got := tree{}
	for k := range want {
		b, err := os.ReadFile(filepath.Join(mnt, k))
		if err != nil {
			t.Fatal(err)
		}
		got[k] = b
	}
	sameTree(t, got, want)
	// The staging the stream started goes on meanwhile: it ends with the same bytes.
	if err := waitStaged(ctx, t, m, request(s, sp, pool)); err != nil {
		t.Fatal(err)
	}
	var checks []string
	for _, o := range ds.Objects {
		checks = append(checks, streamCheck(ctx, t, fetcher, o))
	}
	return counted(checks)
}

// streamCheck is what a streaming read of o is checked against, by streamfs's order: per-part
// checksums, the whole object's checksum, its MD5 ETag, its parts' MD5s, or nothing.
func streamCheck(ctx context.Context, t *testing.T, f streamfs.SourceFetcher, o source.Object) string {
	if o.Type != source.File {
		return "dir"
	}
	l, err := f.Layout(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Parts) > 0 {
		return "part-" + strings.ToLower(l.Parts[0].Checksum.Algorithm)
	}
	rc, err := f.Open(ctx, o, 0, o.Size)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if c, ok := rc.(source.Checksummed); ok && c.Checksum().Algorithm != "" {
		return strings.ToLower(c.Checksum().Algorithm)
	}
	switch {
	case regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(o.ETag):
		return stage.CheckedMD5
	case len(l.PartSizes) > 0:
		return stage.CheckedMultipartMD5
	}
	return stage.CheckedNone
}

// caseWriteBack uploads a writable volume's outputs (a small file, a multipart one, a hostile
// name) and reads them back: byte-identical. The checksum is what the server holds for them.
func caseWriteBack(t *testing.T, s *testpeers.S3, bucket string) string {
	ctx := testCtx(t)
	upper := t.TempDir()
	want := tree{"ckpt/small.json": []byte(`{"step":1}`), "ckpt/big.bin": randBytes(6, 11<<20+5),
		"out/ü b+%.txt": []byte("hostile")}
	for k, v := range want {
		p := filepath.Join(upper, k)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, v, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), PartSize: 5 << 20, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	target, err := writeback.ParseTarget("s3://" + bucket + "/run")
	if err != nil {
		t.Fatal(err)
	}
	var last writeback.Progress
	// Bounded: an upload the server cannot confirm is retried, not given up.
	rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := u.Run(rctx, writeback.Job{Volume: "vol-wb", Upper: upper, Target: target}, s.Client,
		func(p writeback.Progress) { last = p }); err != nil {
		t.Fatalf("write-back: %v (last pass: %v)", err, last.Err)
	}
	if !last.Done || last.FilesDone != len(want) {
		t.Errorf("progress %+v, want done with %d files", last, len(want))
	}
	sameTree(t, objects(t, s.Client, bucket, "run/"), want)
	// The same job again (a node plugin restarted after the upload) finds every object stored,
	// as the server confirmed it, and sends nothing.
	if err := u.Run(rctx, writeback.Job{Volume: "vol-wb", Upper: upper, Target: target}, s.Client,
		func(p writeback.Progress) { last = p }); err != nil {
		t.Fatalf("write-back again: %v (last pass: %v)", err, last.Err)
	}
	if !last.Done || last.Sent != 0 {
		t.Errorf("write-back again: progress %+v, want done with nothing sent", last)
	}
	return serverChecksums(ctx, t, s.Client, bucket, "run/", want)
}

// serverChecksums counts, by algorithm, the checksums the server returns for the objects, or,
// for an object it keeps none of, what its ETag proves (md5Kind).
func serverChecksums(ctx context.Context, t *testing.T, c *s3.Client, bucket, prefix string, objs tree) string {
	n := map[string]int{}
	for k := range objs {
		h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(prefix + k),
			ChecksumMode: types.ChecksumModeEnabled})
		if err != nil {
			t.Fatal(err)
		}
		alg := md5Kind(aws.ToString(h.ETag), objs[k])
		switch {
		case h.ChecksumCRC32C != nil:
			alg = "crc32c"
		case h.ChecksumCRC64NVME != nil:
			alg = "crc64nvme"
		case h.ChecksumCRC32 != nil:
			alg = "crc32"
		}
		n[alg]++
	}
	var algs []string
	for a, k := range n {
		for range k {
			algs = append(algs, a)
		}
	}
	return "server-" + counted(algs)
}

// md5Kind is what an object's ETag proves of data: "md5" (a single PUT's MD5), "multipart-md5"
// (the MD5 of its parts' MD5s, under the part size the write-back records), or "none".
func md5Kind(tag string, data []byte) string {
	tag = strings.Trim(tag, `"`)
	if tag == fmt.Sprintf("%x", md5.Sum(data)) {
		return "md5"
	}
	m := etag.NewMulti([]int64{5 << 20})
	m.Write(data)
	if _, ok := etag.Match(m.Sum(nil), []int64{5 << 20}, int64(len(data)), tag); ok {
		return "multipart-md5"
	}
	return "none"
}

// counted spells names with their counts, sorted: "crc32c(2)+md5(1)".
func counted(names []string) string {
	n := map[string]int{}
	for _, s := range names {
		n[s]++
	}
	var out []string
	for s, k := range n {
		out = append(out, fmt.Sprintf("%s(%d)", s, k))
	}
	slices.Sort(out)
	return strings.Join(out, "+")
}
