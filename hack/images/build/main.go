// Command build makes the node-level tests' container images without Docker or a registry: each
// is one static Go binary from this module in a single-layer image, written as an image tarball
// that `ctr images import` loads into containerd.
//
//	go run ./build -out _output/node-images
//
// writes <out>/<name>.tar for each image and <out>/images.json mapping names to references and
// tarballs. References are under localhost/, so nothing ever tries to pull them.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// image is one image to build: the package whose binary is the entrypoint, and its reference.
type image struct {
	Name string `json:"name"`
	Ref  string `json:"ref"`
	pkg  string
}

var images = []image{
	// The tag must equal containerd's CRI sandbox image setting, so containerd never pulls one.
	{Name: "pause", Ref: "localhost/cistern/pause:v1", pkg: "./pause"},
	{Name: "checker", Ref: "localhost/cistern/checker:v1", pkg: "./checker"},
}

// Entry is one line of images.json.
type Entry struct {
	Ref     string `json:"ref"`
	Tarball string `json:"tarball"`
}

func main() {
	out := flag.String("out", "_output/node-images", "Directory for the image tarballs and images.json.")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
	}
}

func run(out string) error {
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
	for _, im := range images {
		bin := filepath.Join(work, im.Name)
		if err := goBuild(im.pkg, bin); err != nil {
			return err
		}
		img, err := newImage(bin, "/"+im.Name)
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
func goBuild(pkg, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w", pkg, err)
	}
	return nil
}

// newImage returns an image holding bin at path, run as its entrypoint.
func newImage(bin, path string) (v1.Image, error) {
	layerTar, err := singleFileTar(bin, path)
	if err != nil {
		return nil, err
	}
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
	cfg.Config.Entrypoint = []string{path}
	cfg.Config.Env = []string{"PATH=/"}
	return mutate.ConfigFile(img, cfg)
}

// singleFileTar is a layer with one executable file; fixed times keep the digest stable.
func singleFileTar(src, path string) ([]byte, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{
		Name:    path[1:],
		Mode:    0o755,
		Size:    int64(len(data)),
		ModTime: time.Unix(0, 0),
		Format:  tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
