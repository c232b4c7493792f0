package s3source

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/egress"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// counting is a loopback HTTP server that counts the requests it gets.
func counting(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// TestRedirectsAreNotFollowed: a server answering every request with a redirect to an internal
// URL gets nothing of that URL into the volume, through the listing, the whole-object signed GET
// and GetObject alike.
func TestRedirectsAreNotFollowed(t *testing.T) {
	internal, internalHits := counting(t, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "node secret")
	})
	for _, status := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusMovedPermanently} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			redirector, _ := counting(t, func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, internal.URL+"/latest/meta-data/", status)
			})
			for _, signed := range []bool{true, false} {
				cfg := Config{Bucket: "data", Endpoint: redirector.URL, PathStyle: true}
				if signed {
					cfg.AccessKeyID, cfg.SecretAccessKey = "AKID", "secret"
				}
				src, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { src.Close() })
				ctx := context.Background()
				if err := src.List(ctx, func(source.Object) error { return nil }); source.KindOf(err) != source.Invalid {
					t.Errorf("List: %v, want an invalid-endpoint error", err)
				}
				obj := source.Object{Key: "a.bin", Type: source.File, Size: 11, ETag: "0123"}
				for _, r := range [][2]int64{{0, 11}, {2, 4}} { // whole (signed GET first), ranged (GetObject)
					rc, err := src.Open(ctx, obj, r[0], r[1])
					if err == nil {
						b, _ := io.ReadAll(rc)
						rc.Close()
						t.Fatalf("Open(%d, %d) read %q through a redirect", r[0], r[1], b)
					}
					if source.KindOf(err) != source.Invalid || !strings.Contains(err.Error(), "redirect") {
						t.Errorf("Open(%d, %d): %v, want an error naming the redirect", r[0], r[1], err)
					}
				}
			}
		})
	}
	if n := internalHits.Load(); n != 0 {
		t.Fatalf("the redirect target got %d requests", n)
	}
}

// TestEgressPolicyRefusesBeforeConnecting: an address outside the policy is refused after name
// resolution and before the connection is made, without retries. Only loopback is dialled: the
// policy allows 10.0.0.0/8, which loopback is not in.
func TestEgressPolicyRefusesBeforeConnecting(t *testing.T) {
	srv, hits := counting(t, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusForbidden)
	})
	policy := egress.Policy{Nets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	byName := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) // resolved at dial time
	for _, endpoint := range []string{srv.URL, byName} {
		src, err := New(Config{Bucket: "data", Endpoint: endpoint, PathStyle: true, Egress: policy})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		err = src.List(context.Background(), func(source.Object) error { return nil })
		if source.KindOf(err) != source.Denied || !strings.Contains(err.Error(), "not in the allowed endpoint networks") {
			t.Errorf("List via %s: %v, want denied by the endpoint policy", endpoint, err)
		}
		if _, err := src.Open(context.Background(), source.Object{Key: "k", Size: 1}, 0, 1); source.KindOf(err) != source.Denied {
			t.Errorf("Open via %s: %v, want denied", endpoint, err)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("server got %d requests", n)
	}
}
