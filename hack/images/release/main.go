// Command release builds the images users install, without Docker, and pushes image tarballs
// to a registry (as ko does, with go-containerregistry):
//
//	release build -version V -rootfs ROOTFS.tar -out _output/images
//	release push -registry REGISTRY [-overlay DIR -base deploy/csi] _output/images/*.tar
//
// build writes node.tar (cistern/node:V: the csi-driver and storagepool-sidecar on the Debian
// root filesystem of hack/images/rootfs.sh, the Dockerfile's node stage) and
// workload-controller.tar (cistern/workload-controller:V: the static binary, a passwd with the
// non-root user 65532, nothing else), and images.json. The binaries come from `go build`s of the
// project's root module: static ones, and the csi-driver with cgo and -tags libnfs (NFSv4
// datasets), linked against the host's libc and libnfs, which the node's Debian root filesystem
// (the same release) has.
//
// push reads each tarball's tag (either builder's: `docker save` writes the same format),
// pushes cistern/NAME:TAG as REGISTRY/NAME:TAG, and with -overlay writes a kustomization that
// points deploy/csi at the pushed images.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cistern-csi/cistern/hack/images/layer"
)

// Repository is the name deploy/csi gives the images, before a kustomize images: entry.
const Repository = "cistern"

// nonRootUID is the controller's user, as the Deployment's securityContext and distroless's
// "nonroot" have it.
const nonRootUID = 65532

