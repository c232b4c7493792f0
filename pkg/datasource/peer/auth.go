package peer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
)

// Extras the API server puts in the user info of a token bound to a pod (scheduled to a node).
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

// TokenReviewer authenticates peers with TokenReview: the token must be valid for Audience, be
// one of ServiceAccounts' ("namespace/name"), and be bound to a pod scheduled to a node (the
// tokens kubelet projects into the node plugin). A pod's ordinary token (the API server's
// audience), another ServiceAccount's token, and a token not bound to a pod are all refused.
type TokenReviewer struct {
	Client          authnclient.TokenReviewInterface
	ServiceAccounts []string
	// TTL is how long an answer is remembered (0: one minute), so a busy peer port costs one
	// TokenReview per client per TTL. A token revoked with its pod is refused after at most TTL.
	TTL time.Duration

	// failures rate-limits the tokens each address may have reviewed and refused.
	failures failureLimiter

	mu sync.Mutex
	// cache holds node plugins' tokens, refused those that are not: answers about random tokens
	// (any pod on the network can send them) never push out a node plugin's, which would cost a
	// TokenReview on its next request.
	cache, refused map[[32]byte]reviewed
}

type reviewed struct {
	node  string
	err   error
	until time.Time
}

// maxReviews bounds the remembered answers of each kind (one per client token).
const maxReviews = 1024

// Authenticate implements Authenticator.
func (r *TokenReviewer) Authenticate(ctx context.Context, token string) (string, error) {
	key := sha256.Sum256([]byte(token))
	now := time.Now()
	r.mu.Lock()
	for _, m := range []map[[32]byte]reviewed{r.cache, r.refused} {
		if c, ok := m[key]; ok && now.Before(c.until) {
			r.mu.Unlock()
			return c.node, c.err
		}
	}
	r.mu.Unlock()
	addr := RemoteAddr(ctx)
	if !r.failures.mayTry(addr) {
		return "", ErrRateLimited
	}
	node, err := r.review(ctx, token)
	if err != nil && !errors.Is(err, ErrUnauthenticated) {
		return "", err // the API server did not answer: nothing is learnt about the token
	}
	if err != nil {
		r.failures.failed(addr)
	}
	ttl := r.TTL
	if ttl <= 0 {
		ttl = time.Minute
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := &r.cache
	if err != nil {
		m = &r.refused
	}
	if *m == nil || len(*m) >= maxReviews {
		*m = map[[32]byte]reviewed{}
	}
	(*m)[key] = reviewed{node: node, err: err, until: now.Add(ttl)}
	return node, err
}

func (r *TokenReviewer) review(ctx context.Context, token string) (string, error) {
	tr, err := r.Client.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{
		Token: token, Audiences: []string{Audience}}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenReview: %w", err)
	}
	st := tr.Status
	if !st.Authenticated {
		return "", fmt.Errorf("%w: token not authenticated for audience %s", ErrUnauthenticated, Audience)
	}
	if !slices.Contains(st.Audiences, Audience) {
		return "", fmt.Errorf("%w: token not for audience %s", ErrUnauthenticated, Audience)
	}
	ns, name, ok := serviceAccount(st.User.Username)
	if !ok || !slices.Contains(r.ServiceAccounts, ns+"/"+name) {
		return "", fmt.Errorf("%w: %s is not a node plugin's ServiceAccount", ErrUnauthenticated, st.User.Username)
	}
	extra := func(k string) string {
		if v := st.User.Extra[k]; len(v) == 1 {
			return v[0]
		}
		return ""
	}
	if extra(extraPodName) == "" || extra(extraPodUID) == "" {
		return "", fmt.Errorf("%w: token not bound to a pod", ErrUnauthenticated)
	}
	node := extra(extraNodeName)
	if node == "" {
		return "", fmt.Errorf("%w: token's pod is not on a node", ErrUnauthenticated)
	}
	return node, nil
}

func serviceAccount(user string) (ns, name string, ok bool) {
	rest, ok := strings.CutPrefix(user, "system:serviceaccount:")
	if !ok {
		return "", "", false
	}
	ns, name, ok = strings.Cut(rest, ":")
	return ns, name, ok && ns != "" && name != ""
}

// TokenFile reads the node plugin's own token from a file kubelet keeps fresh (a projected
// serviceAccountToken volume with audience cistern-peer), re-reading it every minute.
type TokenFile struct {
	Path string

	mu    sync.Mutex
	token string
	read  time.Time
}

// Token returns the current token.
func (f *TokenFile) Token() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.token != "" && time.Since(f.read) < time.Minute {
		return f.token, nil
	}
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return "", err
	}
	f.token, f.read = strings.TrimSpace(string(b)), time.Now()
	return f.token, nil
}

// ErrRateLimited refuses a token from an address whose tokens were refused too often lately,
// before any TokenReview.
var ErrRateLimited = fmt.Errorf("%w: too many refused tokens from this address", ErrUnauthenticated)

// An address whose tokens are refused may try again at failureRate, after a burst of
// failureBurst: a node plugin's token is never refused, so only a pod guessing (or replaying
// stale tokens) is slowed, and each of its guesses costs the API server a TokenReview.
const (
	failureRate  = rate.Limit(1)
	failureBurst = 10
	// maxFailingAddrs bounds the addresses remembered; past it they are all forgotten (each then
	// gets one more burst).
	maxFailingAddrs = 4096
)

type failureLimiter struct {
	mu    sync.Mutex
	addrs map[string]*rate.Limiter
}

func (f *failureLimiter) limiter(addr string) *rate.Limiter {
	if f.addrs == nil || len(f.addrs) >= maxFailingAddrs {
		f.addrs = map[string]*rate.Limiter{}
	}
	l := f.addrs[addr]
	if l == nil {
		l = rate.NewLimiter(failureRate, failureBurst)
		f.addrs[addr] = l
	}
	return l
}

// mayTry reports whether addr may have a token reviewed now.
func (f *failureLimiter) mayTry(addr string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.addrs[addr]
	return !ok || l.Tokens() >= 1
}

// failed charges a refused token to addr.
func (f *failureLimiter) failed(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limiter(addr).Allow()
}
