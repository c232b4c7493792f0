package volume

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	"github.com/cistern-csi/cistern/pkg/state"
	"github.com/cistern-csi/cistern/pkg/streamfs"
)

// TestTakeOverLetsGo: at start, the keeper's connections of volumes no longer recorded, or
// whose path is not mounted from that connection any more, are let go (the keeper closes its
// copy), and none is served.
func TestTakeOverLetsGo(t *testing.T) {
	e := newFakeEnv(t, false)
	k, err := fusekeeper.Listen(filepath.Join(t.TempDir(), "keeper.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	e.s.streaming.Keeper, e.s.streams.keeper = k.Path(), k.Path()

	// "unmounted" is recorded, but nothing is mounted at its path; "gone" is not recorded.
	if err := e.store.PutTreeVolume(state.TreeVolume{ID: "unmounted", Pool: "fast", DatasetID: "d", Path: filepath.Join(e.dir, "target")}); err != nil {
		t.Fatal(err)
	}
	readers := map[string]*os.File{}
	for _, id := range []string{"unmounted", "gone"} {
		r, w, err := os.Pipe() // stands in for /dev/fuse: EOF once every copy of w is closed
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		meta, _ := json.Marshal(keptStream{Conn: streamfs.Conn{Name: "42"}, Secrets: map[string]string{"k": "v"}})
		if err := fusekeeper.Keep(k.Path(), id, w, meta); err != nil {
			t.Fatal(err)
		}
		w.Close()
		readers[id] = r
	}
	e.s.TakeOverStreams(context.Background())
	if ids, err := fusekeeper.List(k.Path()); err != nil || len(ids) != 0 {
		t.Errorf("the keeper still holds %v (%v); want nothing", ids, err)
	}
	for id, r := range readers {
		if n, err := r.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Errorf("%s: the keeper's copy is still open (read %d, %v)", id, n, err)
		}
	}
	if len(e.s.streams.m) != 0 {
		t.Errorf("serving %d volumes, want none", len(e.s.streams.m))
	}
}

// TestMountedAt: a path counts as the connection's mount only with the streaming filesystem's
// type and the connection's device.
func TestMountedAt(t *testing.T) {
	mounts := []mount.MountInfo{
		{MountPoint: "/a", FsType: "fuse.cistern-stream", Major: 0, Minor: 42},
		{MountPoint: "/b", FsType: "ext4", Major: 0, Minor: 43},
	}
	for _, tc := range []struct {
		path, conn string
		want       bool
	}{{"/a", "42", true}, {"/a", "43", false}, {"/b", "43", false}, {"/c", "42", false}} {
		if got := mountedAt(mounts, tc.path, tc.conn); got != tc.want {
			t.Errorf("mountedAt(%s, %s) = %v, want %v", tc.path, tc.conn, got, tc.want)
		}
	}
}
