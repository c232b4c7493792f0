package streamfs_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/streamfs"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// md5PartsFetcher hides the objects' full-object checksums and names their part size: what a
// multipart object uploaded without checksums offers (its ETag, the MD5 of its parts' MD5s).
type md5PartsFetcher struct{ streamfs.SourceFetcher }

func (m md5PartsFetcher) Layout(ctx context.Context, obj source.Object) (streamfs.Layout, error) {
	l, err := m.SourceFetcher.Layout(ctx, obj)
	if err == nil && strings.Contains(obj.ETag, "-") {
		l.Checksum, l.PartSize = source.Checksum{}, partSize
	}
	return l, err
}

// TestWholeObjectInRanges: an object without per-part checksums (versitygw's answer) is read in
// several ranged GETs at once and checked as a whole before any byte is handed out, against its
// full-object CRC (the ranges' CRCs combined) or, without one, its ETag (the parts' MD5s):
// byte-identical to S3; a flipped byte in any range is EIO, then read again; an object replaced
// after listing is EIO.
func TestWholeObjectInRanges(t *testing.T) {
	defer func(old int64) { *streamfs.WholeRange = old }(*streamfs.WholeRange)
	for _, c := range []struct {
		name    string
		fetcher func(source.Source) streamfs.Fetcher
		unit    int64
	}{
		{"full-object CRC", func(s source.Source) streamfs.Fetcher { return streamfs.SourceFetcher{Source: s} }, 8 << 20},
		{"parts' MD5s", func(s source.Source) streamfs.Fetcher { return md5PartsFetcher{streamfs.SourceFetcher{Source: s}} }, 2 * partSize},
	} {
		t.Run(c.name, func(t *testing.T) {
			*streamfs.WholeRange = c.unit
			f := newFixture(t)
			var fetches atomic.Int64
			f.mount(t, c.fetcher(f.source(t)), &fetches)
			big := int64(len(f.want["big.bin"]))
			got, err := os.ReadFile(filepath.Join(f.dir, "big.bin"))
			if err != nil || !bytes.Equal(got, f.want["big.bin"]) {
				t.Fatalf("big.bin differs from the source (%d bytes, err %v)", len(got), err)
			}
			if n, want := f.gets("big.bin"), int((big+c.unit-1)/c.unit); n != want {
				t.Errorf("big.bin: %d GETs, want %d (ranges of %d MiB)", n, want, c.unit>>20)
			}

			f.proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
				if rg := r.Header.Get("Range"); r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/ahead.bin") &&
					rg != "" && !strings.HasPrefix(rg, "bytes=0-") {
					return testpeers.Fault{ResetAfter: -1, Flip: true}
				}
				return testpeers.None
			})
			got, err = os.ReadFile(filepath.Join(f.dir, "ahead.bin"))
			f.proxy.SetFaults(nil)
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("ahead.bin with a flipped byte in a later range: %d bytes, err %v; want EIO", len(got), err)
			}
			got, err = os.ReadFile(filepath.Join(f.dir, "ahead.bin"))
			if err != nil || !bytes.Equal(got, f.want["ahead.bin"]) {
				t.Errorf("ahead.bin after the fault: %d bytes, err %v", len(got), err)
			}

			f.s3.PutMultipart(t, "data", "control.bin", 2*partSize, partSize, func(_ int, buf []byte) { clear(buf) })
			got, err = os.ReadFile(filepath.Join(f.dir, "control.bin"))
			if !errors.Is(err, syscall.EIO) {
				t.Errorf("control.bin replaced after listing: %d bytes, err %v; want EIO", len(got), err)
			}
		})
	}
}
