package testpeers

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Fault is what the proxy does to one request.
type Fault struct {
	// Status answers with this HTTP status and an S3 error Code instead of forwarding.
	Status int
	Code   string
	// Body answers 200 with this body (e.g. a crafted listing) instead of forwarding.
	Body string
	// Delay waits before forwarding.
	Delay time.Duration
	// ResetAfter forwards, then resets the connection after this many body bytes (-1: off).
	ResetAfter int64
	// Stall forwards, then stops sending after ResetAfter bytes without closing, for Stall.
	Stall time.Duration
	// Truncate forwards, then ends the response cleanly after ResetAfter body bytes (short of
	// its Content-Length), with no reset.
	Truncate bool
	// StripChecksums hides the object's S3 checksums, as servers without them would.
	StripChecksums bool
	// Legacy answers as an old S3 server (Ceph RGW 16) does: no flexible checksums
	// (StripChecksums), GetObjectAttributes refused (403 AccessDenied), and a HEAD of a part
	// (?partNumber=) answered as a plain HEAD of the whole object, without x-amz-mp-parts-count
	// (legacy.go).
	Legacy bool
	// Flip corrupts the first byte of a successful response's body, headers untouched.
	Flip bool
	// Trickle forwards the body one byte at a time, this long apart: a server that answers,
	// only never quite.
	Trickle time.Duration
	// FlipRequest corrupts the first byte of the request body on its way to the server.
	FlipRequest bool
	// ETag answers this ETag header instead of the server's, as an SSE-KMS bucket answers one
	// that is not the MD5 of the body.
	ETag string
	// Name counts the fault under this name in Delivered when the proxy applied it.
	Name string
}

// None is the zero fault.
var None = Fault{ResetAfter: -1}

// LegacyS3 is a chooser (StartProxy, SetFaults) that makes the server an old S3 server for every
// request (Fault.Legacy), counted as "legacy". Other faults compose with it: set them on what it
// returns.
func LegacyS3(*http.Request, int64) Fault {
	return Fault{ResetAfter: -1, Legacy: true, StripChecksums: true, Name: "legacy"}
}

// Proxy forwards to an S3 server and injects faults chosen per request.
type Proxy struct {
	URL      string
	Requests atomic.Int64
	// Received counts the request body bytes forwarded to the server (uploads, as sent on the
	// wire: aws-chunked framing and trailers included).
	Received atomic.Int64
	// Sent counts the response body bytes read from the server for its clients (object bytes,
	// listings, error answers).
	Sent atomic.Int64
	mu   sync.Mutex
	// gets counts object GETs by path.
	gets map[string]int
	// delivered counts, by Fault.Name, the requests a fault was applied to.
	delivered map[string]int
	choose    func(r *http.Request, n int64) Fault
	target    string
}

// StartProxy starts a proxy to target (http://host:port). choose may be nil (no faults) and can
// be replaced with SetFaults.
func StartProxy(t testing.TB, target string, choose func(r *http.Request, n int64) Fault) *Proxy {
	p := &Proxy{target: target, gets: map[string]int{}, delivered: map[string]int{}, choose: choose}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

// SetFaults replaces the fault chooser.
func (p *Proxy) SetFaults(choose func(r *http.Request, n int64) Fault) {
	p.mu.Lock()
	p.choose = choose
	p.mu.Unlock()
}

// Gets returns how many GETs a path received.
func (p *Proxy) Gets(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gets[path]
}

// Delivered returns how many requests a fault named name was applied to: answered with its
// error, delayed, or cut, stalled, trickled, stripped or flipped with body left to cut. A fault
// chosen for a request whose response it could not change (a reset after a body shorter than
// ResetAfter, a flip of an error answer) is not counted, nor one for a request that never came.
func (p *Proxy) Delivered(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delivered[name]
}

func (p *Proxy) deliver(f Fault) {
	p.mu.Lock()
	p.delivered[f.Name]++
	p.mu.Unlock()
}

var transport = &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.Requests.Add(1)
	p.mu.Lock()
	choose := p.choose
	if q := r.URL.Query(); r.Method == http.MethodGet && (len(q) == 0 || len(q) == 1 && q.Has("x-id")) {
		p.gets[r.URL.Path]++ // an object GET: GetObject's (?x-id=GetObject) or a plain one
	}
	p.mu.Unlock()
	f := None
	if choose != nil {
		f = choose(r, n)
	}
	applied := false // counted once, when the fault has changed what the client gets
	deliver := func() {
		if !applied {
			applied = true
			p.deliver(f)
		}
	}
	if f.Delay > 0 {
		time.Sleep(f.Delay)
		deliver()
	}
	if f.Status != 0 {
		deliver()
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(f.Status)
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>`+f.Code+`</Code><Message>injected</Message></Error>`)
		return
	}
	if f.Body != "" {
		deliver()
		w.Header().Set("Content-Type", "application/xml")
		io.WriteString(w, f.Body)
		return
	}
	if f.Legacy && legacyRefuses(w, r) {
		deliver()
		return
	}
	body := r.Body
	if r.ContentLength != 0 { // an empty body stays http.NoBody: a wrapped one would go chunked
		if f.FlipRequest {
			body = &flippedBody{ReadCloser: body}
			deliver()
		}
		body = countingBody{body, &p.Received}
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	out.Host = r.Host // the signature covers the Host header
	out.ContentLength = r.ContentLength
	resp, err := transport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	resp.Body = countingBody{resp.Body, &p.Sent}
	for k, v := range resp.Header {
		if f.StripChecksums && strings.HasPrefix(strings.ToLower(k), "x-amz-checksum") || f.Legacy && legacyHeader(r, k) {
			deliver()
			continue
		}
		if f.ETag != "" && http.CanonicalHeaderKey(k) == "Etag" {
			deliver()
			v = []string{f.ETag}
		}
		w.Header()[k] = v
	}
	var respBody io.Reader = resp.Body
	if f.Legacy {
		var changed bool
		if respBody, changed = legacyAnswer(w, r, resp); changed {
			deliver()
		}
	}
	w.WriteHeader(resp.StatusCode)
	if f.Flip && resp.StatusCode/100 == 2 {
		var first [1]byte
		if n, _ := io.ReadFull(respBody, first[:]); n == 1 {
			first[0] ^= 0xff
			w.Write(first[:])
			deliver()
		}
	}
	if f.Trickle > 0 {
		deliver()
		trickle(w, r, respBody, f.Trickle)
		return
	}
	if f.ResetAfter < 0 {
		io.Copy(w, respBody)
		return
	}
	io.CopyN(w, respBody, f.ResetAfter)
	w.(http.Flusher).Flush()
	// The cut is a fault only when body is left: one byte more says so (never sent).
	var more [1]byte
	if n, _ := io.ReadFull(respBody, more[:]); n == 1 {
		deliver()
	}
	if f.Truncate {
		return // short of the Content-Length: the server closes the connection
	}
	if f.Stall > 0 {
		select {
		case <-time.After(f.Stall):
		case <-r.Context().Done():
		}
	}
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0) // RST, not FIN
	}
	conn.Close()
}

// countingBody adds what is read through it to n.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c countingBody) Read(b []byte) (int, error) {
	k, err := c.ReadCloser.Read(b)
	c.n.Add(int64(k))
	return k, err
}

// trickle copies body to w a byte every d, until it ends or the client goes.
func trickle(w http.ResponseWriter, r *http.Request, body io.Reader, d time.Duration) {
	var b [1]byte
	for {
		if _, err := io.ReadFull(body, b[:]); err != nil {
			return
		}
		if _, err := w.Write(b[:]); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
}
