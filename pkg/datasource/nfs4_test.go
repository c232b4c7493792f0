//go:build cgo && libnfs

package datasource_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// ganeshaV4 exports a new directory from nfs-ganesha over NFSv4 and returns it with the server's
// address.
func ganeshaV4(t *testing.T) (string, string) {
	t.Helper()
	export := t.TempDir()
	if err := os.Chmod(export, 0o755); err != nil {
		t.Fatal(err)
	}
	return export, testpeers.StartGaneshaNFSv4(t, export)
}

// TestStageNFSv4 stages a directory of nfs-ganesha's NFSv4 namespace (nfsVersion=4) as the
// node's default identity (nobody): nested directories, an empty file, a one-byte file, a file
// larger than the read chunk, unicode names, byte for byte; a relative symlink inside is kept.
func TestStageNFSv4(t *testing.T) {
	ctx := testCtx(t)
	export, server := ganeshaV4(t)
	want := smallTree(7, 30, 70<<10)
	want["big.bin"] = randBytes(7, 5<<20+3)
	want["empty"] = []byte{}
	want["one"] = []byte{'1'}
	want["ünïcödé/日本語 名前.txt"] = []byte("unicode\n")
	dir := filepath.Join(export, "datasets", "one")
	want.writeDir(t, dir)
	dataset{"elsewhere.bin": []byte("not part of it")}.writeDir(t, export)
	if err := os.Symlink("../d00/e0/f00000.bin", filepath.Join(dir, "d01", "link")); err != nil {
		t.Fatal(err)
	}
	pool := t.TempDir()
	m := newManager(t, datasource.Config{ChunkSize: 1 << 20})
	spec := mustSpec(t, map[string]string{"source": "nfs://" + server + dir, "nfsVersion": "4"})
	st, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	tree, _ := m.TreePath(pool, spec)
	checkTree(t, tree, want)
	if l, err := os.Readlink(filepath.Join(tree, "d01", "link")); err != nil || l != "../d00/e0/f00000.bin" {
		t.Fatalf("symlink: %q %v", l, err)
	}
	t.Logf("staged %d objects, %d bytes over NFSv4", st.ObjectsTotal, st.BytesTotal)
}

// TestNFSv4Refused: over NFSv4, a dataset with a symlink out of it, a path not there, and a file
// the node's identity may not read (0600, root's) each fail staging with their code, naming the
// entry.
func TestNFSv4Refused(t *testing.T) {
	ctx := testCtx(t)
	export, server := ganeshaV4(t)
	dataset{"out/a/x.bin": []byte("x"), "private/ok": []byte("ok"), "private/secret": []byte("s")}.writeDir(t, export)
	if err := os.Symlink("../../private/secret", filepath.Join(export, "out", "a", "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(export, "private", "secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := newManager(t, datasource.Config{})
	for _, tc := range []struct {
		name, path string
		code       codes.Code
		names      string
	}{
		{"symlink outside", "/out", codes.FailedPrecondition, "a/escape"},
		{"missing path", "/nope", codes.FailedPrecondition, "nope"},
		{"unreadable file", "/private", codes.PermissionDenied, "secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := mustSpec(t, map[string]string{"source": "nfs://" + server + export + tc.path, "nfsVersion": "4"})
			_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: t.TempDir()})
			if datasource.Code(err) != tc.code || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("got %v (%v), want %v naming %s", err, datasource.Code(err), tc.code, tc.names)
			}
		})
	}
}
