package testpeers

import (
	"bytes"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// What Fault.Legacy does: the proxy plays an S3 server without flexible checksums (Ceph RGW 16,
// as Debian ships it) in front of versitygw. Its answers carry no x-amz-checksum-* header and
// no checksum in their XML (PutObject, UploadPart, CompleteMultipartUpload, ListParts, HEAD);
// CompleteMultipartUpload answers an empty ETag (the object's HEAD gives it); GetObjectAttributes
// is refused with 403 AccessDenied; a HEAD ?partNumber= answers for the whole object, without
// x-amz-mp-parts-count. The requests go to versitygw as signed (a
// header or a query removed would break their signature), so it still verifies what they
// carry; only its answers are those of the older server.

// checksumXML matches the checksum elements of an S3 XML answer (ChecksumCRC32C, ChecksumType,
// ChecksumAlgorithm, ...).
var checksumXML = regexp.MustCompile(`<Checksum[A-Za-z0-9]*>[^<]*</Checksum[A-Za-z0-9]*>`)

// etagXML matches the ETag element of an S3 XML answer.
var etagXML = regexp.MustCompile(`<ETag>[^<]*</ETag>`)

// legacyRefuses answers a request the older server does not serve; false when it serves it.
func legacyRefuses(w http.ResponseWriter, r *http.Request) bool {
	if !r.URL.Query().Has("attributes") {
		return false
	}
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(http.StatusForbidden)
	io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>legacy server</Message></Error>`)
	return true
}

// legacyHeader says whether the older server's answer to r lacks header k.
func legacyHeader(r *http.Request, k string) bool {
	k = strings.ToLower(k)
	if strings.HasPrefix(k, "x-amz-checksum") {
		return true
	}
	return r.URL.Query().Has("partNumber") && r.Method == http.MethodHead && (k == "x-amz-mp-parts-count" || k == "content-range")
}

// legacyAnswer rewrites resp as the older server's answer to r, once its headers are copied to
// w: a HEAD ?partNumber= for the whole object (its size from the part's Content-Range), an XML
// body without checksums (its length set again). It returns the body to send and whether it
// changed anything.
func legacyAnswer(w http.ResponseWriter, r *http.Request, resp *http.Response) (io.Reader, bool) {
	changed := false
	if r.Method == http.MethodHead && r.URL.Query().Has("partNumber") {
		if cr := resp.Header.Get("Content-Range"); cr != "" {
			if i := strings.LastIndexByte(cr, '/'); i >= 0 {
				w.Header().Set("Content-Length", cr[i+1:])
				changed = true
			}
		}
		if resp.StatusCode == http.StatusPartialContent {
			resp.StatusCode = http.StatusOK
		}
		return resp.Body, changed
	}
	if q := r.URL.Query(); resp.StatusCode/100 != 2 || r.Method == http.MethodHead ||
		!(q.Has("uploadId") || q.Has("uploads") || q.Has("list-type") || q.Has("versions")) {
		return resp.Body, false // not an XML answer of the API (an object's bytes, which may be XML)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return bytes.NewReader(body), false
	}
	stripped := checksumXML.ReplaceAll(body, nil)
	if r.Method == http.MethodPost && r.URL.Query().Has("uploadId") {
		// RGW 16 answers CompleteMultipartUpload with an empty ETag (its HEAD gives it).
		stripped = etagXML.ReplaceAll(stripped, []byte("<ETag></ETag>"))
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(stripped)))
	return bytes.NewReader(stripped), len(stripped) != len(body)
}

// flippedBody corrupts the first byte of a request body on its way to the server.
type flippedBody struct {
	io.ReadCloser
	done bool
}

func (f *flippedBody) Read(b []byte) (int, error) {
	n, err := f.ReadCloser.Read(b)
	if n > 0 && !f.done {
		b[0] ^= 0xff
		f.done = true
	}
	return n, err
}
