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
// hack/standins) and the external-resizer stand-in, which the install suite serves from a registry on loopback. With -versitygw it
// also makes an image of that static S3 server, which the install suite runs as a pod.
//
//	go run ./build -out _output/k8s-e2e-images -busybox BUSYBOX -agnhost PATH -csi-snapshotter PATH -snapshot-controller PATH
//
// builds instead the images the Kubernetes storage e2e suite (make e2e-k8s) pulls besides those:
// agnhost under the tag e2e.test expects, and external-snapshotter's sidecar and controller under
// their upstream names.
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

// image is one image to build: its files, entrypoint, command and search path.
type image struct {
	Name       string
	Ref        string
	files      []file
	entrypoint string
	cmd        []string
	path       string
	// busybox adds a link per applet of the busybox at /bin/busybox, as the busybox image has.
	busybox bool
	// user the image runs as (the config's User); root when empty.
	user string
}

// file is one file of an image: a static binary built from a package of this module (pkg) or of
// the project's root module (rootPkg), a static executable from the host, a symbolic link, a
// directory, or a small file with the given content.
type file struct {
	path    string // absolute, in the image
	pkg     string
	rootPkg string
	host    string
	link    string
	dir     bool
	data    string
}

// Sidecar images under the names deploy/csi gives them, for the install suite, which pulls them
// from a registry on loopback: csi-provisioner is the upstream binary (make csi-tools); the
// node-driver-registrar and livenessprobe images hold this project's stand-ins (hack/standins).
const (
	provisionerRef = "registry.k8s.io/sig-storage/csi-provisioner:v6.4.0"
	registrarRef   = "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.17.0"
	livenessRef    = "registry.k8s.io/sig-storage/livenessprobe:v2.19.0"
	resizerRef     = "localhost/cistern/csi-resizer:v1"
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
		// The notebook container runs `papermill INPUT OUTPUT --log-output`, as a user of its own
		// as notebook images do (Jupyter's run as 1000): the notebook pods are runAsNonRoot.
		{Name: "papermill", Ref: "localhost/cistern/papermill:v1", entrypoint: "/usr/local/bin/papermill", path: "/usr/local/bin:/usr/bin:/bin", user: "1000:1000",
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
		// No manifest of deploy/csi names an external-resizer (upstream's has no node
		// deployment): the storage e2e suite adds this stand-in to the node pod itself
		// (test/k8se2e/resizer), under a name of this project.
		image{Name: "csi-resizer", Ref: resizerRef, entrypoint: "/csi-resizer", path: "/",
			files: []file{{path: "/csi-resizer", rootPkg: "./hack/standins/external-resizer"}}},
		// deploy/csi/examples run busybox:1.37; this is Debian's static busybox (another
		// version) with a link per applet, as the busybox image has them.
		image{Name: "busybox", Ref: busyboxRef, path: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			files: []file{{path: "/bin/busybox", host: busybox}}, busybox: true},
	)
}

// The images of the Kubernetes storage e2e suite that the node images do not have. agnhost's tag
// is the one k8s.io/kubernetes/test/utils/image/manifest.go of e2e.test's version names; the
// suite maps its registry to the loopback one with KUBE_TEST_REPO_LIST. The snapshotter's images
// keep their upstream names, as the install suite's sidecars do.
const (
	agnhostRef            = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	csiSnapshotterRef     = "registry.k8s.io/sig-storage/csi-snapshotter:v8.7.0"
	snapshotControllerRef = "registry.k8s.io/sig-storage/snapshot-controller:v8.7.0"
)

// e2eImages are those images, from the static binaries of make k8s-e2e-tools and
// snapshotter-tools.
func e2eImages(busybox, agnhost, snapshotter, controller string) []image {
	return []image{
		// Upstream's agnhost image is Alpine (whose shell and tools are busybox) with agnhost as
		// the entrypoint; the storage tests run `/bin/sh -c` and busybox tools in it. Here it is
		// Debian's static busybox with its applet links, and the users and groups upstream adds
		// for the supplemental-groups tests.
		{Name: "agnhost", Ref: agnhostRef, entrypoint: "/agnhost", cmd: []string{"pause"},
			path: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", busybox: true,
			files: []file{
				{path: "/agnhost", host: agnhost},
				{path: "/agnhost-2", link: "agnhost"},
				{path: "/bin/busybox", host: busybox},
				{path: "/uploads", dir: true},
				{path: "/etc/passwd", data: "root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"},
				{path: "/etc/group", data: "root:x:0:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"},
			}},
		{Name: "csi-snapshotter", Ref: csiSnapshotterRef, entrypoint: "/csi-snapshotter", path: "/",
			files: []file{{path: "/csi-snapshotter", host: snapshotter}}},
		{Name: "snapshot-controller", Ref: snapshotControllerRef, entrypoint: "/snapshot-controller", path: "/",
			files: []file{{path: "/snapshot-controller", host: controller}}},
	}
}

// busyboxPath is the host path of the image's /bin/busybox.
func (im image) busyboxPath() string {
	for _, f := range im.files {
		if f.path == "/bin/busybox" {
			return f.host
		}
	}
	return ""
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
	agnhost := flag.String("agnhost", "", "A static agnhost (make k8s-e2e-tools); builds the storage e2e suite's images instead.")
	snapshotter := flag.String("csi-snapshotter", "", "A static csi-snapshotter (make snapshotter-tools), with -agnhost.")
	controller := flag.String("snapshot-controller", "", "A static snapshot-controller (make snapshotter-tools), with -agnhost.")
	flag.Parse()
	ims := images(*busybox, *provisioner, *versitygw)
	if *agnhost != "" {
		if *snapshotter == "" || *controller == "" {
			fmt.Fprintln(os.Stderr, "build: -agnhost needs -csi-snapshotter and -snapshot-controller")
			os.Exit(2)
		}
		ims = e2eImages(*busybox, *agnhost, *snapshotter, *controller)
	}
	if err := run(*out, *root, ims); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
	}
}

func run(out, root string, ims []image) error {
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
	for _, im := range ims {
		if im.busybox {
			links, err := busyboxLinks(im.busyboxPath())
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
				c.Cmd = im.cmd
			} else {
				c.Cmd = []string{"sh"}
			}
			c.Env = []string{"PATH=" + im.path}
			c.User = im.user
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
		case f.dir:
			err = b.Dir(f.path, 0o755)
		case f.data != "":
			err = b.File(f.path, []byte(f.data), 0o644)
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
