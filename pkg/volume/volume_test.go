package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/cistern-csi/cistern/pkg/ids"
	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/state"
)

// These tests run the service's logic over fakes (images in memory, mount-utils' FakeMounter, a
// recording exec): no root, no loop devices. The driver's suites cover the real thing.

// fakeImages keeps image sizes and loop attachments in memory.
type fakeImages struct {
	mu    sync.Mutex
	files map[string]int64
	loops map[string]string // device -> image
	next  int
}

func newFakeImages() *fakeImages {
	return &fakeImages{files: map[string]int64{}, loops: map[string]string{}}
}

func (f *fakeImages) Create(path string, size int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[path] = size
	return nil
}

func (f *fakeImages) CreateFrom(path, src string, size int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.files[src]
	if !ok {
		return os.ErrNotExist
	}
	f.files[path] = max(n, size)
	return nil
}

func (f *fakeImages) Grow(path string, size int64) error { return f.Create(path, size) }

func (f *fakeImages) Size(path string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.files[path]
	if !ok {
		return 0, os.ErrNotExist
	}
	return n, nil
}

func (f *fakeImages) Remove(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.files, path)
	return nil
}

func (f *fakeImages) Attach(path string) (string, error) {
	if dev, _ := f.Find(path); dev != "" {
		return dev, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	dev := fmt.Sprintf("/dev/fakeloop%d", f.next)
	f.loops[dev] = path
	return dev, nil
}

func (f *fakeImages) Find(path string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for dev, p := range f.loops {
		if p == path {
			return dev, nil
		}
	}
	return "", nil
}

func (f *fakeImages) Detach(dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.loops, dev)
	return nil
}

func (f *fakeImages) RefreshSize(string) error { return nil }

func (f *fakeImages) DeviceSize(dev string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files[f.loops[dev]], nil
}

func (f *fakeImages) attached() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.loops)
}

// recordingExec answers every command with success and remembers the command names.
type recordingExec struct {
	mu  sync.Mutex
	ran []string
}

func (r *recordingExec) Command(cmd string, args ...string) utilexec.Cmd {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ran = append(r.ran, cmd)
	return &testingexec.FakeCmd{DisableScripts: true}
}

func (r *recordingExec) CommandContext(_ context.Context, cmd string, args ...string) utilexec.Cmd {
	return r.Command(cmd, args...)
}

func (r *recordingExec) LookPath(file string) (string, error) { return file, nil }

func (r *recordingExec) count(cmd string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.ran {
		if c == cmd {
			n++
		}
	}
	return n
}

// failingMounter is a FakeMounter whose mounts fail.
type failingMounter struct{ *mount.FakeMounter }

func (failingMounter) Mount(string, string, string, []string) error {
	return errors.New("mount: wrong fs type, bad superblock")
}

// onePool is a single healthy pool.
type onePool struct{ p pool.Status }

func (o onePool) Get(name string) (pool.Status, bool) { return o.p, name == o.p.Name }
func (o onePool) List() ([]pool.Status, uint64)       { return []pool.Status{o.p}, 1 }
func (onePool) UpdateCapacity(string)                 {}
func (onePool) RecordError(string, string)            {}

type fakeEnv struct {
	s      *Service
	store  *state.Store
	images *fakeImages
	exec   *recordingExec
	mnt    *mount.FakeMounter
	dir    string
}

func newFakeEnv(t *testing.T, failMounts bool) *fakeEnv {
	t.Helper()
	dir := t.TempDir()
	store, err := state.Open(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeEnv{store: store, images: newFakeImages(), exec: &recordingExec{}, mnt: mount.NewFakeMounter(nil), dir: dir}
	var m mount.Interface = e.mnt
	if failMounts {
		m = failingMounter{e.mnt}
	}
	e.s = New(Config{NodeID: "node-1", Store: store, Images: e.images,
		Pools: onePool{pool.Status{Spec: pool.Spec{Name: "fast", Path: filepath.Join(dir, "pool")}, Healthy: true,
			TotalBytes: 8 << 30, AvailableBytes: 4 << 30}},
		Mounter: &mount.SafeFormatAndMount{Interface: m, Exec: e.exec}, Resizer: mount.NewResizeFs(e.exec)})
	return e
}

// volume records a ready volume with an image in the fake pool.
func (e *fakeEnv) volume(t *testing.T, v state.Volume) state.Volume {
	t.Helper()
	v.ID, v.Pool, v.Ready = ids.NewVolumeID("fast"), "fast", true
	if v.CapacityBytes == 0 {
		v.CapacityBytes = 64 << 20
	}
	if err := e.store.PutVolume(v); err != nil {
		t.Fatal(err)
	}
	if err := e.images.Create(image.VolumePath(filepath.Join(e.dir, "pool"), pool.MetaDir, v.ID), v.CapacityBytes); err != nil {
		t.Fatal(err)
	}
	return v
}

func wantCode(t *testing.T, err error, c codes.Code) {
	t.Helper()
	if status.Code(err) != c {
		t.Fatalf("got %v, want %s", err, c)
	}
}

func TestOpenClassifiesOnce(t *testing.T) {
	e := newFakeEnv(t, false)
	ours := e.volume(t, state.Volume{AccessType: state.Mount, FSType: "ext4"})
	if err := e.store.PutTreeVolume(state.TreeVolume{ID: "served", Pool: "fast", DatasetID: "x", Path: "/p"}); err != nil {
		t.Fatal(err)
	}
	src := map[string]string{"source": "s3://b/p"}
	inline := map[string]string{"source": "s3://b/p", "csi.storage.k8s.io/ephemeral": "true"}
	for _, tc := range []struct {
		name     string
		id       string
		context  map[string]string
		readOnly bool
		want     Kind
	}{
		{"volume of ours", ours.ID, nil, false, KindImage},
		{"volume of ours whose context names a source", ours.ID, src, false, KindImage},
		{"adopted by its ID", ids.NewVolumeID("fast"), src, false, KindImage},
		{"static PV naming a source", "imagenet", src, false, KindTree},
		{"static PV without a source", "imagenet", nil, false, KindImage},
		{"recorded tree volume, context gone", "served", nil, false, KindTree},
		{"read-only inline volume naming a source", "csi-abc", inline, true, KindTree},
		{"writable inline volume naming a source", "csi-abc", inline, false, KindImage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := e.s.Open(tc.id, tc.context, tc.readOnly).Kind(); got != tc.want {
				t.Fatalf("kind %s, want %s", got, tc.want)
			}
		})
	}
}

