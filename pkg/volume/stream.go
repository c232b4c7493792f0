package volume

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/streamfs"
)

// StreamingVolumes configures streaming dataset volumes.
type StreamingVolumes struct {
	// FUSEDevice is the FUSE device streaming volumes need; empty: /dev/fuse. Tests name a
	// missing one.
	FUSEDevice string
	// OnFallback, when set, is told about a streaming volume staged instead, and why (an Event
	// on the node).
	OnFallback func(volumeID, dataset, reason string)
	// Keeper is the FUSE keeper's socket (csi-driver fuse-keeper, a process apart from the
	// plugin): each streaming volume's connection is handed to it when mounted, and taken back
	// at start (TakeOverStreams), so that a restart of the plugin loses no read. Empty, or no
	// keeper listening: no takeover, and a restart breaks the volumes' reads.
	Keeper string
	// OnRefused, when set, is told about a streaming volume taken over whose caller's access
	// could not be proved again, and why: its reads fail with EIO (an Event on the node).
	OnRefused func(volumeID, dataset, reason string)
	// MaxOpenFiles bounds the files all streaming volumes of the node hold open for the files
	// their pods read, descriptors and the kernel's backing files (past it, the least recently
	// read are closed, and opened again when read): one bound for the plugin, as a pod author
	// can make many volumes. 0: streamfs.DefaultMaxOpenFiles.
	MaxOpenFiles int
	// MaxVolumes bounds the streaming volumes the node serves at once: one more is refused
	// (ResourceExhausted). Each is a FUSE server in the plugin and a record in the keeper's
	// memory. 0: DefaultMaxStreamingVolumes.
	MaxVolumes int
	// MaxVolumesPerNamespace bounds those of one namespace (callerNamespace; the volumes that
	// name none share one such bound), so that one namespace cannot take the whole node: one
	// more is refused (ResourceExhausted). 0: a quarter of MaxVolumes (defaultShare).
	MaxVolumesPerNamespace int
}

// DefaultMaxStreamingVolumes is the bound on a node's streaming volumes when none is given:
// more than twice kubelet's default of 110 pods a node, each with one. The keeper holds at most
// fusekeeper.MaxMeta for each (4 MiB in all, under its 64 MiB); the plugin about 0.2 MiB for
// each idle one (100 mounts: 19 MiB).
const DefaultMaxStreamingVolumes = 256

// defaultShare is a namespace's share of the node's n streaming volumes when none is given: a
// quarter (as --staging-concurrency-per-source is of --staging-concurrency), so that it takes at
// least four namespaces to fill the node; of the default 256, 64: more than half of kubelet's
// 110 pods a node, each with one.
func defaultShare(n int) int { return max(1, n/4) }

// unavailable says why this node cannot serve a streaming volume, or "" when it can.
func (c StreamingVolumes) unavailable() string {
	dev := c.FUSEDevice
	if dev == "" {
		dev = "/dev/fuse"
	}
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return fmt.Sprintf("FUSE is not available on this node (%v)", err)
	}
	f.Close()
	return ""
}

// fallBack records that a streaming volume is staged instead: the volume's ID, or, for the
// lower layer of a writable one, that volume's.
func (tv *treeVolume) fallBack(ctx context.Context, spec *datasource.Spec, reason string) {
	id := tv.id
	if tv.layerOf != "" {
		id = tv.layerOf
	}
	klog.FromContext(ctx).Info("Streaming volume staged instead", "volumeID", id, "dataset", spec.String(), "reason", reason)
	if f := tv.s.streaming.OnFallback; f != nil {
		f(id, spec.String(), reason)
	}
}

// streamMounts are the streaming volumes this node plugin serves: the FUSE server of each runs
// in this process; the keeper, when there is one, keeps their connections for the next process
// (docs/datasets.md, "Streaming volumes").
type streamMounts struct {
	mu     sync.Mutex
	m      map[string]*streamMount // by volume ID
	keeper string
	files  *streamfs.OpenFiles // the bound every mount's files share
	// max bounds len(m) and the volumes being mounted (starting) together; perNamespace those of
	// one namespace (streamMount.namespace, the value of starting).
	max, perNamespace int
	starting          map[string]string
}

