package streamfs_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/streamfs"
)

// TestJoinedOpenEndsWithItsReader kills a reader whose open waits for the staging's copy of
// its file (Config.Join): the wait must end with the reader, not with the staging or the mount
// (a staging that never brings the file would keep the killed process in the kernel for ever),
// and the mount must serve the next reader.
func TestJoinedOpenEndsWithItsReader(t *testing.T) {
	requireFUSE(t)
	data := map[string][]byte{"a.bin": randomBytes(7, 1<<20)}
	var calls atomic.Int32
	waiting := make(chan struct{})
	ended := make(chan error, 1)
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := streamfs.Start(dir, streamfs.Config{
		Objects: []source.Object{{Key: "a.bin", Type: source.File, Size: 1 << 20}},
		Scratch: t.TempDir(), Fetcher: memFetcher{data: data, partN: 64 << 10},
		Cached: func(source.Object) (*os.File, error) { return nil, nil },
		// The first join waits until its context ends; later ones give up at once, and the
		// read fetches the file itself.
		Join: func(ctx context.Context, _ int64, _ source.Object) bool {
			if calls.Add(1) > 1 {
				return false
			}
			close(waiting)
			<-ctx.Done()
			ended <- ctx.Err()
			return false
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	reader := exec.Command("cat", filepath.Join(dir, "a.bin"))
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waiting:
	case <-time.After(time.Minute):
		t.Fatal("the open never joined the staging")
	}
	if err := reader.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		t.Logf("the join ended with its reader: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the open still waits for the staging a minute after its reader was killed")
	}
	if err := reader.Wait(); err == nil {
		t.Error("the killed reader exited 0")
	}
	got, err := os.ReadFile(filepath.Join(dir, "a.bin"))
	if err != nil || !bytes.Equal(got, data["a.bin"]) {
		t.Fatalf("the next read: %d bytes, err %v: not the file's bytes", len(got), err)
	}
	if n := calls.Load(); n < 2 {
		t.Errorf("%d joins, want the killed reader's and the next reader's", n)
	}
}
