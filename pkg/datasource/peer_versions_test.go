package datasource_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/datasource/peer"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// holdsNothing is a peer port that holds no dataset.
type holdsNothing struct{}

func (holdsNothing) Versions(string) []string               { return nil }
func (holdsNothing) Have(string, string) (*peer.Have, bool) { return nil, false }
func (holdsNothing) Open(string, string, int64, int64, int64) (io.ReadCloser, error) {
	return nil, peer.ErrNotHeld
}

// TestPeerVersionNamesCannotBeReplayed (issue 24, item 4): a compromised node x poses as a
// holder of every dataset, so honest nodes ask it for the versions they stage. What it hears
// does not let it read those versions from an honest peer: requests name a version bound to the
// asking node and the asked one, so the name b sent x is refused when x sends it to a. A node
// that knows the digest (it listed the source itself) is served.
func TestPeerVersionNamesCannotBeReplayed(t *testing.T) {
	ctx := testCtx(t)
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "data")
	smallTree(44, 12, 2000).upload(t, s, "data", "set/")
	spec := mustSpec(t, s3Params(s, "", "s3://data/set"))
	cfg := datasource.Config{Concurrency: 4, LowWatermark: 0.001, HighWatermark: 0.002}
	a := newManager(t, cfg)
	st, err := stage(ctx, t, a, datasource.Request{Spec: spec, Creds: creds(s), Pool: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	pa := startPeer(t, "a", a)

	var mu sync.Mutex
	var heard []string
	px := startPeerWrapped(t, "x", peer.ServerConfig{Store: holdsNothing{}}, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			heard = append(heard, r.URL.Path)
			mu.Unlock()
			h.ServeHTTP(w, r)
		})
	})
	bcfg := cfg
	bcfg.Peers = network(t, "b", "token-b", &peers{px, pa})
	b := newManager(t, bcfg)
	if _, err := stage(ctx, t, b, datasource.Request{Spec: spec, Creds: creds(s), Pool: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	paths := append([]string(nil), heard...)
	mu.Unlock()
	if len(paths) == 0 {
		t.Fatal("b never asked x: nothing was tested")
	}

	// x, with its own node plugin identity, asks a.
	ask := func(path string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+pa.Address+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer token-x")
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // the test pins nothing
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, p := range paths {
		if !strings.HasSuffix(p, "/have") {
			continue
		}
		if code := ask(p); code != http.StatusNotFound {
			t.Errorf("x replayed %s at a: answered %d, want 404", p, code)
		}
	}
	// Knowing the digest (from its own listing), x names it as its own requests do.
	own := "/v1/datasets/" + spec.ID() + "/" + peer.BindVersion(st.Version, "x", "a") + "/have"
	if code := ask(own); code != http.StatusOK {
		t.Errorf("x asking for a version it listed: %d, want 200", code)
	}
}
