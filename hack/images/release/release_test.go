package main

import (
	"archive/tar"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cistern-csi/cistern/hack/images/layer"
)

// ImagesEnv is the images.json of `make images` the test checks.
const ImagesEnv = "CISTERN_IMAGES"

// nodeFiles are what the driver runs in its container: the binaries, and the tools that format,
// check, grow and loop-attach filesystems (docs/kind.md, Images).
var nodeFiles = []string{
	"usr/local/bin/csi-driver", "usr/local/bin/storagepool-sidecar",
	"usr/sbin/mkfs.ext4", "usr/sbin/e2fsck", "usr/sbin/resize2fs", "usr/sbin/tune2fs",
	"usr/sbin/mkfs.xfs", "usr/sbin/xfs_growfs", "usr/sbin/xfs_repair",
	"usr/sbin/losetup", "usr/sbin/blkid", "usr/bin/mount", "usr/bin/umount", "usr/bin/findmnt",
	"etc/ssl/certs/ca-certificates.crt",
}

func loadImages(t *testing.T) map[string]Entry {
	t.Helper()
	path := os.Getenv(ImagesEnv)
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not set; run `make test-images`", ImagesEnv)
		}
		t.Skipf("%s not set; run `make test-images`", ImagesEnv)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]Entry{}
	if err := json.Unmarshal(data, &entries); err != nil {
		t.Fatal(err)
	}
	return entries
}

func image(t *testing.T, e Entry) (v1.Image, *v1.ConfigFile) {
	t.Helper()
	tag, err := name.NewTag(e.Ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(e.Tarball, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return img, cfg
}

// unpack writes the image's flattened filesystem into dir (regular files, directories,
// symbolic links; what running the binaries needs) and returns the set of its paths.
func unpack(t *testing.T, img v1.Image, dir string) map[string]*tar.Header {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := strings.TrimPrefix(filepath.Clean("/"+h.Name), "/")
		files[p] = h
		if dir == "" || p == "" {
			continue
		}
		dst := filepath.Join(dir, p)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeSymlink:
			_ = os.MkdirAll(filepath.Dir(dst), 0o755)
			err = os.Symlink(h.Linkname, dst)
		case tar.TypeLink:
			_ = os.MkdirAll(filepath.Dir(dst), 0o755)
			err = os.Link(filepath.Join(dir, strings.TrimPrefix(filepath.Clean("/"+h.Linkname), "/")), dst)
		case tar.TypeReg:
			_ = os.MkdirAll(filepath.Dir(dst), 0o755)
			var f *os.File
			if f, err = os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o7777); err == nil {
				_, err = io.Copy(f, tr)
				f.Close()
			}
		}
		if err != nil {
			t.Fatalf("unpacking %s: %v", p, err)
		}
	}
	return files
}

// unpacked holds each image's filesystem, unpacked once for all the tests of the package (the
// node image takes about a minute under the race detector), below a directory TestMain removes.
var unpacked = struct {
	sync.Mutex
	dir    string
	images map[string]unpackedImage
}{images: map[string]unpackedImage{}}

type unpackedImage struct {
	root  string
	files map[string]*tar.Header
}

func TestMain(m *testing.M) {
	code := m.Run()
	if unpacked.dir != "" {
		_ = os.RemoveAll(unpacked.dir)
	}
	os.Exit(code)
}

// unpackShared is unpack of the image of e into a directory the tests share (they only read
// it), and the set of its paths.
func unpackShared(t *testing.T, e Entry, img v1.Image) (string, map[string]*tar.Header) {
	t.Helper()
	unpacked.Lock()
	defer unpacked.Unlock()
	key := e.Ref + " " + e.Tarball
	if u, ok := unpacked.images[key]; ok {
		return u.root, u.files
	}
	if unpacked.dir == "" {
		dir, err := os.MkdirTemp("", "cistern-release-test-")
		if err != nil {
			t.Fatal(err)
		}
		unpacked.dir = dir
	}
	root := filepath.Join(unpacked.dir, fmt.Sprint(len(unpacked.images)))
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	files := unpack(t, img, root)
	unpacked.images[key] = unpackedImage{root: root, files: files}
	return root, files
}

// exists reports whether the image has path p (relative, as in the layers).
func exists(files map[string]*tar.Header, p string) bool {
	_, ok := files[p]
	return ok
}

