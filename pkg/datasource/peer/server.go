package peer

import (
	"context"
	"crypto/hmac"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"
)

// ErrNotHeld is returned by a Store for a version or piece the node does not hold (any more).
var ErrNotHeld = errors.New("not held")

// Store is what a node holds: the datasource manager.
type Store interface {
	// Versions lists the digests of the versions of dataset id the node holds or is staging.
	Versions(id string) []string
	// Have reports what the node holds of a dataset version; false when nothing.
	Have(id, digest string) (*Have, bool)
	// Open returns [off, off+n) of manifest entry i of the version, only when Have says the node
	// holds it; ErrNotHeld otherwise.
	Open(id, digest string, i, off, n int64) (io.ReadCloser, error)
}

// Authenticator says whether a bearer token is a Cistern node plugin's, and which node's.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (node string, err error)
}

// ErrUnauthenticated is an Authenticator's answer to a token that is not a node plugin's.
var ErrUnauthenticated = errors.New("not a Cistern node plugin")

// ServerConfig configures a peer server.
type ServerConfig struct {
	Store Store
	Auth  Authenticator
	// Self is this node's name as peers know it (Peer.Node); NodeName, when set, turns the node
	// name an Authenticator returns into that form. Requests name a version bound to the asking
	// node and this one (BindVersion).
	Self     string
	NodeName func(string) string
	// Cert is the server's certificate (SelfSigned).
	Cert tls.Certificate
	// MaxUploads bounds the requests for pieces served at once (0: 8), a batch counting as one;
	// a request beyond waits up to QueueWait, then gets 503 and goes elsewhere.
	MaxUploads int
	QueueWait  time.Duration
	// BandwidthBytesPerSec caps what the node serves, across peers (0: unlimited).
	BandwidthBytesPerSec int64
}

// Server serves the pieces of dataset versions a node holds to other node plugins.
type Server struct {
	cfg     ServerConfig
	slots   chan struct{}
	limiter *rate.Limiter
	mux     *http.ServeMux

	servedBytes prometheus.Counter
	requests    *prometheus.CounterVec
}

// NewServer returns a Server; Serve starts it.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Store == nil || cfg.Auth == nil {
		return nil, errors.New("peer server needs a store and an authenticator")
	}
	if len(cfg.Cert.Certificate) == 0 {
		return nil, errors.New("peer server needs a certificate")
	}
	if cfg.MaxUploads <= 0 {
		cfg.MaxUploads = 8
	}
	if cfg.QueueWait <= 0 {
		cfg.QueueWait = 2 * time.Second
	}
	s := &Server{cfg: cfg, slots: make(chan struct{}, cfg.MaxUploads), mux: http.NewServeMux(),
		servedBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cistern_peer", Name: "served_bytes_total",
			Help: "Bytes of dataset pieces served to other nodes."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "cistern_peer", Name: "requests_total",
			Help: "Peer requests by answer: ok, unauthenticated, ratelimited, notheld, busy (uploads or token reviews), invalid, failed."}, []string{"answer"}),
	}
	if cfg.BandwidthBytesPerSec > 0 {
		s.limiter = rate.NewLimiter(rate.Limit(cfg.BandwidthBytesPerSec), int(min(cfg.BandwidthBytesPerSec, copyChunk)))
	}
	s.mux.HandleFunc("GET /v1/datasets/{id}/{digest}/have", s.have)
	s.mux.HandleFunc("GET /v1/datasets/{id}/{digest}/entries/{index}", s.entry)
	s.mux.HandleFunc("POST /v1/datasets/{id}/{digest}/batch", s.batch)
	return s, nil
}

// Collectors returns the server's metrics.
func (s *Server) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.servedBytes, s.requests}
}