// Entry is one line of images.json.
type Entry struct {
	Ref     string `json:"ref"`
	Tarball string `json:"tarball"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: release build|push [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = buildCmd(os.Args[2:])
	case "push":
		err = pushCmd(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (build or push)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func buildCmd(args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	version := fs.String("version", "dev", "Image tag and the binaries' version.")
	rootfs := fs.String("rootfs", "", "The node image's Debian root filesystem as a tar (hack/images/rootfs.sh).")
	out := fs.String("out", "_output/images", "Directory for the image tarballs and images.json.")
	root := fs.String("root", "../..", "The project's root module.")
	_ = fs.Parse(args)
	if *rootfs == "" {
		return fmt.Errorf("-rootfs is required")
	}
	outDir, err := filepath.Abs(*out)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	bin, err := os.MkdirTemp("", "cistern-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	if err := layer.GoBuild(*root, bin, "-X main.version="+*version,
		"./cmd/storagepool-sidecar", "./cmd/workload-controller"); err != nil {
		return err
	}
	// The node plugin reads NFSv4 datasets through libnfs (the node stage installs libnfs13).
	if err := layer.GoBuildCgo(*root, bin, "-X main.version="+*version, []string{"libnfs"}, "./cmd/csi-driver"); err != nil {
		return err
	}

	node, err := nodeImage(*rootfs, bin, *version)
	if err != nil {
		return fmt.Errorf("node image: %w", err)
	}
	controller, err := controllerImage(bin, *version)
	if err != nil {
		return fmt.Errorf("controller image: %w", err)
	}
	index := map[string]Entry{}
	for _, im := range []struct {
		name string
		img  v1.Image
	}{{"node", node}, {"workload-controller", controller}} {
		ref := fmt.Sprintf("%s/%s:%s", Repository, im.name, *version)
		tag, err := name.NewTag(ref)
		if err != nil {
			return err
		}
		path := filepath.Join(outDir, im.name+".tar")
		if err := tarball.WriteToFile(path, tag, im.img); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		index[im.name] = Entry{Ref: ref, Tarball: path}
		fmt.Printf("%s -> %s\n", ref, path)
	}
	data, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(outDir, "images.json"), data, 0o644)
}

// labels say what the image is, as the OCI annotations do.
func labels(version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":  "https://github.com/cistern-csi/cistern",
		"org.opencontainers.image.version": version,
	}
}

// nodeImage is the Debian root filesystem and a layer with the two node binaries.
func nodeImage(rootfs, bin, version string) (v1.Image, error) {
	base, err := tarball.LayerFromFile(rootfs)
	if err != nil {
		return nil, err
	}
	b := layer.New()
	for _, name := range []string{"csi-driver", "storagepool-sidecar"} {
		if err := b.HostFile("/usr/local/bin/"+name, filepath.Join(bin, name), 0o755); err != nil {
			return nil, err
		}
	}
	binaries, err := b.Layer()
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, base, binaries)
	if err != nil {
		return nil, err
	}
	return layer.Configure(img, func(c *v1.Config) {
		c.Entrypoint = []string{"/usr/local/bin/csi-driver"}
		c.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		c.Labels = labels(version)
	})
}

// controllerImage holds the static controller binary and the user it runs as; no shell.
func controllerImage(bin, version string) (v1.Image, error) {
	b := layer.New()
	if err := b.HostFile("/usr/local/bin/workload-controller", filepath.Join(bin, "workload-controller"), 0o755); err != nil {
		return nil, err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonRootUID, nonRootUID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonRootUID)
	if err := b.File("/etc/passwd", []byte(passwd), 0o644); err != nil {
		return nil, err
	}
	if err := b.File("/etc/group", []byte(group), 0o644); err != nil {
		return nil, err
	}
	if err := b.Dir("/tmp", 0o1777); err != nil {
		return nil, err
	}
	l, err := b.Layer()
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return nil, err
	}
	return layer.Configure(img, func(c *v1.Config) {
		c.Entrypoint = []string{"/usr/local/bin/workload-controller"}
		c.User = fmt.Sprintf("%d:%d", nonRootUID, nonRootUID)
		c.Labels = labels(version)
	})
}

func pushCmd(args []string) error {
	fs := flag.NewFlagSet("push", flag.ExitOnError)
	registry := fs.String("registry", "", "Registry and path to push to, e.g. registry.example.com/storage.")
	overlay := fs.String("overlay", "", "Write a kustomization pointing -base at the pushed images into this directory.")
	base := fs.String("base", "deploy/csi", "The kustomization the overlay refers to.")
	_ = fs.Parse(args)
	if *registry == "" || fs.NArg() == 0 {
		return errors.New("usage: release push -registry REGISTRY [-overlay DIR] IMAGE.tar (one or more)")
	}
	var entries []string
	for _, path := range fs.Args() {
		src, dst, err := Push(path, *registry)
		if err != nil {
			return err
		}
		fmt.Printf("%s -> %s\n", src, dst)
		entries = append(entries, KustomizeImage(src, dst))
	}
	if *overlay == "" {
		fmt.Printf("\nPoint deploy/csi at them with this in a kustomization:\nimages:\n%s", strings.Join(entries, ""))
		return nil
	}
	if err := os.MkdirAll(*overlay, 0o755); err != nil {
		return err
	}
	rel, err := relPath(*overlay, *base)
	if err != nil {
		return err
	}
	k := fmt.Sprintf("# Written by `make push`: deploy/csi with the pushed images.\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\nimages:\n%s%s", rel, strings.Join(entries, ""), ControllerImageReplacements)
	path := filepath.Join(*overlay, "kustomization.yaml")
	fmt.Printf("%s: kubectl apply --server-side -k %s\n", path, *overlay)
	return os.WriteFile(path, []byte(k), 0o644)
}

// Push pushes the single image of an image tarball, tagged cistern/NAME:TAG, as
// REGISTRY/NAME:TAG, and returns both references.
func Push(path, registry string) (src, dst string, err error) {
	manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", path, err)
	}
	if len(manifest) != 1 || len(manifest[0].RepoTags) == 0 {
		return "", "", fmt.Errorf("%s: want one tagged image", path)
	}
	src = manifest[0].RepoTags[0]
	srcTag, err := name.NewTag(src)
	if err != nil {
		return "", "", err
	}
	img, err := tarball.ImageFromPath(path, &srcTag)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", path, err)
	}
	repo := srcTag.RepositoryStr()
	repo = repo[strings.LastIndex(repo, "/")+1:]
	dstTag, err := name.NewTag(fmt.Sprintf("%s/%s:%s", strings.TrimSuffix(registry, "/"), repo, srcTag.TagStr()))
	if err != nil {
		return "", "", err
	}
	if err := remote.Write(dstTag, img, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return "", "", fmt.Errorf("pushing %s: %w", dstTag, err)
	}
	return src, dstTag.String(), nil
}

// ControllerImageReplacements is what an overlay of deploy/csi with images: entries needs besides
// them: kustomize builds deploy/csi first, its copy of the controller's image into COMPARE_IMAGE
// and STAGER_IMAGE included, so that only a copy in the overlay, which kustomize runs after the
// overlay's images: entries, names the overlay's image there.
const ControllerImageReplacements = `# The notebook comparison and VolumeManager stager images are the controller's: copied again
# after this kustomization's images: entries (deploy/csi's own copy ran before them).
replacements:
- source:
    kind: Deployment
    name: cistern-workload-controller
    fieldPath: spec.template.spec.containers.[name=controller].image
  targets:
  - select: {kind: Deployment, name: cistern-workload-controller}
    fieldPaths:
    - spec.template.spec.containers.[name=controller].env.[name=COMPARE_IMAGE].value
    - spec.template.spec.containers.[name=controller].env.[name=STAGER_IMAGE].value
`

// KustomizeImage is the kustomize images: entry that replaces src's name and tag by dst's.
func KustomizeImage(src, dst string) string {
	s, _ := name.NewTag(src)
	d, _ := name.NewTag(dst)
	srcName := strings.TrimSuffix(src, ":"+s.TagStr())
	// The tag quoted: one of digits only (a short commit hash can be) would be a YAML number.
	return fmt.Sprintf("- name: %s\n  newName: %s\n  newTag: %q\n", srcName, d.Context().Name(), d.TagStr())
}

func relPath(from, to string) (string, error) {
	a, err := filepath.Abs(from)
	if err != nil {
		return "", err
	}
	b, err := filepath.Abs(to)
	if err != nil {
		return "", err
	}
	return filepath.Rel(a, b)
}
