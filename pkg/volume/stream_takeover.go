package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/streamfs"
)

// keptStream is what the keeper holds beside a streaming volume's connection: what the next
// process needs to serve it (streamfs.Conn) and to prove the caller's access again, which only
// NodeStageVolume and NodePublishVolume bring: of their secrets and the pod's ServiceAccount
// tokens, what the proof reads (keptAccess). It lives in the keeper's memory only, never on
// disk: the records (state) keep no secret, and a node reboot, which ends the keeper, ends the
// mounts too.
type keptStream struct {
	Conn    streamfs.Conn     `json:"conn"`
	Secrets map[string]string `json:"secrets,omitempty"`
	// Tokens is kubelet's csi.storage.k8s.io/serviceAccount.tokens with the web identity's
	// audience only.
	Tokens string `json:"tokens,omitempty"`
}

// keptConnRoom is what a volume's connection adds to its record in the keeper (the INIT request
// in base64, the manifest's digest, the connection's name: 300 bytes), with room to spare.
const keptConnRoom = 1 << 10

// keptAccess is what the keeper is to hold of the caller's access: only what the proof reads
// (Datasets.ProofInputs), within what the keeper holds for one volume (fusekeeper.MaxMeta), so
// that volumes with large secrets cannot run the keeper out of memory. Called after Credentials
// accepted the same inputs.
func (s *Service) keptAccess(spec *datasource.Spec, secrets, attrs map[string]string) (keptStream, error) {
	var kept keptStream
	kept.Secrets, kept.Tokens = s.datasets.ProofInputs(spec, secrets, attrs)
	if s.streaming.Keeper == "" {
		return kept, nil
	}
	b, err := json.Marshal(kept)
	if err != nil {
		return keptStream{}, Internal("encoding the record for the FUSE keeper", err)
	}
	if len(b) > fusekeeper.MaxMeta-keptConnRoom {
		return keptStream{}, status.Errorf(codes.InvalidArgument, "the credentials of this streaming volume are %d bytes, more than the %d the FUSE keeper holds for one volume",
			len(b), fusekeeper.MaxMeta-keptConnRoom)
	}
	return kept, nil
}

// takeOverBudget bounds the proof and listing of one volume taken over; its readers wait
// meanwhile (the kernel queues their requests). The plugin answers no call until every volume
// is taken over, and the DaemonSet's liveness probe restarts a container that answers none for
// about 90 s: a minute leaves room.
const takeOverBudget = time.Minute

// keep hands a copy of the volume's FUSE connection to the keeper, with the caller's access.
// Without a keeper the volume is served as before, and a restart breaks its reads.
func (s *Service) keep(ctx context.Context, id string, m *streamMount) {
	logger := klog.FromContext(ctx)
	if s.streaming.Keeper == "" {
		return
	}
	conn, err := m.fs.Conn()
	if err != nil {
		logger.Error(err, "Cannot copy a streaming volume's FUSE connection for the keeper: a restart of the plugin will break its reads", "volumeID", id)
		return
	}
	defer conn.Dev.Close()
	kept := s.streams.accessOf(m)
	kept.Conn = conn
	meta, err := json.Marshal(kept)
	if err == nil {
		err = fusekeeper.Keep(s.streaming.Keeper, id, conn.Dev, meta)
	}
	if err != nil {
		logger.Info("No FUSE keeper: a restart of the node plugin will break this streaming volume's reads", "volumeID", id, "keeper", s.streaming.Keeper, "err", err)
	}
}

// keeperCheck is how often the plugin looks whether the keeper lacks a volume.
const keeperCheck = 10 * time.Second

// WatchKeeper hands the keeper again every streaming volume this process serves that it does
// not hold: a keeper that started again holds nothing, and the plugin's next restart would
// otherwise break those volumes' reads. Runs until ctx ends.
func (s *Service) WatchKeeper(ctx context.Context) {
	if s.streaming.Keeper == "" {
		return
	}
	t := time.NewTicker(keeperCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.streams.mu.Lock()
		live := maps.Clone(s.streams.m)
		s.streams.mu.Unlock()
		if len(live) == 0 {
			continue
		}
		ids, err := fusekeeper.List(s.streaming.Keeper)
		if err != nil {
			continue // no keeper (yet): the next look
		}
		for _, id := range ids {
			delete(live, id)
		}
		if len(live) > 0 {
			klog.FromContext(ctx).Info("The FUSE keeper lacks streaming volumes (it started again): handing them over", "volumes", len(live))
		}
		for vid, m := range live {
			if s.streams.served(vid, m) {
				s.keep(ctx, vid, m)
			}
		}
	}
}

// TakeOverStreams serves again the streaming volumes an earlier process of the plugin served:
// their connections come back from the keeper, and each caller's access is proved again with
// its own credentials before any byte is served. A volume whose access cannot be proved gets
// EIO for every read (and an Event says why); a connection of a volume no longer recorded, or
// no longer mounted, is dropped. It runs at start, before the plugin answers any call.
func (s *Service) TakeOverStreams(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if s.streaming.Keeper == "" {
		return
	}
	held, err := fusekeeper.Take(s.streaming.Keeper)
	if err != nil {
		logger.Info("No FUSE keeper: streaming volumes an earlier process served are not taken over, their reads fail until their pods start again", "keeper", s.streaming.Keeper, "err", err)
		return
	}
	mounts, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		logger.Error(err, "Cannot read the mounts: no streaming volume taken over")
		for _, h := range held {
			h.Dev.Close()
		}
		return
	}
	var wg sync.WaitGroup
	for _, h := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.takeOver(ctx, h, mounts)
		}()
	}
	wg.Wait()
}

