package datasource_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestStageNFS stages a directory below an export from a real NFSv3 server (userspace client,
// as nobody: the files are world-readable), keeping relative symlinks that stay inside.
func TestStageNFS(t *testing.T) {
	testpeers.EachNFSServer(t, func(t *testing.T, srv testpeers.NFSServer) {
		ctx := testCtx(t)
		export := t.TempDir()
		want := smallTree(5, 30, 70<<10)
		want["big.bin"] = randBytes(5, 5<<20+3)
		want.writeDir(t, filepath.Join(export, "datasets", "one"))
		dataset{"elsewhere.bin": []byte("not part of it")}.writeDir(t, export)
		if err := os.Symlink("../d00/e0/f00000.bin", filepath.Join(export, "datasets", "one", "d01", "link")); err != nil {
			t.Fatal(err)
		}
		exp := srv.Start(t, export)
		pool := t.TempDir()
		m := newManager(t, datasource.Config{ChunkSize: 1 << 20})
		spec := mustSpec(t, map[string]string{"source": exp.URL("datasets/one")})
		if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: pool}); err != nil {
			t.Fatal(err)
		}
		tree, _ := m.TreePath(pool, spec)
		checkTree(t, tree, want)
		if l, err := os.Readlink(filepath.Join(tree, "d01", "link")); err != nil || l != "../d00/e0/f00000.bin" {
			t.Fatalf("symlink: %q %v", l, err)
		}
	})
}

// TestNFSSymlinkOutside refuses a dataset whose symlink points outside it.
func TestNFSSymlinkOutside(t *testing.T) {
	testpeers.EachNFSServer(t, func(t *testing.T, srv testpeers.NFSServer) {
		ctx := testCtx(t)
		export := t.TempDir()
		dataset{"a/x.bin": []byte("x")}.writeDir(t, export)
		if err := os.Symlink("/etc/passwd", filepath.Join(export, "a", "passwd")); err != nil {
			t.Fatal(err)
		}
		exp := srv.Start(t, export)
		pool := t.TempDir()
		m := newManager(t, datasource.Config{})
		spec := mustSpec(t, map[string]string{"source": exp.URL("")})
		_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: pool})
		if datasource.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "a/passwd") {
			t.Fatalf("got %v", err)
		}
	})
}

// TestNFSMissingPath fails fast with not found.
func TestNFSMissingPath(t *testing.T) {
	testpeers.EachNFSServer(t, func(t *testing.T, srv testpeers.NFSServer) {
		ctx := testCtx(t)
		exp := srv.Start(t, t.TempDir())
		m := newManager(t, datasource.Config{})
		spec := mustSpec(t, map[string]string{"source": exp.URL("nope")})
		_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: t.TempDir()})
		if datasource.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "not found") {
			t.Fatalf("got %v", err)
		}
	})
}

// TestStageLocal copies a node directory under an allowed root, and refuses everything else.
func TestStageLocal(t *testing.T) {
	ctx := testCtx(t)
	base := t.TempDir()
	allowed := filepath.Join(base, "allowed")
	want := smallTree(6, 20, 10<<10)
	want.writeDir(t, filepath.Join(allowed, "set"))
	dataset{"secret": []byte("s")}.writeDir(t, filepath.Join(base, "private"))
	os.Symlink(filepath.Join(base, "private"), filepath.Join(allowed, "sneaky"))
	pool := t.TempDir()
	m := newManager(t, datasource.Config{LocalSourceRoots: []string{allowed}})

	spec := mustSpec(t, map[string]string{"source": "file://" + allowed + "/set"})
	if _, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: pool}); err != nil {
		t.Fatal(err)
	}
	tree, _ := m.TreePath(pool, spec)
	checkTree(t, tree, want)

	for _, tc := range []struct {
		name string
		src  string
		want codes.Code
	}{
		{"failure case - outside the roots", "file://" + base + "/private", codes.PermissionDenied},
		{"failure case - symlink out of a root", "file://" + allowed + "/sneaky", codes.PermissionDenied},
		{"failure case - missing", "file://" + allowed + "/nope", codes.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := mustSpec(t, map[string]string{"source": tc.src})
			_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: pool})
			if datasource.Code(err) != tc.want {
				t.Fatalf("got %v (%v), want %v", datasource.Code(err), err, tc.want)
			}
		})
	}
	t.Run("failure case - no roots configured", func(t *testing.T) {
		m := newManager(t, datasource.Config{})
		_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: pool})
		if datasource.Code(err) != codes.PermissionDenied {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("failure case - symlink inside pointing out", func(t *testing.T) {
		dir := filepath.Join(allowed, "links")
		dataset{"a.bin": []byte("a")}.writeDir(t, dir)
		os.Symlink("../../private/secret", filepath.Join(dir, "out"))
		spec := mustSpec(t, map[string]string{"source": "file://" + dir})
		_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: pool})
		if datasource.Code(err) != codes.FailedPrecondition {
			t.Fatalf("got %v", err)
		}
	})
}

// TestShutdownStopsStaging: staging jobs run under the manager's context; when Run returns
// (the driver shuts down) a download under way stops with Canceled.
func TestShutdownStopsStaging(t *testing.T) {
	ctx := testCtx(t)
	root := t.TempDir()
	dataset{"big.bin": randBytes(7, 8<<20)}.writeDir(t, filepath.Join(root, "set"))
	// 1 MiB/s: the download takes at least seven seconds unless it is stopped.
	m := newManager(t, datasource.Config{LocalSourceRoots: []string{root}, BandwidthBytesPerSec: 1 << 20})
	req := datasource.Request{Spec: mustSpec(t, map[string]string{"source": "file://" + root + "/set"}), Pool: t.TempDir()}
	if _, err := m.Ensure(ctx, req); err != nil {
		t.Fatal(err)
	}
	runCtx, shutdown := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { m.Run(runCtx); close(ran) }()
	shutdown()
	<-ran
	st, err := stage(ctx, t, m, req)
	if datasource.Code(err) != codes.Canceled {
		t.Fatalf("staging after shutdown: %s, %v; want Canceled", st, err)
	}
}
