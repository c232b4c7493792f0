package streamfs_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/streamfs"
)

// noFetch is a fetcher for datasets the cache holds whole.
type noFetch struct{}

func (noFetch) Layout(context.Context, source.Object) (streamfs.Layout, error) {
	return streamfs.Layout{}, errors.New("not cached")
}

func (noFetch) Open(context.Context, source.Object, int64, int64) (io.ReadCloser, error) {
	return nil, errors.New("not cached")
}

// oneCachedFile is a streaming volume's mount point and configuration for one file, a.txt
// ("alpha"), in the cache; nothing can be fetched.
func oneCachedFile(t *testing.T) (string, streamfs.Config) {
	t.Helper()
	requireFUSE(t)
	cached := t.TempDir()
	if err := os.WriteFile(filepath.Join(cached, "a.txt"), []byte("alpha"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, streamfs.Config{Objects: []source.Object{{Key: "a.txt", Type: source.File, Size: 5}},
		Scratch: t.TempDir(), Fetcher: noFetch{}, Cached: func(o source.Object) (*os.File, error) {
			f, err := os.Open(filepath.Join(cached, o.Key))
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return f, err
		}}
}

// TestCloseWithACopyOfTheMount: a mount namespace made while a streaming volume is mounted (a
// container starting, another suite's node) keeps a copy of the mount, which an unmount here
// does not remove; Close still ends the server (it aborts the FUSE connection) instead of
// waiting for that namespace to go.
func TestCloseWithACopyOfTheMount(t *testing.T) {
	dir, cfg := oneCachedFile(t)
	m, err := streamfs.Start(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = exec.Command("umount", "-l", dir).Run()
		}
	})
	if b, err := os.ReadFile(filepath.Join(dir, "a.txt")); err != nil || string(b) != "alpha" {
		t.Fatalf("a.txt: %q %v", b, err)
	}
	// A new mount namespace, private: it keeps its copy of the mount whatever happens here.
	ns := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "300")
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Process.Kill(); _ = ns.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(ns.Process.Pid), "mountinfo"))
		if strings.Contains(string(b), " "+dir+" ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new mount namespace shows no copy of the mount")
		}
		time.Sleep(10 * time.Millisecond)
	}
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	select {
	case err := <-done:
		closed = true
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close waits for the other namespace's copy of the mount")
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), " "+dir+" ") {
		t.Error("still mounted here after Close")
	}
	// The server is gone: the other namespace's copy no longer answers (ENOTCONN), or is gone
	// from that namespace too (seen on this kernel in most runs once the host had many mounts;
	// either way nothing is served through it).
	out, err := exec.Command("nsenter", "--target", strconv.Itoa(ns.Process.Pid), "--mount", "cat", filepath.Join(dir, "a.txt")).CombinedOutput()
	mi, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(ns.Process.Pid), "mountinfo"))
	copyGone := !strings.Contains(string(mi), " "+dir+" ")
	if err == nil || !strings.Contains(string(out), "not connected") && !copyGone {
		t.Errorf("the copy of the mount after Close: %q, %v; want ENOTCONN (the connection aborted)", out, err)
	}
}

// TestResumeRefusesAnotherManifest: the node IDs the kernel holds follow from the manifest the
// mount was made with, so a process with another manifest must not take the mount over.
func TestResumeRefusesAnotherManifest(t *testing.T) {
	dir, cfg := oneCachedFile(t)
	m, err := streamfs.Start(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	conn, err := m.Conn()
	if err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.Objects = []source.Object{{Key: "b.txt", Type: source.File, Size: 5}, {Key: "a.txt", Type: source.File, Size: 5}}
	if _, err := streamfs.Resume(dir, conn, other); err == nil || !strings.Contains(err.Error(), "manifest") {
		t.Fatalf("Resume with another manifest: %v; want it refused", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "a.txt")); err != nil || string(b) != "alpha" {
		t.Fatalf("a.txt after the refused takeover: %q %v", b, err)
	}
}