// takeOver serves one connection the keeper held.
func (s *Service) takeOver(ctx context.Context, h fusekeeper.Held, mounts []mount.MountInfo) {
	logger := klog.FromContext(ctx).WithValues("volumeID", h.ID)
	defer h.Dev.Close()
	var kept keptStream
	if err := json.Unmarshal(h.Meta, &kept); err != nil {
		logger.Error(err, "The FUSE keeper's record of a streaming volume is unreadable; letting it go")
		s.streams.drop(h.ID)
		return
	}
	rec, ok := s.store.GetTreeVolume(h.ID)
	if !ok || !mountedAt(mounts, rec.Path, kept.Conn.Name) {
		logger.Info("Letting go of the FUSE connection of a streaming volume no longer served here", "recorded", ok, "path", rec.Path)
		s.streams.drop(h.ID)
		return
	}
	kept.Conn.Dev = h.Dev
	tv := &treeVolume{s: s, id: rec.ID, rec: &rec, inline: rec.Inline}
	fsm, release, version, err := tv.resume(ctx, rec, kept)
	if err != nil {
		s.refuse(ctx, rec, kept, err.Error())
		return
	}
	s.streams.add(rec.ID, &streamMount{path: rec.Path, namespace: s.treeNamespace(rec), fs: fsm, release: release, version: version,
		pod: datasource.PodOf(rec.Parameters), access: keptStream{Secrets: kept.Secrets, Tokens: kept.Tokens}})
	logger.Info("Took over a streaming volume: its reads go on", "path", rec.Path)
}

// mountedAt says whether path is mounted from the FUSE connection named conn.
func mountedAt(mounts []mount.MountInfo, path, conn string) bool {
	for _, m := range mounts {
		if m.MountPoint == path && m.FsType == "fuse."+streamfs.Subtype &&
			strconv.FormatUint(uint64(m.Major)<<20|uint64(m.Minor), 10) == conn {
			return true
		}
	}
	return false
}

// resume proves the caller of rec again with the credentials kept, and serves its connection
// from the version the volume referenced, held by descriptor, wherever it is now: as it streams,
// or staged if the staging finished meanwhile. It returns the version proved.
func (tv *treeVolume) resume(ctx context.Context, rec state.TreeVolume, kept keptStream) (*streamfs.Mount, func(), string, error) {
	s := tv.s
	spec, capacity, err := tv.servedDataset(rec)
	if err != nil {
		return nil, nil, "", err
	}
	attrs := maps.Clone(rec.Parameters)
	if kept.Tokens != "" {
		attrs[consts.VolumeContextSATokens] = kept.Tokens
	}
	creds, err := s.datasets.Credentials(ctx, spec, kept.Secrets, attrs)
	if err != nil {
		return nil, nil, "", fmt.Errorf("the caller's credentials: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, takeOverBudget)
	defer cancel()
	st, ds, err := s.datasets.ResumeStream(wctx, rec.Pool, spec, creds, capacity, rec.ID)
	switch {
	case err != nil:
		return nil, nil, "", fmt.Errorf("proving the caller's access again: %w", err)
	case ds == nil:
		return nil, nil, "", fmt.Errorf("the dataset's listing did not come within %v (%s)", takeOverBudget, st)
	}
	dev, err := dupConn(kept.Conn)
	if err != nil {
		ds.Release()
		return nil, nil, "", err
	}
	// Resume serves it only if its manifest is the one the kernel's node IDs came from.
	fsm, err := streamfs.Resume(rec.Path, dev, s.streamConfig(ds))
	if err != nil {
		ds.Release()
		return nil, nil, "", err
	}
	return fsm, ds.Release, st.Version, nil
}

// dupConn is c with a copy of its descriptor (Resume takes the one it is given, also when it
// fails; the caller keeps its own for Refuse, and closes it).
func dupConn(c streamfs.Conn) (streamfs.Conn, error) {
	fd, err := unix.FcntlInt(c.Dev.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return c, fmt.Errorf("copying the FUSE connection's descriptor: %w", err)
	}
	c.Dev = os.NewFile(uintptr(fd), "/dev/fuse")
	return c, nil
}

// refuse serves rec's connection with EIO for every read, since its caller's access could not
// be proved again, and says why; unstaging it ends the connection as for any streaming volume.
func (s *Service) refuse(ctx context.Context, rec state.TreeVolume, kept keptStream, reason string) {
	c := kept.Conn
	klog.FromContext(ctx).Error(errors.New(reason), "Streaming volume taken over without its caller's access proved: its reads fail with EIO until it is unstaged", "volumeID", rec.ID, "path", rec.Path)
	if f := s.streaming.OnRefused; f != nil {
		id := rec.ID
		if rec.LayerOf != "" {
			id = rec.LayerOf // the writable volume layered on this tree
		}
		f(id, rec.DatasetID, reason)
	}
	dev, err := dupConn(c)
	var fsm *streamfs.Mount
	if err == nil {
		fsm, err = streamfs.Refuse(rec.Path, dev, reason)
	}
	if err != nil {
		// Readers must not wait forever: ended, their reads get ENOTCONN.
		klog.FromContext(ctx).Error(err, "Cannot serve EIO on a streaming volume; ending its connection", "volumeID", rec.ID)
		_ = streamfs.AbortConn(c.Name)
		s.streams.drop(rec.ID)
		return
	}
	s.streams.add(rec.ID, &streamMount{path: rec.Path, namespace: s.treeNamespace(rec), fs: fsm, release: func() {}, pod: datasource.PodOf(rec.Parameters),
		access: keptStream{Secrets: kept.Secrets, Tokens: kept.Tokens}})
}