func newStreamMounts(c StreamingVolumes) *streamMounts {
	max := c.MaxVolumes
	if max <= 0 {
		max = DefaultMaxStreamingVolumes
	}
	share := c.MaxVolumesPerNamespace
	if share <= 0 {
		share = defaultShare(max)
	}
	return &streamMounts{m: map[string]*streamMount{}, keeper: c.Keeper, files: streamfs.NewOpenFiles(c.MaxOpenFiles),
		max: max, perNamespace: share, starting: map[string]string{}}
}

// reserve counts volume id of namespace ns, about to be mounted, against the node's bound on
// streaming volumes and the namespace's share of it, until done; once mounted (add), the volume
// counts until it stops. Volumes taken over at start count without asking: they are mounted
// already.
func (sm *streamMounts) reserve(id, ns string) (done func(), err error) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if n := len(sm.m) + len(sm.starting); n >= sm.max {
		return nil, status.Errorf(codes.ResourceExhausted, "this node serves %d streaming volumes, its most (--streaming-max-volumes); retry when one is unpublished", n)
	}
	if n := sm.inNamespace(ns); n >= sm.perNamespace {
		who := fmt.Sprintf("namespace %q", ns)
		if ns == "" {
			who = "the volumes that name no namespace (an administrator's static PVs)"
		}
		return nil, status.Errorf(codes.ResourceExhausted, "this node serves %d streaming volumes of %s, its share (--streaming-max-volumes-per-namespace); retry when one of them is unpublished", n, who)
	}
	sm.starting[id] = ns
	return func() {
		sm.mu.Lock()
		delete(sm.starting, id)
		sm.mu.Unlock()
	}, nil
}

// inNamespace counts the streaming volumes of namespace ns, mounted or being mounted. Called
// with mu held; a walk of at most max entries.
func (sm *streamMounts) inNamespace(ns string) int {
	n := 0
	for _, m := range sm.m {
		if m.namespace == ns {
			n++
		}
	}
	for _, s := range sm.starting {
		if s == ns {
			n++
		}
	}
	return n
}

type streamMount struct {
	path string
	// namespace is the namespace whose share the volume takes (treeNamespace).
	namespace string
	fs        *streamfs.Mount
	// release gives the dataset back to eviction and closes the caller's source.
	release func()
	// access is what the keeper holds besides the connection (keptStream), handed to it again
	// when it restarts, and when the pod's token is renewed (republish.go): under mu.
	access keptStream
	// pod is the pod the caller's access is of (datasource.PodOf); "" for none (a static PV's).
	pod string
	// version is the manifest digest the caller proved it reads (empty when refused).
	version string
}

func (sm *streamMounts) add(id string, m *streamMount) {
	sm.mu.Lock()
	sm.m[id] = m
	sm.mu.Unlock()
}

// live says whether the volume is served at path by this process, and the version it serves.
func (sm *streamMounts) live(id, path string) (bool, string) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	m, ok := sm.m[id]
	if !ok || m.path != path {
		return false, ""
	}
	return true, m.version
}

// stop unmounts the volume's streaming filesystem, if this process serves one, and gives its
// dataset back to eviction.
func (sm *streamMounts) stop(id string) error {
	sm.mu.Lock()
	m, ok := sm.m[id]
	delete(sm.m, id)
	sm.mu.Unlock()
	if !ok {
		return nil
	}
	err := m.fs.Close()
	m.release()
	sm.drop(id)
	return err
}

// served says whether m still serves volume id (not stopped meanwhile).
func (sm *streamMounts) served(id string, m *streamMount) bool {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.m[id] == m
}

// drop tells the keeper to let the volume's connection go.
func (sm *streamMounts) drop(id string) {
	if sm.keeper == "" {
		return
	}
	if err := fusekeeper.Drop(sm.keeper, id); err != nil {
		klog.Background().Info("Cannot tell the FUSE keeper to drop a streaming volume; it goes with the keeper", "volumeID", id, "err", err)
	}
}

// treeNamespace is the namespace whose share of the node's streaming volumes tree rec takes: that
// of the attributes it was served with (callerNamespace), recorded, so that a volume taken over
// after a restart counts where it counted before. The lower layer of a writable volume is as
// inline as that volume (an inline volume's or a per-pod copy's is Ephemeral: only its pod
// names its namespace); one whose volume is not recorded, as an inline one.
func (s *Service) treeNamespace(rec state.TreeVolume) string {
	inline := rec.Inline
	if rec.LayerOf != "" {
		v, ok := s.store.GetVolume(rec.LayerOf)
		inline = !ok || v.Ephemeral
	}
	return callerNamespace(rec.Parameters, inline)
}