// Handler is the server's HTTP handler, authentication included (tests serve it themselves).
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// Serve serves on l over TLS until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// Records of the largest size from the first byte: a connection carries pieces of
		// MiBs, not a page for a browser to start showing.
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{s.cfg.Cert}, MinVersion: tls.VersionTLS13,
			DynamicRecordSizingDisabled: true},
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	err := srv.ServeTLS(l, "", "")
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	token, ok := bearer(r)
	if !ok {
		s.refuse(w, http.StatusUnauthorized, "unauthenticated", "a node plugin's token is required")
		return
	}
	node, err := s.cfg.Auth.Authenticate(withRemote(r.Context(), remoteIP(r)), token)
	switch {
	case errors.Is(err, ErrRateLimited):
		s.refuse(w, http.StatusTooManyRequests, "ratelimited", "too many token reviews from this address")
		return
	case errors.Is(err, ErrReviewsBusy):
		s.refuse(w, http.StatusServiceUnavailable, "busy", "too many token reviews under way")
		return
	}
	if err != nil {
		klog.FromContext(r.Context()).V(2).Info("peer request refused", "remote", r.RemoteAddr, "err", err)
		s.refuse(w, http.StatusUnauthorized, "unauthenticated", "not a Cistern node plugin")
		return
	}
	if s.cfg.NodeName != nil {
		node = s.cfg.NodeName(node)
	}
	ctx := context.WithValue(r.Context(), askerKey{}, node)
	r = r.WithContext(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("peer", node)))
	s.mux.ServeHTTP(w, r)
}

type remoteKey struct{}

type askerKey struct{}

// version resolves the request's version name, bound to the asking node and this one
// (BindVersion), to the digest of a version this node holds; ok is false when none matches.
func (s *Server) version(r *http.Request) (id, digest string, ok bool, valid bool) {
	id, bound := r.PathValue("id"), r.PathValue("digest")
	if checkVersion(id, bound) != nil {
		return "", "", false, false
	}
	asker, _ := r.Context().Value(askerKey{}).(string)
	if asker == "" {
		return id, "", false, true
	}
	for _, d := range s.cfg.Store.Versions(id) {
		if hmac.Equal([]byte(BindVersion(d, asker, s.cfg.Self)), []byte(bound)) {
			return id, d, true, true
		}
	}
	return id, "", false, true
}

// withRemote tells the Authenticator the address a request came from.
func withRemote(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, remoteKey{}, addr)
}

// RemoteAddr is the address (IP) of the peer request ctx belongs to, "" outside one.
func RemoteAddr(ctx context.Context) string {
	addr, _ := ctx.Value(remoteKey{}).(string)
	return addr
}

func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func bearer(r *http.Request) (string, bool) {
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) <= len(prefix) || h[:len(prefix)] != prefix {
		return "", false
	}
	return h[len(prefix):], true
}

func (s *Server) refuse(w http.ResponseWriter, code int, answer, msg string) {
	s.requests.WithLabelValues(answer).Inc()
	http.Error(w, msg, code)
}

func (s *Server) have(w http.ResponseWriter, r *http.Request) {
	id, digest, held, valid := s.version(r)
	if !valid {
		s.refuse(w, http.StatusBadRequest, "invalid", "not a dataset version")
		return
	}
	var h *Have
	if held {
		h, held = s.cfg.Store.Have(id, digest)
	}
	if !held {
		s.refuse(w, http.StatusNotFound, "notheld", "not held")
		return
	}
	out := *h
	out.Batch = MaxBatchPieces
	s.requests.WithLabelValues("ok").Inc()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&out)
}