func TestNodeImage(t *testing.T) {
	e, ok := loadImages(t)["node"]
	if !ok {
		t.Fatal("images.json has no node image")
	}
	img, cfg := image(t, e)
	if got := cfg.Config.Entrypoint; len(got) != 1 || got[0] != "/usr/local/bin/csi-driver" {
		t.Errorf("entrypoint %v, want /usr/local/bin/csi-driver", got)
	}
	if cfg.Config.User != "" && cfg.Config.User != "0" && cfg.Config.User != "root" {
		t.Errorf("user %q: the driver container runs as root (privileged)", cfg.Config.User)
	}
	root, files := unpackShared(t, e, img)
	for _, f := range nodeFiles {
		if !exists(files, f) {
			t.Errorf("node image lacks /%s", f)
		}
	}
	if err := layer.RequireStatic(filepath.Join(root, "usr/local/bin/storagepool-sidecar")); err != nil {
		t.Error(err)
	}
	// The driver links libnfs (NFSv4 datasets); running it below proves the image's libraries
	// load it.
	if libs, err := neededLibs(filepath.Join(root, "usr/local/bin/csi-driver")); err != nil || !slices.Contains(libs, "libnfs.so.13") {
		t.Errorf("csi-driver links %v (%v), want libnfs.so.13 among them: built without -tags libnfs?", libs, err)
	}
	if os.Geteuid() != 0 {
		t.Log("not root: the image's programs are not run (chroot needs root)")
		return
	}
	// Run in the image's own filesystem: its libraries, not the host's.
	version := strings.TrimPrefix(e.Ref, "cistern/node:")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"/usr/local/bin/csi-driver", "--version"}, version},
		{[]string{"/usr/local/bin/storagepool-sidecar", "--version"}, version},
		{[]string{"/usr/sbin/mkfs.ext4", "-V"}, "mke2fs"},
		{[]string{"/usr/sbin/mkfs.xfs", "-V"}, "mkfs.xfs version"},
		{[]string{"/usr/sbin/losetup", "--version"}, "losetup from util-linux"},
		{[]string{"/usr/bin/mount", "--version"}, "mount from util-linux"},
		{[]string{"/usr/sbin/blkid", "--version"}, "blkid from util-linux"},
	} {
		out, err := exec.Command("chroot", append([]string{root}, c.args...)...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%v in the image: %v: %s (want %q)", c.args, err, out, c.want)
		}
	}
}

// neededLibs returns the shared libraries an executable names (DT_NEEDED).
func neededLibs(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.ImportedLibraries()
}

func TestControllerImage(t *testing.T) {
	e, ok := loadImages(t)["workload-controller"]
	if !ok {
		t.Fatal("images.json has no workload-controller image")
	}
	img, cfg := image(t, e)
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", cfg.Config.User)
	}
	if got := cfg.Config.Entrypoint; len(got) != 1 || got[0] != "/usr/local/bin/workload-controller" {
		t.Errorf("entrypoint %v", got)
	}
	root, files := unpackShared(t, e, img)
	for _, f := range []string{"usr/local/bin/workload-controller", "etc/passwd", "etc/group", "tmp"} {
		if !exists(files, f) {
			t.Errorf("controller image lacks /%s", f)
		}
	}
	for _, f := range []string{"bin/sh", "usr/bin/sh", "bin/busybox"} {
		if exists(files, f) {
			t.Errorf("controller image has a shell: /%s", f)
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), ":65532:65532:") {
		t.Errorf("/etc/passwd has no user 65532:\n%s", passwd)
	}
	bin := filepath.Join(root, "usr/local/bin/workload-controller")
	if err := layer.RequireStatic(bin); err != nil {
		t.Error(err)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if want := strings.TrimPrefix(e.Ref, "cistern/workload-controller:"); err != nil || strings.TrimSpace(string(out)) != want {
		t.Errorf("workload-controller --version: %v: %q, want %q", err, out, want)
	}
}

func TestKustomizeImage(t *testing.T) {
	got := KustomizeImage("cistern/node:v1.2.3", "registry.example.com/storage/node:v1.2.3")
	want := "- name: cistern/node\n  newName: registry.example.com/storage/node\n  newTag: \"v1.2.3\"\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// push of a built tarball to a registry: the image arrives under REGISTRY/NAME:TAG with the
// same digest, and the overlay points deploy/csi at it.
func TestPush(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("cistern/node:v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "node.tar")
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		t.Fatal(err)
	}
	src, dst, err := Push(tarPath, host+"/storage")
	if err != nil {
		t.Fatal(err)
	}
	if src != "cistern/node:v1.2.3" || dst != host+"/storage/node:v1.2.3" {
		t.Errorf("Push = %s -> %s", src, dst)
	}
	ref, err := name.ParseReference(dst)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	got, _ := pushed.Digest()
	if want != got {
		t.Errorf("pushed digest %s, want %s", got, want)
	}
}