// TestStageFormatsOnceAndRecordsIt: a new mount volume is formatted and mounted; the new
// filesystem is recorded at once, and a retried stage does not format again.
func TestStageFormatsOnceAndRecordsIt(t *testing.T) {
	e := newFakeEnv(t, false)
	v := e.volume(t, state.Volume{AccessType: state.Mount, FSType: "ext4"})
	staging := filepath.Join(e.dir, "staging")
	r := StageRequest{Path: staging, Access: Access{FSType: "ext4"}}
	for i := 0; i < 2; i++ {
		if err := e.s.Open(v.ID, nil, false).Stage(context.Background(), r); err != nil {
			t.Fatalf("stage %d: %v", i, err)
		}
	}
	if n := e.exec.count("mkfs.ext4"); n != 1 {
		t.Fatalf("mkfs ran %d times, want once", n)
	}
	got, _ := e.store.GetVolume(v.ID)
	if !got.Formatted || got.StagingPath != staging || got.Device == "" {
		t.Fatalf("record after stage: %+v", got)
	}
	if mps, _ := e.mnt.List(); len(mps) != 1 || mps[0].Device != got.Device {
		t.Fatalf("mounts %+v", mps)
	}

	t.Run("failure case - another staging path", func(t *testing.T) {
		err := e.s.Open(v.ID, nil, false).Stage(context.Background(), StageRequest{Path: filepath.Join(e.dir, "elsewhere"), Access: Access{FSType: "ext4"}})
		wantCode(t, err, codes.FailedPrecondition)
	})
	t.Run("failure case - block capability on a mount volume", func(t *testing.T) {
		err := e.s.Open(v.ID, nil, false).Stage(context.Background(), StageRequest{Path: staging, Access: Access{Block: true}})
		wantCode(t, err, codes.InvalidArgument)
	})
}

// TestStageMountsXFSWithNouuid: an xfs volume is mounted with nouuid, whether it is formatted
// at this staging or already has a filesystem (a clone or restored snapshot carries its source's
// UUID, and XFS refuses to mount two filesystems with one UUID); ext4 gets no such option.
func TestStageMountsXFSWithNouuid(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fs        string
		formatted bool
		flags     []string
		nouuid    bool
	}{
		{"new xfs volume", "xfs", false, nil, true},
		{"clone of an xfs volume", "xfs", true, nil, true},
		{"xfs with the caller's options", "xfs", true, []string{"noatime", "nouuid"}, true},
		{"ext4 volume", "ext4", false, []string{"noatime"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t, false)
			v := e.volume(t, state.Volume{AccessType: state.Mount, FSType: tc.fs, Formatted: tc.formatted})
			r := StageRequest{Path: filepath.Join(e.dir, "staging"), Access: Access{FSType: tc.fs, MountFlags: tc.flags}}
			if err := e.s.Open(v.ID, nil, false).Stage(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			mps, _ := e.mnt.List()
			if len(mps) != 1 {
				t.Fatalf("mounts %+v", mps)
			}
			opts := mps[0].Opts
			if n := countOf(opts, "nouuid"); n != map[bool]int{true: 1, false: 0}[tc.nouuid] {
				t.Errorf("mount options %v: nouuid %d times", opts, n)
			}
			for _, f := range tc.flags {
				if !slices.Contains(opts, f) {
					t.Errorf("mount options %v lack the caller's %s", opts, f)
				}
			}
		})
	}
}

func countOf(list []string, s string) int {
	n := 0
	for _, e := range list {
		if e == s {
			n++
		}
	}
	return n
}