// streamConfig serves a streamed dataset: what the cache holds, what the staging is yet to fetch
// once it has (fetched next, Join), the rest fetched from its source with the caller's
// credentials, within the plugin's one bound on open files.
func (s *Service) streamConfig(ds *datasource.Streaming) streamfs.Config {
	return streamfs.Config{Objects: ds.Objects, Cached: ds.Cached, Join: ds.Join, Scratch: ds.Scratch, Files: s.streams.files,
		Fetcher: streamfs.SourceFetcher{Source: ds.Source}, OnFetch: ds.OnFetch, Room: ds.Room, Unverifiable: ds.Unverifiable}
}

// serveStreaming publishes a read-only dataset volume at path as soon as the dataset is listed
// and the caller proved it reads it, the version it proved (when known) with it. served is false
// when the dataset is already staged: the caller then serves the tree as for a staged volume,
// with the version proved, or stages the volume when this node cannot stream (no FUSE: version
// is empty).
func (tv *treeVolume) serveStreaming(ctx context.Context, rec state.TreeVolume, spec *datasource.Spec, capacity int64, secrets, attrs map[string]string) (served bool, version string, err error) {
	s, path := tv.s, rec.Path
	if live, version := s.streams.live(tv.id, path); live {
		return true, version, nil
	}
	if reason := s.streaming.unavailable(); reason != "" {
		tv.fallBack(ctx, spec, reason)
		return false, "", nil
	}
	if err := s.datasets.CheckEndpoint(spec); err != nil {
		return false, "", status.Error(datasource.Code(err), err.Error())
	}
	creds, err := s.datasets.Credentials(ctx, spec, secrets, attrs)
	if err != nil {
		return false, "", status.Error(datasource.Code(err), err.Error())
	}
	access, err := s.keptAccess(spec, secrets, attrs)
	if err != nil {
		return false, "", err
	}
	wctx, cancel := budget(ctx, 30*time.Second)
	defer cancel()
	st, ds, err := s.datasets.Stream(wctx, rec.Pool, spec, creds, capacity, tv.id)
	switch {
	case err != nil:
		return false, "", status.Error(datasource.Code(err), err.Error())
	case ds == nil && st.Ready():
		return false, st.Version, nil
	case ds == nil:
		return false, "", status.Errorf(codes.Unavailable, "%s; retry later", st)
	}
	// Only a volume that streams counts: a dataset staged meanwhile is served as staged.
	ns := s.treeNamespace(rec)
	done, err := s.streams.reserve(tv.id, ns)
	if err != nil {
		ds.Release()
		return false, "", err
	}
	defer done()
	// Recorded before the mount: a restart finds the volume and Unstage releases it.
	if err := s.store.PutTreeVolume(rec); err != nil {
		ds.Release()
		return false, "", Internal("saving dataset volume state", err)
	}
	tv.rec = &rec
	// A mount left by an earlier process of the plugin is dead ("transport endpoint is not
	// connected"): it goes before the new one.
	if err := mount.CleanupMountPoint(path, s.mounter, true); err != nil {
		ds.Release()
		return false, "", Internal("clearing the streaming volume's path", err)
	}
	if err := os.MkdirAll(path, 0o750); err != nil {
		ds.Release()
		return false, "", Internal("creating the streaming volume's path", err)
	}
	fsm, err := streamfs.Start(path, s.streamConfig(ds))
	if err != nil {
		// The kernel refused the mount (no FUSE in this container, say): staged instead.
		ds.Release()
		tv.fallBack(ctx, spec, err.Error())
		return false, "", nil
	}
	m := &streamMount{path: path, namespace: ns, fs: fsm, release: ds.Release, version: st.Version, pod: datasource.PodOf(attrs), access: access}
	s.streams.add(tv.id, m)
	s.keep(ctx, tv.id, m)
	klog.FromContext(ctx).V(4).Info("Streaming dataset", "volumeID", tv.id, "dataset", spec.String(), "path", path,
		"objects", len(ds.Objects), "progress", st.String())
	return true, st.Version, nil
}
