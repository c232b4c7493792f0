package streamfs_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/pkg/datasource/s3source"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/streamfs"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// BenchmarkStreamingFirstByte (make bench-streaming): the first byte of an uncached large file
// read through a streaming mount, against one ranged GET of that byte from the same server, the
// baseline measured next to each sample. Two cases: the object's parts carry checksums (what
// S3 reports for objects uploaded in parts with a checksum; versitygw does not report them, so
// the benchmark brings the uploader's), where the mount fetches the one part holding the byte;
// and no per-part checksums (versitygw's answer), where it fetches and checks the whole object,
// compared with one whole GET too. Each sample is a fresh mount over an empty scratch directory.
func BenchmarkStreamingFirstByte(b *testing.B) {
	if os.Geteuid() != 0 {
		testutil.Unavailable(b, "streaming mounts need root")
	}
	size := int64(1 << 30)
	if v := os.Getenv("CISTERN_BENCH_STREAM_MIB"); v != "" {
		mib, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		size = mib << 20
	}
	const part = 8 << 20
	s := testpeers.StartS3(b, b.TempDir())
	s.Bucket(b, "bench")
	var parts []source.Part
	table := crc32.MakeTable(crc32.Castagnoli)
	s.PutMultipart(b, "bench", "large.bin", size, part, func(i int, buf []byte) {
		for k := 0; k+8 <= len(buf); k += 8 {
			copy(buf[k:], strconv.AppendInt(nil, int64(i)*part+int64(k), 36))
		}
		c := crc32.Checksum(buf, table)
		parts = append(parts, source.Part{Off: int64(i) * part, N: int64(len(buf)), Checksum: source.Checksum{Algorithm: "CRC32C",
			Value: base64.StdEncoding.EncodeToString([]byte{byte(c >> 24), byte(c >> 16), byte(c >> 8), byte(c)})}})
	})
	src, err := s3source.New(s3source.Config{Bucket: "bench", Endpoint: s.Endpoint, PathStyle: true,
		AccessKeyID: s.AccessKey, SecretAccessKey: s.SecretKey})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	var objs []source.Object
	if err := src.List(context.Background(), func(o source.Object) error { objs = append(objs, o); return nil }); err != nil {
		b.Fatal(err)
	}
	off := size/2 + 12345
	ranged := func(first, n int64) time.Duration { return timeGet(b, s, first, n) }
	cases := []struct {
		name    string
		fetcher streamfs.Fetcher
		whole   bool
	}{
		{"parts", partsFetcher{streamfs.SourceFetcher{Source: src}, map[string][]source.Part{"large.bin": parts}}, false},
		{"whole", streamfs.SourceFetcher{Source: src}, true},
	}
	// CISTERN_BENCH_STREAM_CASES narrows the run to some of parts, whole, readall.
	only := os.Getenv("CISTERN_BENCH_STREAM_CASES")
	want := func(name string) bool { return only == "" || slices.Contains(strings.Split(only, ","), name) }
	for _, c := range cases {
		if !want(c.name) {
			continue
		}
		// bound: the least a checked first byte needs, one GET of what is checked (its part, or
		// the whole object).
		var fb, get, bound, srcGet []time.Duration
		var split []firstByteSplit
		for range 3 {
			get = append(get, ranged(off, 1))
			d, sp := firstByte(b, objs, c.fetcher, off)
			fb, split = append(fb, d), append(split, sp)
			if c.whole {
				bound = append(bound, ranged(0, size))
			} else {
				bound = append(bound, ranged(off/part*part, part))
				// The same part through the mount's own S3 client (pinned, If-Match), read into
				// memory: what the mount's GET costs without FUSE, the scratch file or the check.
				srcGet = append(srcGet, sourceGet(b, src, objs, off/part*part, part))
			}
		}
		line := fmt.Sprintf("streaming: object_mib=%d checks=%s first_byte_s=%s ranged_get_1b_s=%s", size>>20, c.name, spread(fb), spread(get))
		if c.whole {
			line += " whole_get_s=" + spread(bound)
		} else {
			line += fmt.Sprintf(" part_get_s=%s (part_mib=%d) part_get_mount_client_s=%s", spread(bound), part>>20, spread(srcGet))
		}
		line += fmt.Sprintf(" checked_bound_ratio=%.2f", median(fb).Seconds()/median(bound).Seconds())
		line += fmt.Sprintf(" first_byte_ratio=%.2f", median(fb).Seconds()/median(get).Seconds())
		fmt.Println(line)
		// Where a first byte's time goes, per sample: until the fetch asks the server, the GET
		// (headers, then the body read and checked), and after it until the byte is back.
		for i, sp := range split {
			fmt.Printf("streaming: checks=%s sample=%d first_byte_ms=%.1f before_get_ms=%.1f get_headers_ms=%.1f get_body_ms=%.1f after_get_ms=%.1f\n",
				c.name, i, ms(fb[i]), ms(sp.open), ms(sp.headers-sp.open), ms(sp.body-sp.headers), ms(fb[i]-sp.body))
		}
	}
	if !want("readall") {
		return
	}
	// The whole object read in 4 MiB chunks right after the mount, every part checked (read
	// ahead of the reader), against one GET of the whole object.
	var all, whole []time.Duration
	for range 3 {
		whole = append(whole, ranged(0, size))
		all = append(all, readAll(b, objs, cases[0].fetcher, size))
	}
	fmt.Printf("streaming: object_mib=%d checks=parts read_all_s=%s whole_get_s=%s read_all_ratio=%.2f\n",
		size>>20, spread(all), spread(whole), median(all).Seconds()/median(whole).Seconds())
}

