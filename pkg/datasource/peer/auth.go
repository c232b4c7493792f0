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

	"golang.org/x/sync/singleflight"
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
	// Limits bound the TokenReviews the port's callers cause; zero fields are
	// DefaultReviewLimits'.
	Limits ReviewLimits

	// addrs charges each address the TokenReviews it causes, before each is made.
	addrs addrLimiter
	// inFlight holds a slot per TokenReview under way (Limits.InFlight).
	inFlight chan struct{}
	// flights makes one TokenReview of a token that concurrent requests bring.
	flights singleflight.Group

	once sync.Once
	mu   sync.Mutex
	// cache holds node plugins' tokens, refused those that are not: answers about random tokens
	// (any pod on the network can send them) never push out a node plugin's, which would cost a
	// TokenReview on its next request.
	cache, refused map[[32]byte]reviewed
}

// ReviewLimits bound the TokenReviews the peer port makes on its callers' behalf: any pod that
// reaches the port can send tokens, and each token the port does not know costs the API server
// a TokenReview.
type ReviewLimits struct {
	// InFlight bounds the TokenReviews under way at once, whatever the addresses; a request
	// beyond waits up to QueueWait for one, then is refused as busy (503) and goes to another
	// peer or the source.
	InFlight  int
	QueueWait time.Duration
	// PerAddressRate (a second) and PerAddressBurst bound the TokenReviews one address causes.
	// Each is charged before its review, so concurrent requests cannot all pass a check that
	// none of them was charged for yet.
	PerAddressRate  float64
	PerAddressBurst int
}

// DefaultReviewLimits are the limits a zero ReviewLimits field gets, and the driver flags'
// defaults. A node plugin's token costs one review per TTL, so a burst of 10 and one a second
// slow only a pod guessing tokens (or replaying stale ones).
var DefaultReviewLimits = ReviewLimits{InFlight: 4, QueueWait: time.Second, PerAddressRate: 1, PerAddressBurst: 10}

func (l ReviewLimits) withDefaults() ReviewLimits {
	d := DefaultReviewLimits
	if l.InFlight <= 0 {
		l.InFlight = d.InFlight
	}
	if l.QueueWait <= 0 {
		l.QueueWait = d.QueueWait
	}
	if l.PerAddressRate <= 0 {
		l.PerAddressRate = d.PerAddressRate
	}
	if l.PerAddressBurst <= 0 {
		l.PerAddressBurst = d.PerAddressBurst
	}
	return l
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
	r.once.Do(func() {
		r.Limits = r.Limits.withDefaults()
		r.inFlight = make(chan struct{}, r.Limits.InFlight)
		r.addrs.limits = r.Limits
	})
	key := sha256.Sum256([]byte(token))
	if c, ok := r.remembered(key); ok {
		return c.node, c.err
	}
	addr := RemoteAddr(ctx)
	v, err, _ := r.flights.Do(string(key[:]), func() (any, error) {
		if c, ok := r.remembered(key); ok { // a flight that just ended answered it
			return c.node, c.err
		}
		return r.reviewFor(ctx, addr, key, token)
	})
	node, _ := v.(string)
	return node, err
}

// remembered is the answer about a token reviewed within the TTL.
func (r *TokenReviewer) remembered(key [32]byte) (reviewed, bool) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range []map[[32]byte]reviewed{r.cache, r.refused} {
		if c, ok := m[key]; ok && now.Before(c.until) {
			return c, true
		}
	}
	return reviewed{}, false
}

// reviewFor reviews a token for addr, charged to addr first and within the in-flight slots, and
// remembers the answer.
func (r *TokenReviewer) reviewFor(ctx context.Context, addr string, key [32]byte, token string) (string, error) {
	if !r.addrs.allow(addr) {
		return "", ErrRateLimited
	}
	if err := r.acquire(ctx); err != nil {
		return "", err
	}
	node, err := r.review(ctx, token)
	<-r.inFlight
	if err != nil && !errors.Is(err, ErrUnauthenticated) {
		return "", err // the API server did not answer: nothing is learnt about the token
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
	(*m)[key] = reviewed{node: node, err: err, until: time.Now().Add(ttl)}
	return node, err
}

// acquire waits up to QueueWait for an in-flight slot; ErrReviewsBusy when none came.
func (r *TokenReviewer) acquire(ctx context.Context) error {
	select {
	case r.inFlight <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(r.Limits.QueueWait)
	defer t.Stop()
	select {
	case r.inFlight <- struct{}{}:
		return nil
	case <-t.C:
		return ErrReviewsBusy
	case <-ctx.Done():
		return context.Cause(ctx)
	}
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

// ErrRateLimited refuses a token from an address that caused too many TokenReviews lately,
// before any TokenReview.
var ErrRateLimited = fmt.Errorf("%w: too many token reviews from this address", ErrUnauthenticated)

// ErrReviewsBusy refuses a token, unknown and not reviewed, while ReviewLimits.InFlight
// TokenReviews are under way: the caller goes to another peer or the source.
var ErrReviewsBusy = errors.New("too many token reviews under way")

// maxAddrs bounds the addresses remembered; past it they are all forgotten (each then gets one
// more burst, and the in-flight slots still bound what they cost at once).
const maxAddrs = 4096

// addrLimiter charges each address the TokenReviews it causes.
type addrLimiter struct {
	limits ReviewLimits

	mu    sync.Mutex
	addrs map[string]*rate.Limiter
}

// allow charges addr one TokenReview, or reports that its allowance is spent.
func (f *addrLimiter) allow(addr string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.addrs == nil || len(f.addrs) >= maxAddrs {
		f.addrs = map[string]*rate.Limiter{}
	}
	l := f.addrs[addr]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(f.limits.PerAddressRate), f.limits.PerAddressBurst)
		f.addrs[addr] = l
	}
	return l.Allow()
}
