package peer

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const (
	testID     = "0123456789abcdef01234567"
	testDigest = "0123456789abcdef0123456789abcdef"
)

// store holds one ready version whose every entry is "abcdef...".
type store struct{}

func (store) Versions(id string) []string {
	if id == testID {
		return []string{testDigest}
	}
	return nil
}

func (store) Have(id, digest string) (*Have, bool) {
	return &Have{Ready: true}, id == testID && digest == testDigest
}

func (store) Open(id, digest string, _, off, n int64) (io.ReadCloser, error) {
	if id != testID || digest != testDigest {
		return nil, ErrNotHeld
	}
	return io.NopCloser(strings.NewReader(strings.Repeat("x", int(off+n))[off:])), nil
}

// reviews answers TokenReviews as an API server would for a few tokens.
func reviews(t *testing.T) *fake.Clientset {
	t.Helper()
	podBound := func(user, node string) authnv1.TokenReviewStatus {
		extra := map[string]authnv1.ExtraValue{extraPodName: {"cistern-node-x"}, extraPodUID: {"uid"}}
		if node != "" {
			extra[extraNodeName] = authnv1.ExtraValue{node}
		}
		return authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{Audience},
			User: authnv1.UserInfo{Username: user, Extra: extra}}
	}
	answers := map[string]authnv1.TokenReviewStatus{
		"node-plugin":     podBound("system:serviceaccount:cistern-system:cistern-node", "node-1"),
		"other-sa":        podBound("system:serviceaccount:tenant:default", "node-1"),
		"not-on-a-node":   podBound("system:serviceaccount:cistern-system:cistern-node", ""),
		"not-pod-bound":   {Authenticated: true, Audiences: []string{Audience}, User: authnv1.UserInfo{Username: "system:serviceaccount:cistern-system:cistern-node"}},
		"api-audience":    {Authenticated: false, Error: "token audiences [https://kubernetes.default.svc] is invalid for the target audiences [cistern-peer]"},
		"wrong-audiences": {Authenticated: true, Audiences: []string{"other"}, User: podBound("system:serviceaccount:cistern-system:cistern-node", "n").User},
	}
	c := fake.NewClientset()
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		if len(tr.Spec.Audiences) != 1 || tr.Spec.Audiences[0] != Audience {
			t.Errorf("TokenReview for audiences %v, want [%s]", tr.Spec.Audiences, Audience)
		}
		out := tr.DeepCopy()
		out.Status = answers[tr.Spec.Token]
		return true, out, nil
	})
	return c
}

func TestTokenReviewer(t *testing.T) {
	r := &TokenReviewer{Client: reviews(t).AuthenticationV1().TokenReviews(), ServiceAccounts: []string{"cistern-system/cistern-node"}}
	for _, tc := range []struct {
		token, node string
	}{
		{token: "node-plugin", node: "node-1"},
		{token: "other-sa"},
		{token: "not-on-a-node"},
		{token: "not-pod-bound"},
		{token: "api-audience"},
		{token: "wrong-audiences"},
		{token: "unknown"},
	} {
		t.Run(tc.token, func(t *testing.T) {
			for range 2 { // the second answer comes from the cache
				node, err := r.Authenticate(context.Background(), tc.token)
				if tc.node == "" {
					if !errors.Is(err, ErrUnauthenticated) {
						t.Fatalf("got %q, %v; want refused", node, err)
					}
					continue
				}
				if err != nil || node != tc.node {
					t.Fatalf("got %q, %v; want %s", node, err, tc.node)
				}
			}
		})
	}
}

// serve starts a server with the TokenReviewer on loopback.
func serve(t *testing.T) Peer {
	return serveWith(t, ServerConfig{Store: store{}})
}

