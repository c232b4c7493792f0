package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// countingReviews is reviews with a count of the TokenReviews made.
func countingReviews(t *testing.T) (*TokenReviewer, *atomic.Int64) {
	c := reviews(t)
	var n atomic.Int64
	c.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		n.Add(1)
		return false, nil, nil // counted, then answered by reviews' reactor
	})
	return &TokenReviewer{Client: c.AuthenticationV1().TokenReviews(), ServiceAccounts: []string{"cistern-system/cistern-node"}}, &n
}

// TestRandomTokensCostBoundedReviews (issue 24, item 7): random tokens on the peer port cost a
// TokenReview each only up to a small burst per address, and never push a node plugin's
// remembered token out of the cache.
func TestRandomTokensCostBoundedReviews(t *testing.T) {
	t.Run("refused tokens do not flush a node plugin's", func(t *testing.T) {
		r, n := countingReviews(t)
		ctx := context.Background()
		if node, err := r.Authenticate(ctx, "node-plugin"); err != nil || node != "node-1" {
			t.Fatalf("node plugin: %q, %v", node, err)
		}
		for i := range 3 * maxReviews {
			// From ever new addresses, so that no rate limit hides the cache's behaviour.
			actx := withRemote(ctx, fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
			if _, err := r.Authenticate(actx, fmt.Sprintf("random-%d", i)); !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("random token %d: %v", i, err)
			}
		}
		before := n.Load()
		if node, err := r.Authenticate(ctx, "node-plugin"); err != nil || node != "node-1" {
			t.Fatalf("node plugin after the flood: %q, %v", node, err)
		}
		if n.Load() != before {
			t.Error("the node plugin's token was reviewed again: the flood pushed it out of the cache")
		}
	})
	t.Run("through the peer port, from one address", func(t *testing.T) {
		r, n := countingReviews(t)
		p := serveWith(t, ServerConfig{Store: store{}, Auth: r})
		ctx := context.Background()
		limited := 0
		for i := range 50 {
			_, err := client(t, fmt.Sprintf("random-%d", i)).OpenPiece(ctx, p, testID, testDigest, 0, 0, 1)
			var se *statusError
			if errors.As(err, &se) && se.code == http.StatusTooManyRequests {
				limited++
			} else if err == nil {
				t.Fatalf("random token %d served", i)
			}
		}
		if got := n.Load(); got > failureBurst+2 {
			t.Errorf("%d TokenReviews for 50 random tokens from one address, want at most %d", got, failureBurst+2)
		}
		if limited == 0 {
			t.Error("no request was rate-limited")
		}
		// A node plugin's token, already known, is served from the same address meanwhile.
		if _, err := r.Authenticate(ctx, "node-plugin"); err != nil {
			t.Fatal(err)
		}
		rc, err := client(t, "node-plugin").OpenPiece(ctx, p, testID, testDigest, 0, 0, 1)
		if err != nil {
			t.Fatalf("node plugin refused after the flood: %v", err)
		}
		io.Copy(io.Discard, rc)
		rc.Close()
	})
}
