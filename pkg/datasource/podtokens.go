package datasource

// Pods' ServiceAccount tokens, renewed. kubelet hands NodePublishVolume a pod's token for the
// CSIDriver's tokenRequests (one of an hour, as deployed) and, with requiresRepublish, calls it
// again about once a minute for as long as the pod runs, with the pod's current token, which it
// renews at 80% of its life. The reads made with a pod's web identity outlive the token their
// request brought: a staging of a large dataset, a streaming volume's reads on demand. Their STS
// client exchanges a token again whenever its keys near their end (an hour), so each holds the
// pod's token through one podToken, which every NodePublishVolume of that pod renews.
//
// A holder is the pod's, keyed by what kubelet sets in every NodePublishVolume's volume context
// (podInfoOnMount): the pod's namespace, name and UID, never anything a token claims, so a call
// renews only its own pod's holder. The registry keeps a holder only while a read holds it (a
// weak pointer), so that it needs no account of the sources, stagings and streaming volumes
// that hold one: they let go of it as they end.

import (
	"encoding/json"
	"errors"
	"runtime"
	"sync"
	"weak"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// PodOf names the pod of a NodePublishVolume's volume context (namespace/name/uid), or "" when
// kubelet named none (podInfoOnMount off, or NodeStageVolume, which has no pod).
func PodOf(volumeContext map[string]string) string {
	ns, name := volumeContext[consts.VolumeContextPodNamespace], volumeContext[consts.VolumeContextPodName]
	if ns == "" || name == "" {
		return ""
	}
	return ns + "/" + name + "/" + volumeContext[consts.VolumeContextPodUID]
}

// podToken is a pod's newest token, as the STS exchanges of its reads take it.
type podToken struct {
	mu    sync.Mutex
	token string
}

// GetIdentityToken implements stscreds.IdentityTokenRetriever.
func (t *podToken) GetIdentityToken() ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return []byte(t.token), nil
}

func (t *podToken) set(token string) {
	t.mu.Lock()
	t.token = token
	t.mu.Unlock()
}

// podTokens holds the tokens of the pods whose reads are under way, by PodOf.
type podTokens struct {
	mu sync.Mutex
	m  map[string]weak.Pointer[podToken]
}

// hold returns pod's holder, now holding token: the one its reads already hold, or a new one.
func (p *podTokens) hold(pod, token string) *podToken {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.m[pod].Value(); t != nil {
		t.set(token)
		return t
	}
	t := &podToken{token: token}
	wp := weak.Make(t)
	if p.m == nil {
		p.m = map[string]weak.Pointer[podToken]{}
	}
	p.m[pod] = wp
	runtime.AddCleanup(t, p.forget, podHolder{pod: pod, wp: wp})
	return t
}

// renew hands pod's reads token, if any read holds the pod's holder.
func (p *podTokens) renew(pod, token string) {
	p.mu.Lock()
	t := p.m[pod].Value()
	p.mu.Unlock()
	if t != nil {
		t.set(token)
	}
}

// podHolder names a holder that went (runtime.AddCleanup): the pod's entry goes unless it
// names a newer holder.
type podHolder struct {
	pod string
	wp  weak.Pointer[podToken]
}

func (p *podTokens) forget(h podHolder) {
	p.mu.Lock()
	if p.m[h.pod] == h.wp {
		delete(p.m, h.pod)
	}
	p.mu.Unlock()
}

// saToken is one entry of kubelet's csi.storage.k8s.io/serviceAccount.tokens.
type saToken struct {
	Token string `json:"token"`
}

// errNoToken says that a volume context holds no token for the audience.
var errNoToken = errors.New("no token for the audience")

// podTokenFor reads the pod's token for audience from a volume context: errNoToken when kubelet
// passed none, a source error when what it passed is not its JSON.
func podTokenFor(volumeContext map[string]string, audience string) (string, error) {
	raw, ok := volumeContext[consts.VolumeContextSATokens]
	if !ok {
		return "", errNoToken
	}
	var tokens map[string]saToken
	if err := json.Unmarshal([]byte(raw), &tokens); err != nil {
		return "", source.Errorf(source.Invalid, "the volume context's %s is not kubelet's JSON", consts.VolumeContextSATokens)
	}
	if t := tokens[audience]; t.Token != "" {
		return t.Token, nil
	}
	return "", errNoToken
}

// RenewToken hands the reads made with the web identity of the pod of a NodePublishVolume the
// token that call brings (volumeContext): their next exchanges at the STS take it. A pod with
// no such reads under way, or a call without a token, changes nothing.
func (d *Datasets) RenewToken(volumeContext map[string]string) {
	pod := PodOf(volumeContext)
	if pod == "" {
		return
	}
	if token, err := podTokenFor(volumeContext, d.m.audience()); err == nil {
		d.m.tokens.renew(pod, token)
	}
}
