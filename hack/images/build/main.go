// Command build makes the node-level tests' container images without Docker or a registry: each
// is a single-layer image of static Go binaries from this module (and, for the git image, a
// static busybox as /bin/sh), written as an image tarball that `ctr images import` loads into
// containerd.
//
//	go run ./build -out _output/node-images -busybox /path/to/static/busybox [-csi-provisioner PATH] [-versitygw PATH]
//
// writes <out>/<name>.tar for each image and <out>/images.json mapping names to references and
// tarballs. The test images are under localhost/, so nothing ever tries to pull them. With
// -csi-provisioner it also makes the sidecar images of deploy/csi under their upstream names
// (csi-provisioner from that binary, stand-ins for node-driver-registrar and livenessprobe from
// hack/standins), which the install suite serves from a registry on loopback. With -versitygw it
// also makes an image of that static S3 server, which the install suite runs as a pod.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cistern-csi/cistern/hack/images/layer"
)

// image is one image to build: its files, entrypoint and search path.
type image struct {
	Name       string
	Ref        string
	files      []file
	entrypoint string
	path       string
}

// file is one file of an image: a static binary built from a package of this module (pkg) or of
// the project's root module (rootPkg), a static executable from the host, or a symbolic link.
type file struct {
	path    string // absolute, in the image
	pkg     string
	rootPkg string
	host    string
	link    string
}

// Sidecar images under the names deploy/csi gives them, for the install suite, which pulls them
// from a registry on loopback: csi-provisioner is the upstream binary (make csi-tools); the
// node-driver-registrar and livenessprobe images hold this project's stand-ins (hack/standins).
const (
	provisionerRef = "registry.k8s.io/sig-storage/csi-provisioner:v6.4.0"
	registrarRef   = "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.17.0"
	livenessRef    = "registry.k8s.io/sig-storage/livenessprobe:v2.19.0"
	busyboxRef     = "busybox:1.37"
)

// images are built in this order. busybox is the host path of a static busybox; provisioner,
// when set, that of a static csi-provisioner, and adds the sidecar images; versitygw, when set,
// that of a static versitygw, and adds its image.
func images(busybox, provisioner, versitygw string) []image {
	ims := []image{
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
			files: []file{{path: "/usr/local/bin/workload-controller", rootPkg: "./cmd/workload-controller"}}},
		// The notebook container runs `papermill INPUT OUTPUT --log-output`.
		{Name: "papermill", Ref: "localhost/cistern/papermill:v1", entrypoint: "/usr/local/bin/papermill", path: "/usr/local/bin:/usr/bin:/bin",
			files: []file{{path: "/usr/local/bin/papermill", pkg: "./papermill"}}},
	}
	if versitygw != "" {
		// The install suite's S3 server, run as a pod: `versitygw [flags] posix DIR`.
		ims = append(ims, image{Name: "versitygw", Ref: "localhost/cistern/versitygw:v1", entrypoint: "/usr/local/bin/versitygw", path: "/usr/local/bin",
			files: []file{{path: "/usr/local/bin/versitygw", host: versitygw}}})
	}
	if provisioner == "" {
		return ims
	}
	// Entrypoints as in the upstream images, which the manifests rely on (they give args only).
	return append(ims,
		image{Name: "csi-provisioner", Ref: provisionerRef, entrypoint: "/csi-provisioner", path: "/",
			files: []file{{path: "/csi-provisioner", host: provisioner}}},
		image{Name: "node-driver-registrar", Ref: registrarRef, entrypoint: "/csi-node-driver-registrar", path: "/",
			files: []file{{path: "/csi-node-driver-registrar", rootPkg: "./hack/standins/node-driver-registrar"}}},
		image{Name: "livenessprobe", Ref: livenessRef, entrypoint: "/livenessprobe", path: "/",
			files: []file{{path: "/livenessprobe", rootPkg: "./hack/standins/livenessprobe"}}},
		// deploy/csi/examples run busybox:1.37; this is Debian's static busybox (another
		// version) with a link per applet, as the busybox image has them.
		image{Name: "busybox", Ref: busyboxRef, path: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			files: []file{{path: "/bin/busybox", host: busybox}}},
	)
}

// busyboxLinks are the applet links of busybox ("bin/sh -> busybox", ...).
func busyboxLinks(busybox string) ([]file, error) {
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-full: %w", busybox, err)
	}
	var links []file
	for _, p := range strings.Fields(string(out)) {
		if p == "bin/busybox" {
			continue
		}
		links = append(links, file{path: "/" + p, link: "/bin/busybox"})
	}
	return links, nil
}

// Entry is one line of images.json.
type Entry struct {
	Ref     string `json:"ref"`
	Tarball string `json:"tarball"`
}

func main() {
	out := flag.String("out", "_output/node-images", "Directory for the image tarballs and images.json.")
	busybox := flag.String("busybox", "", "A static busybox executable for the git image's /bin/sh (Debian's busybox-static).")
	provisioner := flag.String("csi-provisioner", "", "A static csi-provisioner (make csi-tools); adds the sidecar images.")
	versitygw := flag.String("versitygw", "", "A static versitygw (make s3-tools); adds the S3 server's image.")
	root := flag.String("root", "../..", "The project's root module, for the stand-ins built from it.")
	flag.Parse()
	if err := run(*out, *busybox, *provisioner, *versitygw, *root); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
	}
}

func run(out, busybox, provisioner, versitygw, root string) error {
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
	for _, im := range images(busybox, provisioner, versitygw) {
		if im.Ref == busyboxRef {
			links, err := busyboxLinks(busybox)
			if err != nil {
				return err
			}
			im.files = append(im.files, links...)
		}
		l, err := imageLayer(im, work, root)
		if err != nil {
			return fmt.Errorf("%s: %w", im.Name, err)
		}
		img, err := mutate.AppendLayers(empty.Image, l)
		if err != nil {
			return fmt.Errorf("%s: %w", im.Name, err)
		}
		img, err = layer.Configure(img, func(c *v1.Config) {
			if im.entrypoint != "" {
				c.Entrypoint = []string{im.entrypoint}
			} else {
				c.Cmd = []string{"sh"}
			}
			c.Env = []string{"PATH=" + im.path}
		})
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

// imageLayer builds the image's binaries into work and returns its single layer.
func imageLayer(im image, work, root string) (v1.Layer, error) {
	b := layer.New()
	for _, f := range im.files {
		var err error
		switch {
		case f.link != "":
			err = b.Symlink(f.path, f.link)
		case f.pkg != "" || f.rootPkg != "":
			dir, pkg := ".", f.pkg
			if f.rootPkg != "" {
				dir, pkg = root, f.rootPkg
			}
			out := filepath.Join(work, im.Name)
			if err = layer.GoBuild(dir, out, "", pkg); err == nil {
				err = b.HostFile(f.path, filepath.Join(out, filepath.Base(pkg)), 0o755)
			}
		default:
			if f.host == "" {
				return nil, fmt.Errorf("%s needs a host file (see -help)", f.path)
			}
			if err = layer.RequireStatic(f.host); err == nil {
				err = b.HostFile(f.path, f.host, 0o755)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if err := b.Dir("/tmp", 0o1777); err != nil {
		return nil, err
	}
	return b.Layer()
}
