package writeback_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/writeback"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestNFSTarget writes back through a real overlay to two NFS servers, NFSv3 both: go-nfs
// (export /export, one port for MOUNT and NFS) and nfs-ganesha (the VFS FSAL, found through
// rpcbind on port 111, in a network namespace of its own): the files under the target directory
// (made as needed, below the export) are byte-identical to what the pod sees, a dataset file the
// pod deleted is deleted there, a temporary file a crash left is replaced and none stays; a
// checkpoint's files are not sent again by the final upload, nor by a second run.
func TestNFSTarget(t *testing.T) {
	testpeers.EachNFSServer(t, func(t *testing.T, srv testpeers.NFSServer) {
		export := t.TempDir()
		nfsTarget(t, export, srv.Start(t, export).URL(""))
	})
}

// nfsTarget runs TestNFSTarget against the server that exports export as url.
func nfsTarget(t *testing.T, export, url string) {
	out := filepath.Join(export, "out", "run")
	lower := map[string][]byte{"kept": []byte("k"), "gone.txt": []byte("g"), "changed.bin": randBytes(21, 2<<20)}
	dir := t.TempDir()
	lo := filepath.Join(dir, "lower")
	for p, b := range lower {
		writeFile(t, filepath.Join(lo, p), b)
		writeFile(t, filepath.Join(out, p), b) // the target mirrors the dataset
	}
	writeFile(t, filepath.Join(out, "ckpt", ".cistern-part-model.bin"), []byte("a crash left this"))
	upper, seen := overlayVolume(t, lower, func(m string) {
		writeFile(t, filepath.Join(m, "ckpt/model.bin"), randBytes(22, 7<<20+3))
		writeFile(t, filepath.Join(m, "changed.bin"), randBytes(23, 1<<20))
		if err := os.Remove(filepath.Join(m, "gone.txt")); err != nil {
			t.Fatal(err)
		}
	})
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), NFSUID: uint32(os.Getuid()), NFSGID: uint32(os.Getgid()), Settle: 1})
	if err != nil {
		t.Fatal(err)
	}
	target, err := writeback.ParseTarget(url + "/out/run")
	if err != nil {
		t.Fatal(err)
	}
	job := writeback.Job{Volume: "v", Upper: upper, Lower: lo, Target: target, Deletes: true}
	var last writeback.Progress
	report := func(p writeback.Progress) { last = p }
	// A checkpoint first (Settle 1 ns: every file is settled), then the final upload.
	if err := u.Checkpoint(testCtx(t), job, nil, report); err != nil {
		t.Fatal(err)
	}
	if last.FilesDone != 2 || last.DeletesDone != 1 {
		t.Errorf("checkpoint: %+v, want 2 files written and 1 deleted", last)
	}
	if err := u.Add(job); err != nil {
		t.Fatal(err)
	}
	if err := u.Run(testCtx(t), job, nil, report); err != nil {
		t.Fatal(err)
	}
	if !last.Done || last.Sent != 0 {
		t.Errorf("final upload after the checkpoint: %+v, want done with nothing sent", last)
	}
	got := map[string][]byte{}
	err = filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		if strings.HasPrefix(d.Name(), ".cistern-part-") {
			t.Errorf("temporary file %s left", rel)
		}
		b, err := os.ReadFile(p)
		got[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	delete(got, "ckpt/.cistern-part-model.bin")
	sameObjects(t, got, seen)
}

// TestNFSTargetNamespace writes back a tenant's volume whose target is confined to its
// namespace (Target.Namespace) to go-nfs and nfs-ganesha: the files land below the export's
// <namespace>/ directory, at the path the tenant named, and a path naming another namespace's
// directory lands below the tenant's own, leaving the other's files as they were. The probe
// writes there too. Servers that mount any directory of their export (nfs-ganesha; go-nfs made to
// here, as knfsd does) cannot be made to root the tenant's directory inside the other's.
func TestNFSTargetNamespace(t *testing.T) {
	testpeers.EachNFSServer(t, func(t *testing.T, srv testpeers.NFSServer) {
		export := t.TempDir()
		nfsNamespaceTarget(t, export, srv.Start(t, export).URL(""))
	})
	t.Run("go-nfs mounting subdirectories", func(t *testing.T) {
		export := t.TempDir()
		nfsNamespaceTarget(t, export, "nfs://"+testpeers.StartNFSSubdirs(t, export)+"/export")
	})
}

