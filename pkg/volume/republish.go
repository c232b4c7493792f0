package volume

// Republishes (docs/security.md, "Tokens renewed"). The CSIDriver asks for requiresRepublish:
// kubelet calls NodePublishVolume again for every volume it published, about once a minute for
// as long as the pod runs, with the pod's current ServiceAccount token (it renews one at 80% of
// its life). A publication already in place is left as it is: nothing is proved, mounted or
// filled again, since its pod proved its right when it was published and a republish hands out
// nothing new (a claim whose source changed since stays the pod's). What every call renews is
// what the node holds of the pod's credentials: the token the STS exchanges next for the reads
// made with the pod's web identity (a staging, a streaming volume's reads; pkg/datasource,
// podtokens.go), and the keeper's copy of the pod's tokens, with which a takeover proves the
// pod's access again (stream_takeover.go).

import (
	"context"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/fusekeeper"
)

// RenewCredentials hands what the node holds for the pod of a NodePublishVolume the tokens the
// call brings (volumeContext): the pod's reads under way exchange the new token next, and the
// FUSE keeper holds it for the pod's streaming volumes. A call of no pod (no podInfoOnMount),
// or with no tokens, changes nothing.
func (s *Service) RenewCredentials(ctx context.Context, volumeContext map[string]string) {
	pod := datasource.PodOf(volumeContext)
	if pod == "" || volumeContext[consts.VolumeContextSATokens] == "" {
		return
	}
	s.datasets.RenewToken(volumeContext)
	// The keeper holds, as at the publish (keptAccess), the web identity's token alone, within
	// what it holds for one volume.
	tokens := s.datasets.ProofToken(volumeContext)
	if tokens == "" || len(tokens) > fusekeeper.MaxMeta-keptConnRoom {
		return
	}
	for id, m := range s.streams.renew(pod, tokens) {
		s.keep(ctx, id, m)
	}
}

// renew gives the streaming volumes of pod that prove with the pod's tokens (web identity) the
// new ones, and returns those whose tokens changed, for the keeper: kubelet passes the same
// tokens until it renews them.
func (sm *streamMounts) renew(pod, tokens string) map[string]*streamMount {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	changed := map[string]*streamMount{}
	for id, m := range sm.m {
		if m.pod == pod && m.access.Tokens != "" && m.access.Tokens != tokens {
			m.access.Tokens = tokens
			changed[id] = m
		}
	}
	return changed
}

// accessOf is what the keeper is to hold of m besides its connection.
func (sm *streamMounts) accessOf(m *streamMount) keptStream {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return m.access
}

// inPlace says whether a volume whose record lists its publications is published at target
// and still mounted there: a republish, which changes nothing.
func (s *Service) inPlace(published map[string]bool, target string) bool {
	if _, ok := published[target]; !ok {
		return false
	}
	return s.mountedAt(target)
}

// mountedAt says whether something is mounted at path. A FUSE mount whose server is gone (an
// earlier process's, not taken over) is not: the publish serves it again.
func (s *Service) mountedAt(path string) bool {
	mnt, err := s.mounter.IsMountPoint(path)
	return err == nil && mnt
}

// served says whether a read-only inline volume is served at its path: its streaming tree by
// this process, or the cached tree bind-mounted.
func (tv *treeVolume) served() bool {
	if live, _ := tv.s.streams.live(tv.id, tv.rec.Path); live {
		return true
	}
	return tv.s.mountedAt(tv.rec.Path)
}
