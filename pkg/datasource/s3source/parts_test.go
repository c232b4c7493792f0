package s3source

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// TestPartsVersitygw: versitygw (v1.8.0) reports no parts (GetObjectAttributes answers without
// ObjectParts), so its multipart objects are read whole by a streaming volume; a single-PUT
// object has no parts without asking; an object overwritten since the listing is Changed.
func TestPartsVersitygw(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	f.s.PutMultipart(t, "data", "multi.bin", 12<<20, 5<<20, func(i int, buf []byte) {
		for k := range buf {
			buf[k] = byte(i + k)
		}
	})
	f.putCRC32C(t, "single.bin", []byte("one PUT"))
	src := f.source(t, "")
	objs := list(t, src)
	for _, key := range []string{"multi.bin", "single.bin"} {
		parts, err := src.Parts(ctx, objs[key])
		if err != nil || parts != nil {
			t.Errorf("%s: parts %v, err %v; want none", key, parts, err)
		}
	}
	f.s.PutMultipart(t, "data", "multi.bin", 11<<20, 5<<20, func(int, []byte) {})
	if _, err := src.Parts(ctx, objs["multi.bin"]); source.KindOf(err) != source.Changed {
		t.Errorf("parts of an object overwritten since the listing: %v, want Changed", err)
	}
}

// recordedPart is one part of an object served by attributesServer, with its real bytes.
type recordedPart struct {
	data []byte
	// sums are the checksums the answer carries for the part (algorithm → value); nil: none.
	sums map[string]string
}

// attributesServer answers GetObjectAttributes for one object as AWS documents it
// (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObjectAttributes.html): the XML
// element for element, ObjectParts paged by the PartNumberMarker the client sends, page parts
// to a page whatever MaxParts asks (S3 may return fewer; the client must follow
// NextPartNumberMarker). It records the markers and the MaxParts it was sent.
type attributesServer struct {
	t     *testing.T
	etag  func(page int) string // the ETag each answer carries
	parts []recordedPart
	page  int
	// truncateAt, when > 0, ends the answer after that many parts with IsTruncated but no
	// NextPartNumberMarker (a server that cut its list short).
	truncateAt int
	// stuck, when set, answers every page as the first one, NextPartNumberMarker included.
	stuck bool
	// status, when set, is the error every request is answered with.
	status int
	code   string

	mu       sync.Mutex
	markers  []string
	maxParts []string
}

func (a *attributesServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Method != http.MethodGet || !r.URL.Query().Has("attributes") || r.URL.Path != "/data/set/multi.bin" {
		a.t.Errorf("unexpected request %s %s", r.Method, r.URL)
		http.Error(w, "", http.StatusBadRequest)
		return
	}
	if got := strings.Join(r.Header.Values("X-Amz-Object-Attributes"), ","); got != "ETag,ObjectParts" {
		a.t.Errorf("asked for attributes %q, want ETag,ObjectParts", got)
	}
	if a.status != 0 {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(a.status)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>recorded</Message></Error>`, a.code)
		return
	}
	marker := r.Header.Get("X-Amz-Part-Number-Marker")
	a.markers = append(a.markers, marker)
	a.maxParts = append(a.maxParts, r.Header.Get("X-Amz-Max-Parts"))
	first := 0
	if marker != "" && !a.stuck {
		n, err := strconv.Atoi(marker)
		if err != nil {
			a.t.Errorf("part number marker %q", marker)
		}
		first = n // part numbers start at 1: the next part is at index n
	}
	last := min(first+a.page, len(a.parts))
	truncated := last < len(a.parts)
	cut := a.truncateAt > 0 && last > a.truncateAt
	if cut {
		last, truncated = a.truncateAt, true
	}
	var size int64
	for _, p := range a.parts {
		size += int64(len(p.data))
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<GetObjectAttributesResponse xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
<ETag>%s</ETag>
<ObjectParts>
<IsTruncated>%t</IsTruncated>
<MaxParts>%s</MaxParts>
`, a.etag(len(a.markers)-1), truncated, r.Header.Get("X-Amz-Max-Parts"))
	if truncated && !cut {
		fmt.Fprintf(&b, "<NextPartNumberMarker>%d</NextPartNumberMarker>\n", last)
	}
	fmt.Fprintf(&b, "<PartNumberMarker>%d</PartNumberMarker>\n", first)
	for i := first; i < last; i++ {
		fmt.Fprintf(&b, "<Part>\n")
		for _, algo := range []string{"CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"} {
			if v, ok := a.parts[i].sums[algo]; ok {
				fmt.Fprintf(&b, "<Checksum%s>%s</Checksum%s>\n", algo, v, algo)
			}
		}
		fmt.Fprintf(&b, "<PartNumber>%d</PartNumber>\n<Size>%d</Size>\n</Part>\n", i+1, len(a.parts[i].data))
	}
	fmt.Fprintf(&b, `<PartsCount>%d</PartsCount>
</ObjectParts>
<StorageClass>STANDARD</StorageClass>
<ObjectSize>%d</ObjectSize>
</GetObjectAttributesResponse>`, len(a.parts), size)
	w.Header().Set("Content-Type", "application/xml")
	w.Header().Set("Last-Modified", "Thu, 03 Dec 2026 08:00:00 GMT")
	w.Header().Set("X-Amz-Request-Id", "RECORDED")
	io.WriteString(w, b.String())
}

