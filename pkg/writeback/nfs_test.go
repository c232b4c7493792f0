package writeback_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	t.Run("go-nfs", func(t *testing.T) {
		export := t.TempDir()
		nfsTarget(t, export, "nfs://"+testpeers.StartNFS(t, export)+"/export")
	})
	t.Run("nfs-ganesha", func(t *testing.T) {
		export := t.TempDir()
		nfsTarget(t, export, "nfs://"+testpeers.StartGanesha(t, export)+export)
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
	t.Run("go-nfs", func(t *testing.T) {
		export := t.TempDir()
		nfsNamespaceTarget(t, export, "nfs://"+testpeers.StartNFS(t, export)+"/export")
	})
	t.Run("go-nfs mounting subdirectories", func(t *testing.T) {
		export := t.TempDir()
		nfsNamespaceTarget(t, export, "nfs://"+testpeers.StartNFSSubdirs(t, export)+"/export")
	})
	t.Run("nfs-ganesha", func(t *testing.T) {
		export := t.TempDir()
		nfsNamespaceTarget(t, export, "nfs://"+testpeers.StartGanesha(t, export)+export)
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
