// Command build makes the node-level tests' container images without Docker or a registry: each
// is a single-layer image of static Go binaries from this module (and, for the git image, a
// static busybox as /bin/sh), written as an image tarball that `ctr images import` loads into
// containerd.
//
//	go run ./build -out _output/node-images -busybox /path/to/static/busybox
//
// writes <out>/<name>.tar for each image and <out>/images.json mapping names to references and
// tarballs. References are under localhost/, so nothing ever tries to pull them.
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// image is one image to build: its files, entrypoint and search path.
type image struct {
	Name       string
	Ref        string
	files      []file
	entrypoint string
	path       string
}

// file is one file of an image: a static binary built from a package of this module, a static
// executable from the host (busybox), or a symbolic link.
type file struct {
	path string // absolute, in the image
	pkg  string
	dir  string // where pkg is built from: this module when empty, else a directory relative to it
	host string
	link string
}

// images are built in this order. busybox is the host path of a static busybox.
func images(busybox string) []image {
	return []image{
		// The tag must equal containerd's CRI sandbox image setting, so containerd never pulls one.
		{Name: "pause", Ref: "localhost/cistern/pause:v1", entrypoint: "/pause", path: "/",
			files: []file{{path: "/pause", pkg: "./pause"}}},
		{Name: "checker", Ref: "localhost/cistern/checker:v1", entrypoint: "/checker", path: "/",
			files: []file{{path: "/checker", pkg: "./checker"}}},
		// The notebook jobs' git-clone container runs `/bin/sh -c 'git clone ...'`: busybox's sh
		// and the git stand-in.
		{Name: "git", Ref: "localhost/cistern/git:v1", entrypoint: "/usr/bin/git", path: "/usr/bin:/bin",
			files: []file{
				{path: "/bin/busybox", host: busybox},
				{path: "/bin/sh", link: "busybox"},
				{path: "/usr/bin/git", pkg: "./git"},
			}},
		// The notebook jobs' golden-compare container runs the workload-controller binary itself
		// (its compare-notebook subcommand), built from the repository's main module.
		{Name: "controller", Ref: "localhost/cistern/workload-controller:v1", entrypoint: "/usr/local/bin/workload-controller", path: "/usr/local/bin",
			files: []file{{path: "/usr/local/bin/workload-controller", pkg: "./cmd/workload-controller", dir: "../.."}}},
		// The notebook container runs `papermill INPUT OUTPUT --log-output`.
		{Name: "papermill", Ref: "localhost/cistern/papermill:v1", entrypoint: "/usr/local/bin/papermill", path: "/usr/local/bin:/usr/bin:/bin",
			files: []file{{path: "/usr/local/bin/papermill", pkg: "./papermill"}}},
	}
}

// Entry is one line of images.json.
type Entry struct {
	Ref     string `json:"ref"`
	Tarball string `json:"tarball"`
}

func main() {
	out := flag.String("out", "_output/node-images", "Directory for the image tarballs and images.json.")
	busybox := flag.String("busybox", "", "A static busybox executable for the git image's /bin/sh (Debian's busybox-static).")
	flag.Parse()
	if err := run(*out, *busybox); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
	}
}

func run(out, busybox string) error {
	out, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "cistern-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	index := map[string]Entry{}
	for _, im := range images(busybox) {
		layer, err := imageLayer(im, work)
		if err != nil {
			return fmt.Errorf("%s: %w", im.Name, err)
		}
		img, err := newImage(layer, im)
		if err != nil {
			return fmt.Errorf("%s: %w", im.Name, err)
		}
		tag, err := name.NewTag(im.Ref)
		if err != nil {
			return err
		}
		path := filepath.Join(out, im.Name+".tar")
		if err := tarball.WriteToFile(path, tag, img); err != nil {
			return fmt.Errorf("%s: writing %s: %w", im.Name, path, err)
		}
		index[im.Name] = Entry{Ref: im.Ref, Tarball: path}
		fmt.Printf("%s -> %s\n", im.Ref, path)
	}
	data, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "images.json"), data, 0o644)
}

// goBuild builds a static binary: the images have no libc.
func goBuild(pkg, dir, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w", pkg, err)
	}
	return nil
}

// imageLayer builds the image's binaries into work and returns its single layer as a tar.
func imageLayer(im image, work string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range im.files {
		if err := addParents(tw, dirs, f.path); err != nil {
			return nil, err
		}
		var err error
		switch {
		case f.link != "":
			err = tw.WriteHeader(header(f.path, tar.TypeSymlink, 0o777, 0, f.link))
		case f.pkg != "":
			bin := filepath.Join(work, im.Name+"-"+filepath.Base(f.path))
			if err = goBuild(f.pkg, f.dir, bin); err == nil {
				err = addFile(tw, bin, f.path)
			}
		default:
			if f.host == "" {
				return nil, fmt.Errorf("%s needs a host file (see -help)", f.path)
			}
			if err = requireStatic(f.host); err == nil {
				err = addFile(tw, f.host, f.path)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(header("/tmp", tar.TypeDir, 0o1777, 0, "")); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// addParents writes the directories above path that are not in the layer yet.
func addParents(tw *tar.Writer, done map[string]bool, path string) error {
	var parents []string
	for d := filepath.Dir(path); d != "/" && !done[d]; d = filepath.Dir(d) {
		parents = append([]string{d}, parents...)
	}
	for _, d := range parents {
		if err := tw.WriteHeader(header(d, tar.TypeDir, 0o755, 0, "")); err != nil {
			return err
		}
		done[d] = true
	}
	return nil
}

func addFile(tw *tar.Writer, src, path string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(header(path, tar.TypeReg, 0o755, int64(len(data)), "")); err != nil {
		return err
	}
	_, err = tw.Write(data)
	return err
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

// requireStatic refuses a dynamically linked executable: the images have no libc or loader.
func requireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; the image needs a static executable (busybox-static)", path)
		}
	}
	return nil
}

// newImage returns an image of one layer with the image's entrypoint and PATH.
func newImage(layerTar []byte, im image) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = runtime.GOARCH
	cfg.Config.Entrypoint = []string{im.entrypoint}
	cfg.Config.Env = []string{"PATH=" + im.path}
	return mutate.ConfigFile(img, cfg)
}