// checksumsOf is what S3 reports for data under each algorithm: the big-endian CRC or the
// digest, base64.
func checksumsOf(data []byte, algos ...string) map[string]string {
	sums := map[string]string{}
	for _, algo := range algos {
		var sum []byte
		switch algo {
		case "CRC32":
			sum = binary.BigEndian.AppendUint32(nil, crc32.ChecksumIEEE(data))
		case "CRC32C":
			sum = binary.BigEndian.AppendUint32(nil, crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)))
		case "SHA256":
			d := sha256.Sum256(data)
			sum = d[:]
		default:
			panic(algo)
		}
		sums[algo] = base64.StdEncoding.EncodeToString(sum)
	}
	return sums
}

// multipartETag is S3's ETag of an object uploaded in these parts: the MD5 of the parts' MD5s,
// then their number.
func multipartETag(parts []recordedPart) string {
	var md5s []byte
	for _, p := range parts {
		d := md5.Sum(p.data)
		md5s = append(md5s, d[:]...)
	}
	return fmt.Sprintf("%x-%d", md5.Sum(md5s), len(parts))
}

// TestPartsRecordedAnswers feeds Parts, through the real SDK client, GetObjectAttributes answers
// with ObjectParts. They are recorded answers, not a peer's: none of the S3 servers available
// here (versitygw 1.8, SeaweedFS, Ceph radosgw 16) reports an object's parts, so the answers
// are AWS's documented XML, paged as AWS pages it, with the parts' real checksums. The parts
// parsed must tile the object (offsets, sizes) and each checksum must be that of the part's
// bytes, whatever the number of pages; an answer that cannot be relied on gives no parts (the
// streaming read then checks the object whole against its ETag), and an ETag other than the
// listed one on any page is Changed.
func TestPartsRecordedAnswers(t *testing.T) {
	// Parts of different sizes (the last one short, as in any multipart upload) and contents.
	object := func(n int, algos ...string) []recordedPart {
		parts := make([]recordedPart, n)
		for i := range parts {
			data := make([]byte, 5<<10+i*1031)
			if i == n-1 {
				data = data[:777]
			}
			for k := range data {
				data[k] = byte(i*7 + k*13)
			}
			parts[i] = recordedPart{data: data}
			if len(algos) > 0 {
				parts[i].sums = checksumsOf(data, algos...)
			}
		}
		return parts
	}
	for _, c := range []struct {
		name  string
		parts []recordedPart
		page  int
		// changeAt, when >= 0, is the first page whose answer carries another ETag.
		changeAt   int
		truncateAt int
		stuck      bool
		// sizeDelta is added to the object's listed size: parts that no longer add up to it.
		sizeDelta int64
		status    int
		code      string

		wantAlgo    string // "": no parts
		wantErr     bool
		wantKind    source.Kind
		wantMarkers []string // the PartNumberMarker of each request, "" for none
	}{
		{name: "CRC32C parts over three pages", parts: object(5, "CRC32C"), page: 2, changeAt: -1,
			wantAlgo: "CRC32C", wantMarkers: []string{"", "2", "4"}},
		{name: "one page", parts: object(3, "CRC32"), page: 1000, changeAt: -1,
			wantAlgo: "CRC32", wantMarkers: []string{""}},
		{name: "SHA256 parts", parts: object(2, "SHA256"), page: 1, changeAt: -1,
			wantAlgo: "SHA256", wantMarkers: []string{"", "1"}},
		{name: "a CRC is preferred to a SHA256 of the same part", parts: object(3, "SHA256", "CRC32"), page: 2, changeAt: -1,
			wantAlgo: "CRC32", wantMarkers: []string{"", "2"}},
		{name: "parts without checksums: none", parts: object(3), page: 2, changeAt: -1,
			wantMarkers: []string{""}},
		{name: "truncated without a next marker: none", parts: object(4, "CRC32C"), page: 1000, truncateAt: 3, changeAt: -1,
			wantMarkers: []string{""}},
		{name: "a next marker that does not move on: none", parts: object(5, "CRC32C"), page: 2, stuck: true, changeAt: -1,
			wantMarkers: []string{"", "2"}},
		{name: "parts that add up to less than the object: none", parts: object(3, "CRC32C"), page: 2, sizeDelta: 1, changeAt: -1,
			wantMarkers: []string{"", "2"}},
		{name: "parts that add up to more than the object: none", parts: object(3, "CRC32C"), page: 2, sizeDelta: -1, changeAt: -1,
			wantMarkers: []string{"", "2"}},
		{name: "ETag changed: Changed", parts: object(3, "CRC32C"), page: 2, changeAt: 0,
			wantErr: true, wantKind: source.Changed, wantMarkers: []string{""}},
		{name: "ETag changed between pages: Changed", parts: object(5, "CRC32C"), page: 2, changeAt: 2,
			wantErr: true, wantKind: source.Changed, wantMarkers: []string{"", "2", "4"}},
		{name: "object gone: NotFound", parts: object(3, "CRC32C"), page: 2, changeAt: -1,
			status: http.StatusNotFound, code: "NoSuchKey", wantErr: true, wantKind: source.NotFound},
		{name: "GetObjectAttributes not granted: none", parts: object(3, "CRC32C"), page: 2, changeAt: -1,
			status: http.StatusForbidden, code: "AccessDenied"},
	} {
		t.Run(c.name, func(t *testing.T) {
			etag := multipartETag(c.parts)
			srv := &attributesServer{t: t, parts: c.parts, page: c.page, truncateAt: c.truncateAt, stuck: c.stuck,
				status: c.status, code: c.code, etag: func(page int) string {
					if c.changeAt >= 0 && page >= c.changeAt {
						return strings.Replace(etag, etag[:4], "ffff", 1)
					}
					return etag
				}}
			hs := httptest.NewServer(srv)
			t.Cleanup(hs.Close)
			src, err := New(Config{Bucket: "data", Prefix: "set/", Endpoint: hs.URL, PathStyle: true,
				AccessKeyID: "recorded", SecretAccessKey: "recorded"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { src.Close() })
			var size int64
			for _, p := range c.parts {
				size += int64(len(p.data))
			}
			obj := source.Object{Key: "multi.bin", Type: source.File, Size: size + c.sizeDelta, ETag: etag}

			parts, err := src.Parts(context.Background(), obj)
			if (err != nil) != c.wantErr || c.wantErr && source.KindOf(err) != c.wantKind {
				t.Fatalf("err %v, want an error %v of kind %v", err, c.wantErr, c.wantKind)
			}
			srv.mu.Lock()
			defer srv.mu.Unlock()
			if c.status == 0 && !slices.Equal(srv.markers, c.wantMarkers) {
				t.Errorf("part number markers sent %q, want %q", srv.markers, c.wantMarkers)
			}
			for _, m := range srv.maxParts {
				if m != strconv.Itoa(maxPartsPage) {
					t.Errorf("MaxParts %q, want %d", m, maxPartsPage)
				}
			}
			if c.wantAlgo == "" {
				if parts != nil {
					t.Fatalf("parts %+v, want none", parts)
				}
				return
			}
			if len(parts) != len(c.parts) {
				t.Fatalf("%d parts, want %d: %+v", len(parts), len(c.parts), parts)
			}
			whole := slices.Concat(func() [][]byte {
				var d [][]byte
				for _, p := range c.parts {
					d = append(d, p.data)
				}
				return d
			}()...)
			var off int64
			for i, p := range parts {
				if p.Off != off || p.N != int64(len(c.parts[i].data)) {
					t.Errorf("part %d at %d+%d, want %d+%d", i+1, p.Off, p.N, off, len(c.parts[i].data))
				}
				// The checksum must be that of the object's bytes at the offsets parsed.
				want := checksumsOf(whole[p.Off:p.Off+p.N], c.wantAlgo)[c.wantAlgo]
				if p.Checksum.Algorithm != c.wantAlgo || p.Checksum.Value != want {
					t.Errorf("part %d checksum %+v, want %s %s", i+1, p.Checksum, c.wantAlgo, want)
				}
				off += p.N
			}
		})
	}
}
