package s3source

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// answer is an S3 server that answers the first request of each kind (listing, object read)
// with the fuzzed status and body and every later one with an empty listing: the listing
// descends into the prefixes an answer names, and a truncated page asks again.
type answer struct {
	status int
	body   []byte
	mu     sync.Mutex
	seen   map[bool]bool
}

func (a *answer) Do(req *http.Request) (*http.Response, error) {
	list := req.URL.Query().Has("list-type")
	a.mu.Lock()
	first := !a.seen[list]
	a.seen[list] = true
	a.mu.Unlock()
	status, body := a.status, a.body
	if !first {
		status, body = http.StatusOK, []byte(`<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>`)
	}
	h := http.Header{"Content-Type": []string{"application/xml"}, "Content-Length": []string{strconv.Itoa(len(body))}}
	return &http.Response{StatusCode: status, Status: http.StatusText(status), Header: h, Request: req,
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body))}, nil
}

func (a *answer) RoundTrip(req *http.Request) (*http.Response, error) { return a.Do(req) }

// FuzzResponses: whatever a tenant's S3 endpoint answers a listing or a read with (XML the SDK
// parses, any status), List and Open return what was listed or an error of a known kind, never
// a panic: keys handed on are relative to the prefix and not empty.
func FuzzResponses(f *testing.F) {
	list := `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><Prefix>p/</Prefix>` +
		`<Contents><Key>p/a.txt</Key><ETag>"0cc175b9c0f1b6a831c399e269772661"</ETag><Size>1</Size></Contents>` +
		`<Contents><Key>p/dir/</Key><Size>0</Size></Contents>` +
		`<CommonPrefixes><Prefix>p/sub/</Prefix></CommonPrefixes><IsTruncated>false</IsTruncated></ListBucketResult>`
	f.Add(200, []byte(list))
	f.Add(200, []byte(`<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>x</NextContinuationToken></ListBucketResult>`))
	f.Add(200, []byte(`<ListBucketResult><Contents><Key>p/</Key></Contents><Contents><Key>q/outside</Key><Size>-5</Size></Contents></ListBucketResult>`))
	f.Add(403, []byte(`<Error><Code>AccessDenied</Code><Message>no</Message></Error>`))
	f.Add(404, []byte(`<Error><Code>NoSuchBucket</Code></Error>`))
	f.Add(412, []byte(`<Error><Code>PreconditionFailed</Code></Error>`))
	f.Add(301, []byte(`<Error><Code>PermanentRedirect</Code><Endpoint>169.254.169.254</Endpoint></Error>`))
	f.Add(500, []byte(`<Error><Code>InternalError</Code>`))
	f.Add(503, []byte(`<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaa">]><Error><Code>&a;</Code></Error>`))
	f.Add(200, []byte{0xff, 0xfe, '<'})
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		if status < 100 || status > 599 {
			status = 200 + (status%400+400)%400
		}
		s, err := New(Config{Bucket: "b", Prefix: "p/", Endpoint: "http://s3.fuzz.invalid", PathStyle: true, AccessKeyID: "k", SecretAccessKey: "s",
			TLS: TLS{AllowPlainHTTP: true}})
		if err != nil {
			t.Fatal(err)
		}
		a := &answer{status: status, body: body, seen: map[bool]bool{}}
		opts := s.client.Options()
		opts.HTTPClient = a
		opts.Retryer = aws.NopRetryer{}
		s.client = s3.New(opts)
		s.http = &http.Client{Transport: a}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()

		err = s.List(ctx, func(o source.Object) error {
			if o.Key == "" || strings.HasPrefix(o.Key, "/") {
				t.Fatalf("listed key %q", o.Key)
			}
			return nil
		})
		checkKind(t, "List", err)
		for _, n := range []int64{1, 2} { // a whole object (signed GET) and a range (GetObject)
			rc, err := s.Open(ctx, source.Object{Key: "a.txt", Size: 2, ETag: "0cc175b9c0f1b6a831c399e269772661"}, 0, n)
			checkKind(t, "Open", err)
			if err == nil {
				_, _ = io.Copy(io.Discard, rc)
				rc.Close()
			}
		}
	})
}

// checkKind fails unless err is nil or classified (classify wraps every error it returns).
func checkKind(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		return
	}
	var e *source.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: unclassified error %T: %v", what, err, err)
	}
}