// TestFailedMountDetaches: when the mount fails, neither a staged nor an inline volume is left
// with its image attached (the two paths used to differ).
func TestFailedMountDetaches(t *testing.T) {
	ctx := context.Background()
	t.Run("staged", func(t *testing.T) {
		e := newFakeEnv(t, true)
		v := e.volume(t, state.Volume{AccessType: state.Mount, FSType: "ext4"})
		err := e.s.Open(v.ID, nil, false).Stage(ctx, StageRequest{Path: filepath.Join(e.dir, "staging"), Access: Access{FSType: "ext4"}})
		wantCode(t, err, codes.Internal)
		if n := e.images.attached(); n != 0 {
			t.Fatalf("%d loop devices left attached", n)
		}
		if got, _ := e.store.GetVolume(v.ID); got.StagingPath != "" || got.Formatted {
			t.Fatalf("record after a failed stage: %+v", got)
		}
	})
	t.Run("inline", func(t *testing.T) {
		e := newFakeEnv(t, true)
		vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true"}
		err := e.s.Open("csi-inline", vc, false).Publish(ctx, PublishRequest{Target: filepath.Join(e.dir, "target"),
			VolumeContext: vc, Inline: &Inline{Size: 16 << 20}})
		wantCode(t, err, codes.Internal)
		if n := e.images.attached(); n != 0 {
			t.Fatalf("%d loop devices left attached", n)
		}
	})
}

func TestPublish(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, false)
	v := e.volume(t, state.Volume{AccessType: state.Mount, FSType: "ext4"})
	staging := filepath.Join(e.dir, "staging")
	target := filepath.Join(e.dir, "target")
	pub := PublishRequest{Target: target, StagingPath: staging, ReadOnly: true, Access: Access{SingleWriter: true}}

	wantCode(t, e.s.Open(v.ID, nil, true).Publish(ctx, pub), codes.FailedPrecondition) // not staged
	if err := e.s.Open(v.ID, nil, false).Stage(ctx, StageRequest{Path: staging}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Open(v.ID, nil, true).Publish(ctx, pub); err != nil {
		t.Fatal(err)
	}
	got, _ := e.store.GetVolume(v.ID)
	if ro, ok := got.Published[target]; !ok || !ro || got.ExclusiveTarget != target {
		t.Fatalf("record after publish: %+v", got)
	}
	second := pub
	second.Target = filepath.Join(e.dir, "target-2")
	wantCode(t, e.s.Open(v.ID, nil, true).Publish(ctx, second), codes.FailedPrecondition) // single writer

	if err := e.s.Open(v.ID, nil, false).Unpublish(ctx, target); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.store.GetVolume(v.ID); len(got.Published) != 0 || got.ExclusiveTarget != "" {
		t.Fatalf("record after unpublish: %+v", got)
	}
	if err := e.s.Open(v.ID, nil, false).Unstage(ctx, staging); err != nil {
		t.Fatal(err)
	}
	if n := e.images.attached(); n != 0 {
		t.Fatalf("%d loop devices left attached after unstage", n)
	}
}

// fullImages is a pool without room: every image it creates fails with ENOSPC.
type fullImages struct{ *fakeImages }

func (fullImages) Create(string, int64) error { return unix.ENOSPC }

// TestCreateAndSnapshotRollBack: a failed image operation leaves no record and no image, and a
// full pool is ResourceExhausted.
func TestCreateAndSnapshotRollBack(t *testing.T) {
	e := newFakeEnv(t, false)
	chosen, _ := e.s.pools.Get("fast")
	v, err := e.s.Create(state.Volume{Name: "pvc-1", CapacityBytes: 16 << 20, AccessType: state.Mount}, chosen, "")
	if err != nil || !v.Ready || ids.PoolOfVolumeID(v.ID) != "fast" {
		t.Fatalf("Create: %+v %v", v, err)
	}
	sn, err := e.s.Snapshot(v, "snap-1", "")
	if err != nil || !sn.Ready || sn.SizeBytes != v.CapacityBytes {
		t.Fatalf("Snapshot: %+v %v", sn, err)
	}

	e.s.images = fullImages{e.images}
	_, err = e.s.Create(state.Volume{Name: "pvc-2", CapacityBytes: 16 << 20}, chosen, "")
	wantCode(t, err, codes.ResourceExhausted)
	if _, ok := e.store.GetVolumeByName("pvc-2"); ok {
		t.Fatal("record of a failed CreateVolume left behind")
	}

	e.s.images = e.images
	if err := e.s.Delete(v); err != nil {
		t.Fatal(err)
	}
	_, err = e.s.Snapshot(v, "snap-2", "")
	wantCode(t, err, codes.Internal)
	if _, ok := e.store.GetSnapshotByName("snap-2"); ok {
		t.Fatal("record of a failed snapshot left behind")
	}
	if err := e.s.deleteSnapshot(sn); err != nil {
		t.Fatal(err)
	}
	if len(e.images.files) != 0 {
		t.Fatalf("images left: %v", e.images.files)
	}
}
