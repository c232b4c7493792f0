// Package layer builds image layers and images from files without Docker: deterministic tar
// layers (fixed times and owners, so the digest depends on the content only), static Go binaries,
// and the image configuration.
package layer

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Builder collects the entries of one layer.
type Builder struct {
	buf  bytes.Buffer
	tw   *tar.Writer
	dirs map[string]bool
}

// New returns an empty layer.
func New() *Builder {
	b := &Builder{dirs: map[string]bool{}}
	b.tw = tar.NewWriter(&b.buf)
	return b
}

// Dir adds a directory (and its missing parents, mode 0755).
func (b *Builder) Dir(path string, mode int64) error {
	if err := b.parents(path); err != nil {
		return err
	}
	b.dirs[path] = true
	return b.tw.WriteHeader(header(path, tar.TypeDir, mode, 0, ""))
}

// File adds a regular file with the given content.
func (b *Builder) File(path string, data []byte, mode int64) error {
	if err := b.parents(path); err != nil {
		return err
	}
	if err := b.tw.WriteHeader(header(path, tar.TypeReg, mode, int64(len(data)), "")); err != nil {
		return err
	}
	_, err := b.tw.Write(data)
	return err
}

// HostFile adds the file src of this machine at path.
func (b *Builder) HostFile(path, src string, mode int64) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return b.File(path, data, mode)
}

// Symlink adds a symbolic link at path pointing to target.
func (b *Builder) Symlink(path, target string) error {
	if err := b.parents(path); err != nil {
		return err
	}
	return b.tw.WriteHeader(header(path, tar.TypeSymlink, 0o777, 0, target))
}

// parents writes the directories above path that are not in the layer yet.
func (b *Builder) parents(path string) error {
	var missing []string
	for d := filepath.Dir(path); d != "/" && !b.dirs[d]; d = filepath.Dir(d) {
		missing = append([]string{d}, missing...)
	}
	for _, d := range missing {
		if err := b.tw.WriteHeader(header(d, tar.TypeDir, 0o755, 0, "")); err != nil {
			return err
		}
		b.dirs[d] = true
	}
	return nil
}

// Layer closes the tar and returns it as an uncompressed-on-disk, gzip-on-push layer.
func (b *Builder) Layer() (v1.Layer, error) {
	if err := b.tw.Close(); err != nil {
		return nil, err
	}
	data := b.buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
}

// header is a tar header with fixed times and owner, which keep the digest stable.
func header(path string, typ byte, mode, size int64, link string) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     strings.TrimPrefix(path, "/"),
		Linkname: link,
		Mode:     mode,
		Size:     size,
		ModTime:  time.Unix(0, 0),
		Format:   tar.FormatPAX,
	}
}

// GoBuild builds static binaries (the images have no libc, or not the one the host linked
// against) of the packages into outDir with one `go build`, run in dir (a module's directory).
func GoBuild(dir, outDir, ldflags string, pkgs ...string) error {
	return goBuild(dir, outDir, ldflags, []string{"CGO_ENABLED=0"}, nil, pkgs)
}

// GoBuildCgo builds binaries with cgo and the build tags, linked against the host's libraries:
// for an image whose root filesystem is the host's Debian release with those libraries installed.
func GoBuildCgo(dir, outDir, ldflags string, tags []string, pkgs ...string) error {
	return goBuild(dir, outDir, ldflags, []string{"CGO_ENABLED=1"}, []string{"-tags=" + strings.Join(tags, ",")}, pkgs)
}

func goBuild(dir, outDir, ldflags string, env, flags, pkgs []string) error {
	args := append([]string{"build", "-trimpath", "-ldflags=-s -w " + ldflags, "-o", outDir + "/"}, flags...)
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s %s: %w", strings.Join(flags, " "), strings.Join(pkgs, " "), err)
	}
	return nil
}

// RequireStatic refuses a dynamically linked executable: the images have no libc or loader.
func RequireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; the image needs a static executable", path)
		}
	}
	return nil
}

// Configure sets the image's platform to this machine's and lets edit change the rest of its
// run configuration (entrypoint, environment, user).
func Configure(img v1.Image, edit func(*v1.Config)) (v1.Image, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = runtime.GOARCH
	cfg.Created = v1.Time{Time: time.Unix(0, 0)}
	edit(&cfg.Config)
	return mutate.ConfigFile(img, cfg)
}