// readAll mounts the dataset afresh and times reading the whole object in 4 MiB chunks.
func readAll(b *testing.B, objs []source.Object, fetcher streamfs.Fetcher, size int64) time.Duration {
	dir := filepath.Join(b.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	m, err := streamfs.Start(dir, streamfs.Config{Objects: objs, Scratch: b.TempDir(), Fetcher: fetcher,
		Cached: func(source.Object) (*os.File, error) { return nil, nil }})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	start := time.Now()
	f, err := os.Open(filepath.Join(dir, "large.bin"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	n, err := io.CopyBuffer(io.Discard, f, make([]byte, 4<<20))
	if err != nil || n != size {
		b.Fatalf("read %d bytes of %d: %v", n, size, err)
	}
	return time.Since(start)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// firstByteSplit is when, from the open, the fetch asked for the bytes, had the response's
// headers, and had its body read.
type firstByteSplit struct{ open, headers, body time.Duration }

// timedFetcher notes when the first fetch's request went out, its headers came, and its body
// was read to the end (closed).
type timedFetcher struct {
	streamfs.Fetcher
	start time.Time
	mu    sync.Mutex
	split firstByteSplit
}

func (t *timedFetcher) Open(ctx context.Context, obj source.Object, off, n int64) (io.ReadCloser, error) {
	asked := time.Since(t.start)
	rc, err := t.Fetcher.Open(ctx, obj, off, n)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.split.open, t.split.headers = asked, time.Since(t.start)
	if err != nil {
		return nil, err
	}
	return &timedBody{ReadCloser: rc, t: t}, nil
}

type timedBody struct {
	io.ReadCloser
	t *timedFetcher
}

func (b *timedBody) Close() error {
	b.t.mu.Lock()
	b.t.split.body = time.Since(b.t.start)
	b.t.mu.Unlock()
	return b.ReadCloser.Close()
}

// firstByte mounts the dataset afresh and times open + one byte at off.
func firstByte(b *testing.B, objs []source.Object, inner streamfs.Fetcher, off int64) (time.Duration, firstByteSplit) {
	fetcher := &timedFetcher{Fetcher: inner}
	dir := filepath.Join(b.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	var fetches atomic.Int64
	m, err := streamfs.Start(dir, streamfs.Config{Objects: objs, Scratch: b.TempDir(), Fetcher: fetcher,
		Cached: func(source.Object) (*os.File, error) { return nil, nil }, OnFetch: func(string, int64, int64, error) { fetches.Add(1) }})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	start := time.Now()
	fetcher.start = start
	f, err := os.Open(filepath.Join(dir, "large.bin"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(make([]byte, 1), off); err != nil {
		b.Fatal(err)
	}
	d := time.Since(start)
	if fetches.Load() != 1 {
		b.Fatalf("%d fetches for one byte, want 1", fetches.Load())
	}
	fetcher.mu.Lock()
	defer fetcher.mu.Unlock()
	return d, fetcher.split
}

// sourceGet times one read of [first, first+n) of the object through the source, to the end.
func sourceGet(b *testing.B, src source.Source, objs []source.Object, first, n int64) time.Duration {
	start := time.Now()
	rc, err := src.Open(context.Background(), objs[0], first, n)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, rc); err != nil {
		b.Fatal(err)
	}
	rc.Close()
	return time.Since(start)
}

// timeGet times one GetObject of [first, first+n) from the server, body read to the end.
func timeGet(b *testing.B, s *testpeers.S3, first, n int64) time.Duration {
	start := time.Now()
	out, err := s.Client.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("bench"), Key: aws.String("large.bin"),
		Range: aws.String(fmt.Sprintf("bytes=%d-%d", first, first+n-1))})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, out.Body); err != nil {
		b.Fatal(err)
	}
	out.Body.Close()
	return time.Since(start)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// spread renders min/median/max in seconds.
func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%.4f/%.4f/%.4f", s[0].Seconds(), median(s).Seconds(), s[len(s)-1].Seconds())
}
