package peer

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cistern-csi/cistern/test/framework"
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
		if burst := DefaultReviewLimits.PerAddressBurst; n.Load() > int64(burst)+2 {
			t.Errorf("%d TokenReviews for 50 random tokens from one address, want at most %d", n.Load(), burst+2)
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

// countedReviews is the API server's TokenReviews, counting those that reached it and the most
// under way at once.
type countedReviews struct {
	authnclient.TokenReviewInterface
	calls, now, most atomic.Int64
}

func (c *countedReviews) Create(ctx context.Context, tr *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error) {
	c.calls.Add(1)
	n := c.now.Add(1)
	defer c.now.Add(-1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	return c.TokenReviewInterface.Create(ctx, tr, opts)
}

// flood sends n requests with random tokens to the peer port at once, each from the local
// address from(i) (nil: the kernel's choice), and counts the answers by HTTP status.
func flood(t *testing.T, p Peer, n int, from func(i int) net.Addr) map[int]int {
	t.Helper()
	var (
		mu      sync.Mutex
		answers = map[int]int{}
		wg      sync.WaitGroup
		start   = make(chan struct{})
	)
	for i := range n {
		d := &net.Dialer{}
		if from != nil {
			d.LocalAddr = from(i)
		}
		c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // the answer's status is all that is read
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, "https://"+p.Address+"/v1/datasets/"+testID+"/"+testDigest+"/have", nil)
			req.Header.Set("Authorization", "Bearer "+rand.Text())
			<-start
			resp, err := c.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				answers[-1]++
				return
			}
			resp.Body.Close()
			answers[resp.StatusCode]++
		})
	}
	close(start)
	wg.Wait()
	return answers
}

// TestConcurrentRandomTokensBoundedReviews (issue 37, item 8): 600 requests with random tokens
// sent at once to the peer port, its reviews made by a real API server: from one address they
// cause at most that address's allowance of TokenReviews (each charged before it is made, not
// after it failed), and from 600 addresses no more than --peer-max-token-reviews are under way
// at once. The count is of the TokenReviews that reached the API server's client.
func TestConcurrentRandomTokensBoundedReviews(t *testing.T) {
	cp := framework.StartControlPlane(t, framework.Options{})
	const burst, inFlight, requests = 10, 2, 600
	serveCounted := func(t *testing.T) (Peer, *countedReviews) {
		c := &countedReviews{TokenReviewInterface: cp.Client.AuthenticationV1().TokenReviews()}
		r := &TokenReviewer{Client: c, ServiceAccounts: []string{"cistern-system/cistern-node"},
			// No refill within the test: the allowance is the burst.
			Limits: ReviewLimits{InFlight: inFlight, PerAddressBurst: burst, PerAddressRate: 1.0 / 3600}}
		return serveWith(t, ServerConfig{Store: store{}, Auth: r}), c
	}
	t.Run("from one address", func(t *testing.T) {
		p, c := serveCounted(t)
		answers := flood(t, p, requests, nil)
		if got := c.calls.Load(); got == 0 || got > burst {
			t.Errorf("%d TokenReviews for %d random tokens sent at once from one address, want 1 to %d (answers %v)", got, requests, burst, answers)
		}
		if answers[http.StatusTooManyRequests] == 0 || answers[http.StatusOK] != 0 {
			t.Errorf("answers by status (-1: no answer): %v; want the tokens past the allowance refused with 429 before any review, none served", answers)
		}
		if m := c.most.Load(); m > inFlight {
			t.Errorf("%d TokenReviews under way at once, want at most %d", m, inFlight)
		}
	})
	t.Run("from many addresses", func(t *testing.T) {
		p, c := serveCounted(t)
		answers := flood(t, p, requests, func(i int) net.Addr {
			return &net.TCPAddr{IP: net.IPv4(127, 1, byte(i>>8), byte(i))} // all of 127/8 is loopback
		})
		if m := c.most.Load(); m == 0 || m > inFlight {
			t.Errorf("%d TokenReviews under way at once from %d addresses, want 1 to %d (answers %v)", m, requests, inFlight, answers)
		}
		if answers[http.StatusOK] != 0 {
			t.Errorf("answers by status (-1: no answer): %v; want none served", answers)
		}
		t.Logf("%d TokenReviews; answers by status %v", c.calls.Load(), answers)
	})
}