func nfsNamespaceTarget(t *testing.T, export, url string) {
	theirs := filepath.Join(export, "victim", "runs", "model.bin")
	writeFile(t, theirs, []byte("the victim namespace's own outputs"))
	upper, seen := overlayVolume(t, map[string][]byte{"kept": []byte("k")}, func(m string) {
		writeFile(t, filepath.Join(m, "model.bin"), randBytes(31, 3<<20+7))
	})
	u, err := writeback.New(writeback.Config{Dir: t.TempDir(), NFSUID: uint32(os.Getuid()), NFSGID: uint32(os.Getgid())})
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"runs", "victim/runs"} {
		target, err := writeback.ParseTarget(url + "/" + rel)
		if err != nil {
			t.Fatal(err)
		}
		target.Namespace = "tenant"
		if err := writeback.ProbeNFS(target, uint32(os.Getuid()), uint32(os.Getgid()), ".probe"); err != nil {
			t.Fatalf("probe of %s: %v", target, err)
		}
		job := writeback.Job{Volume: "v-" + strings.ReplaceAll(rel, "/", "-"), Upper: upper, Target: target}
		if err := u.Add(job); err != nil {
			t.Fatal(err)
		}
		if err := u.Run(testCtx(t), job, nil, nil); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(export, "tenant", rel, "model.bin"))
		if err != nil || !bytes.Equal(got, seen["model.bin"]) {
			t.Errorf("%s: %d bytes below the tenant's directory (%v), want what the pod wrote", rel, len(got), err)
		}
	}
	if got, err := os.ReadFile(theirs); err != nil || string(got) != "the victim namespace's own outputs" {
		t.Errorf("the other namespace's file: %q, %v; want it untouched", got, err)
	}
	if _, err := os.Stat(filepath.Join(export, "runs")); !os.IsNotExist(err) {
		t.Errorf("a confined target wrote outside its namespace's directory: %v", err)
	}
}

// TestNFSTargetDenied writes back to nfs-ganesha (which enforces AUTH_UNIX) a volume whose
// target directory the node's NFS identity may not write: the probe says so, each pass fails
// with an error naming the file, the target and the identity, nothing appears in the directory
// (not even a temporary file), and the volume's data stays; once the identity may write there
// (here: the node plugin restarted as the directory's owner), the same job completes.
func TestNFSTargetDenied(t *testing.T) {
	export := t.TempDir()
	locked := filepath.Join(export, "locked")
	if err := os.Mkdir(locked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(locked, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(export, 0o755); err != nil {
		t.Fatal(err)
	}
	exp := testpeers.NFSExport{Host: testpeers.StartGanesha(t, export), Path: export}
	upper, seen := overlayVolume(t, map[string][]byte{"kept": []byte("k")}, func(m string) {
		writeFile(t, filepath.Join(m, "out", "model.bin"), randBytes(41, 1<<20+5))
	})
	target, err := writeback.ParseTarget(exp.URL("locked/run"))
	if err != nil {
		t.Fatal(err)
	}
	const refused = "access denied to AUTH_SYS uid 2000 gid 2000"
	if err := writeback.ProbeNFS(target, 2000, 2000, ".probe"); err == nil || !strings.Contains(err.Error(), refused) {
		t.Fatalf("probe as uid 2000: %v, want %q", err, refused)
	}
	dir := t.TempDir()
	job := writeback.Job{Volume: "v", Upper: upper, Target: target}
	u, err := writeback.New(writeback.Config{Dir: dir, NFSUID: 2000, NFSGID: 2000, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Add(job); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	var failed []error
	err = u.Run(ctx, job, nil, func(p writeback.Progress) {
		if p.Err != nil {
			failed = append(failed, p.Err)
		}
		if len(failed) == 2 {
			cancel() // a second pass refused as the first
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want it to keep retrying until cancelled", err)
	}
	for _, e := range failed {
		if !strings.Contains(e.Error(), "upload out/model.bin to "+target.String()) || !strings.Contains(e.Error(), refused) {
			t.Errorf("a pass failed with %q, want the file, the target and %q", e, refused)
		}
	}
	if done, err := u.Done("v"); done || err != nil {
		t.Fatalf("Done: %v %v, want the job kept", done, err)
	}
	if ents, err := os.ReadDir(locked); err != nil || len(ents) != 0 {
		t.Fatalf("the locked directory holds %v (%v)", ents, err)
	}
	owner, err := writeback.New(writeback.Config{Dir: dir, NFSUID: 1000, NFSGID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Run(testCtx(t), job, nil, nil); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(locked, "run", "out", "model.bin"))
	if err != nil || !bytes.Equal(got, seen["out/model.bin"]) {
		t.Fatalf("after the owner's pass: %d bytes (%v), want what the pod wrote", len(got), err)
	}
}
