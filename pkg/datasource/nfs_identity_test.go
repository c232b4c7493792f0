package datasource_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/datasource"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestNFSIdentity stages from nfs-ganesha, which enforces AUTH_UNIX (go-nfs does not), as the
// node's identity (--nfs-uid/--nfs-gid): the export's squash rules and the files' owners and
// modes decide what it reads. A dataset with a file the identity may not read is refused
// (PermissionDenied, naming the file) and nothing of that file reaches the pool, nor is a tree
// published; the same dataset stages for an identity that may read it. Root is squashed to
// nobody by a Root_Squash export, so a root-only file is refused there, and read where the
// export does not squash.
func TestNFSIdentity(t *testing.T) {
	ctx := testCtx(t)
	plain, squashed := t.TempDir(), t.TempDir()
	secret := []byte("only uid 1000 reads this")
	rootOnly := []byte("only root reads this")
	dataset{"set/public.bin": []byte("anyone")}.writeDir(t, plain)
	private(t, filepath.Join(plain, "set", "secret.bin"), secret, 1000)
	dataset{"rootset/public.bin": []byte("anyone")}.writeDir(t, plain)
	private(t, filepath.Join(plain, "rootset", "root-only.bin"), rootOnly, 0)
	dataset{"set/public.bin": []byte("anyone")}.writeDir(t, squashed)
	private(t, filepath.Join(squashed, "set", "root-only.bin"), rootOnly, 0)
	for _, d := range []string{plain, squashed} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	host := testpeers.StartGaneshaExports(t, testpeers.GaneshaExport{Dir: plain},
		testpeers.GaneshaExport{Dir: squashed, Squash: "Root_Squash"})
	url := func(dir, rel string) string { return "nfs://" + host + filepath.Join(dir, rel) }
	// The owner's staging is cached here; other identities' requests then find it.
	cached := t.TempDir()
	ownerSet := dataset{"public.bin": []byte("anyone"), "secret.bin": secret}

	for _, tc := range []struct {
		name   string
		source string
		id     uint32
		denied string // the file named in the refusal; "" when the dataset stages
		secret []byte
		want   dataset // what stages, when it does
		pool   string  // "" for a pool of the case's own
	}{
		{"failure case - a file of another uid, mode 0600", url(plain, "set"), 2000, "secret.bin", secret, nil, ""},
		{"that file's owner reads it", url(plain, "set"), 1000, "", secret, ownerSet, cached},
		// A node plugin restarted with another --nfs-uid finds the owner's copy: its proof checks
		// every file's access (a sample would miss the one file it may not read).
		{"failure case - the cached copy, for another uid", url(plain, "set"), 2000, "secret.bin", nil, nil, cached},
		{"the cached copy, for its owner after a restart", url(plain, "set"), 1000, "", secret, ownerSet, cached},
		{"failure case - root squashed to nobody", url(squashed, "set"), 0, "root-only.bin", rootOnly, nil, ""},
		{"root where the export does not squash", url(plain, "rootset"), 0, "", rootOnly,
			dataset{"public.bin": []byte("anyone"), "root-only.bin": rootOnly}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := tc.pool
			if pool == "" {
				pool = t.TempDir()
			}
			m := newManager(t, datasource.Config{NFSUID: &tc.id, NFSGID: &tc.id})
			spec := mustSpec(t, map[string]string{"source": tc.source})
			_, err := stage(ctx, t, m, datasource.Request{Spec: spec, Pool: pool})
			if tc.denied == "" {
				if err != nil {
					t.Fatal(err)
				}
				tree, _ := m.TreePath(pool, spec)
				checkTree(t, tree, tc.want)
				return
			}
			if datasource.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.denied) {
				t.Fatalf("got %v (%v), want PermissionDenied naming %s", datasource.Code(err), err, tc.denied)
			}
			if tc.pool != "" {
				return // the owner's copy stays, for the owner
			}
			if tree, err := m.TreePath(pool, spec); err == nil {
				t.Fatalf("a tree was published at %s", tree)
			}
			if p := findName(t, pool, tc.secret); p != "" {
				t.Fatalf("the file the identity may not read is in the pool at %s", p)
			}
		})
	}
}

// private writes b to p, mode 0600, owned by uid (and gid uid).
func private(t *testing.T, p string, b []byte, uid int) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
}

// findName is the name of a file below dir that holds b, or "".
func findName(t *testing.T, dir string, b []byte) string {
	t.Helper()
	found := ""
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if got, err := os.ReadFile(p); err == nil && bytes.Contains(got, b) {
			found = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestNFSIdentityStreaming: a streaming volume of an NFS dataset (nfs-ganesha) with a file the
// node's identity may not read is handed out once listed, as any streaming volume: it lists that
// file, but a read of it fails with EACCES, and its bytes are never served, nor in the pool; the
// dataset's staging fails PermissionDenied, naming the file.
func TestNFSIdentityStreaming(t *testing.T) {
	ctx := testCtx(t)
	export := t.TempDir()
	secret := []byte("only uid 1000 reads this")
	dataset{"set/public.bin": []byte("anyone")}.writeDir(t, export)
	private(t, filepath.Join(export, "set", "secret.bin"), secret, 1000)
	exp := testpeers.NFSServers[1].Start(t, export)
	pool := t.TempDir()
	id := uint32(2000)
	m := newManager(t, datasource.Config{NFSUID: &id, NFSGID: &id})
	req := datasource.Request{Spec: mustSpec(t, map[string]string{"source": exp.URL("set")}), Pool: pool}
	st, s, err := m.Stream(ctx, req, "vol-nfs")
	if err != nil || s == nil {
		t.Fatalf("stream: %v, %v (a stream: %v)", st, err, s != nil)
	}
	t.Cleanup(s.Release)
	mnt, fsm := mountStream(t, s, false)
	t.Cleanup(func() { _ = fsm.Close() })
	if got, err := os.ReadFile(filepath.Join(mnt, "public.bin")); err != nil || string(got) != "anyone" {
		t.Errorf("public.bin: %q, %v", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "secret.bin")); !errors.Is(err, syscall.EACCES) {
		t.Errorf("secret.bin: %q, %v; want EACCES", got, err)
	}
	if p := findName(t, pool, secret); p != "" {
		t.Errorf("the file the identity may not read is in the pool at %s", p)
	}
	_, err = stage(ctx, t, m, req)
	if datasource.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "secret.bin") {
		t.Fatalf("staging: %v (%v), want PermissionDenied naming secret.bin", datasource.Code(err), err)
	}
}