func serveWith(t *testing.T, cfg ServerConfig) Peer {
	t.Helper()
	cert, hash, err := SelfSigned("a")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Cert, cfg.Self = cert, "a"
	if cfg.Auth == nil {
		cfg.Auth = &TokenReviewer{Client: reviews(t).AuthenticationV1().TokenReviews(), ServiceAccounts: []string{"cistern-system/cistern-node"}}
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return Peer{Node: "a", Address: l.Addr().String(), CertHash: hash}
}

type noPeers struct{}

func (noPeers) Peers(string) []Peer { return nil }

func client(t *testing.T, token string) *Network {
	t.Helper()
	// "node-1": the node the reviews put the node plugin's token on.
	n, err := NewNetwork(NetworkConfig{Self: "node-1", Directory: noPeers{}, Token: func() (string, error) { return token, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPeerPortAuthentication: only a node plugin's peer token is served; a pod's own token (any
// other ServiceAccount, the API server's audience, not bound to a pod on a node) is refused.
func TestPeerPortAuthentication(t *testing.T) {
	p := serve(t)
	ctx := context.Background()
	t.Run("node plugin", func(t *testing.T) {
		rc, err := client(t, "node-plugin").OpenPiece(ctx, p, testID, testDigest, 0, 2, 3)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "xxx" {
			t.Fatalf("got %q", b)
		}
		if _, err := client(t, "node-plugin").HaveOf(ctx, p, testID, strings.Repeat("f", 32)); !isStatus(err, http.StatusNotFound) {
			t.Fatalf("a version the node does not hold: %v", err)
		}
	})
	for _, token := range []string{"", "other-sa", "not-on-a-node", "not-pod-bound", "api-audience", "wrong-audiences", "unknown"} {
		t.Run("failure case - token "+token, func(t *testing.T) {
			_, err := client(t, token).HaveOf(ctx, p, testID, testDigest)
			if !isStatus(err, http.StatusUnauthorized) {
				t.Fatalf("got %v, want 401", err)
			}
			_, err = client(t, token).OpenPiece(ctx, p, testID, testDigest, 0, 0, 3)
			if !isStatus(err, http.StatusUnauthorized) {
				t.Fatalf("got %v, want 401", err)
			}
			_, err = client(t, token).OpenBatch(ctx, p, testID, testDigest, []Range{{Index: 0, N: 3}})
			if !isStatus(err, http.StatusUnauthorized) {
				t.Fatalf("batch: got %v, want 401", err)
			}
		})
	}
	t.Run("failure case - plain HTTP", func(t *testing.T) {
		resp, err := http.Get("http://" + p.Address + havePath(testID, testDigest))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Fatal("served over plain HTTP")
			}
		}
	})
	t.Run("failure case - another certificate than the one published", func(t *testing.T) {
		_, other, err := SelfSigned("mallory")
		if err != nil {
			t.Fatal(err)
		}
		q := p
		q.CertHash = other
		if _, err := client(t, "node-plugin").HaveOf(ctx, q, testID, testDigest); err == nil || !strings.Contains(err.Error(), "not the one it published") {
			t.Fatalf("got %v, want the certificate refused", err)
		}
	})
}

func isStatus(err error, code int) bool {
	var se *statusError
	return errors.As(err, &se) && se.code == code
}

func TestHave(t *testing.T) {
	var bits []byte
	bits = SetEntry(bits, 3)
	bits = SetEntry(bits, 17)
	h := &Have{Entries: bits, Ranges: []Range{{Index: 5, Off: 10, N: 10}}, Busy: []Range{{Index: 6, Off: 0, N: 4}}}
	for _, tc := range []struct {
		i, off, n int64
		has, busy bool
	}{
		{3, 0, 100, true, false}, {17, 5, 5, true, false}, {4, 0, 1, false, false},
		{5, 10, 10, true, false}, {5, 12, 8, true, false}, {5, 9, 2, false, false}, {5, 15, 10, false, false},
		{6, 0, 4, false, true}, {6, 1, 2, false, true}, {6, 2, 4, false, false}, {1000, 0, 1, false, false},
	} {
		if got := h.Has(tc.i, tc.off, tc.n); got != tc.has {
			t.Errorf("Has(%d, %d, %d) = %v", tc.i, tc.off, tc.n, got)
		}
		if got := h.IsBusy(tc.i, tc.off, tc.n); got != tc.busy {
			t.Errorf("IsBusy(%d, %d, %d) = %v", tc.i, tc.off, tc.n, got)
		}
	}
}