func (s *Server) entry(w http.ResponseWriter, r *http.Request) {
	id, digest, held, valid := s.version(r)
	i, err1 := strconv.ParseInt(r.PathValue("index"), 10, 64)
	off, err2 := strconv.ParseInt(r.URL.Query().Get("off"), 10, 64)
	n, err3 := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if !valid || errors.Join(err1, err2, err3) != nil || i < 0 || off < 0 || n <= 0 || off > math.MaxInt64-n {
		s.refuse(w, http.StatusBadRequest, "invalid", "bad piece")
		return
	}
	if !held {
		s.refuse(w, http.StatusNotFound, "notheld", "not held")
		return
	}
	if !s.acquire(w, r) {
		return
	}
	defer s.release()
	rc, err := s.cfg.Store.Open(id, digest, i, off, n)
	if errors.Is(err, ErrNotHeld) {
		s.refuse(w, http.StatusNotFound, "notheld", "not held")
		return
	}
	if err != nil {
		klog.FromContext(r.Context()).Error(err, "serving a piece", "dataset", id, "entry", i)
		s.refuse(w, http.StatusInternalServerError, "failed", "cannot read the piece")
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	s.requests.WithLabelValues("ok").Inc()
	_, _ = s.copy(r.Context(), w, rc, n)
}

// batch sends many pieces in one answer (protocol.go): one upload slot for the whole batch, its
// bytes paced by the node's upload bandwidth as any piece's.
func (s *Server) batch(w http.ResponseWriter, r *http.Request) {
	id, digest, held, valid := s.version(r)
	var req batchRequest
	if !valid {
		s.refuse(w, http.StatusBadRequest, "invalid", "not a dataset version")
		return
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBatchBody)).Decode(&req); err != nil {
		s.refuse(w, http.StatusBadRequest, "invalid", "bad batch")
		return
	}
	if err := checkBatch(req.Pieces); err != nil {
		s.refuse(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	if !held {
		s.refuse(w, http.StatusNotFound, "notheld", "not held")
		return
	}
	if !s.acquire(w, r) {
		return
	}
	defer s.release()
	w.Header().Set("Content-Type", batchContentType)
	s.requests.WithLabelValues("ok").Inc()
	var hdr [frameHeader]byte
	for _, p := range req.Pieces {
		rc, err := s.cfg.Store.Open(id, digest, p.Index, p.Off, p.N)
		if err != nil {
			if !errors.Is(err, ErrNotHeld) {
				klog.FromContext(r.Context()).Error(err, "serving a piece", "dataset", id, "entry", p.Index)
			}
			// The fetcher reads this one elsewhere; the rest of the batch still comes.
			hdr[0] = frameNotHeld
			binary.BigEndian.PutUint64(hdr[1:], 0)
			if _, err := w.Write(hdr[:]); err != nil {
				return
			}
			continue
		}
		hdr[0] = frameHeld
		binary.BigEndian.PutUint64(hdr[1:], uint64(p.N))
		_, err = w.Write(hdr[:])
		if err == nil {
			_, err = s.copy(r.Context(), w, rc, p.N)
		}
		rc.Close()
		if err != nil {
			// The answer ends inside a frame: the fetcher sees a short piece and reads it, and the
			// rest, elsewhere.
			klog.FromContext(r.Context()).V(2).Info("batch cut short", "dataset", id, "entry", p.Index, "err", err)
			return
		}
	}
}

// acquire waits a little for an upload slot: the node's own workloads come first, and a fetcher
// that is told to go elsewhere still has the other peers and the source. False when refused.
func (s *Server) acquire(w http.ResponseWriter, r *http.Request) bool {
	select {
	case s.slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(s.cfg.QueueWait)
	defer t.Stop()
	select {
	case s.slots <- struct{}{}:
		return true
	case <-t.C:
		s.refuse(w, http.StatusServiceUnavailable, "busy", "too many uploads")
		return false
	case <-r.Context().Done():
		return false
	}
}

func (s *Server) release() { <-s.slots }

// copyChunk is the unit of a paced copy.
const copyChunk = 256 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyChunk); return &b }}

// copy sends n bytes of r within the node's upload bandwidth.
func (s *Server) copy(ctx context.Context, w io.Writer, r io.Reader, n int64) (int64, error) {
	if m, ok := r.(*mappedPiece); ok && int64(len(m.data)) == n {
		return s.copyMapped(ctx, w, m.data)
	}
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var done int64
	for done < n {
		k, err := io.ReadFull(r, buf[:min(int64(len(buf)), n-done)])
		if k > 0 {
			if s.limiter != nil {
				if err := s.limiter.WaitN(ctx, k); err != nil {
					return done, err
				}
			}
			if _, err := w.Write(buf[:k]); err != nil {
				return done, err
			}
			done += int64(k)
			s.servedBytes.Add(float64(k))
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// copyMapped sends a mapped piece as copy does, writing the mapping's pages themselves.
func (s *Server) copyMapped(ctx context.Context, w io.Writer, data []byte) (int64, error) {
	var done int64
	for done < int64(len(data)) {
		k := min(copyChunk, int64(len(data))-done)
		if s.limiter != nil {
			if err := s.limiter.WaitN(ctx, int(k)); err != nil {
				return done, err
			}
		}
		var werr error
		if err := noFault(func() { _, werr = w.Write(data[done : done+k]) }); err != nil {
			return done, err
		}
		if werr != nil {
			return done, werr
		}
		done += k
		s.servedBytes.Add(float64(k))
	}
	return done, nil
}
