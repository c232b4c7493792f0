// Command registry serves an OCI registry on loopback (go-containerregistry's pkg/registry,
// blobs in memory) holding the images of the given images.json files, for the install suite:
// containerd pulls from it as from any registry.
//
//	registry -listen 127.0.0.1:0 -addr-file ADDR -images a/images.json,b/images.json [-retag SRC=DST,...]
//
// Each image REGISTRY/PATH:TAG of a tarball is served as <addr>/PATH:TAG (registry.k8s.io/
// sig-storage/csi-provisioner:v6.4.0 as <addr>/sig-storage/csi-provisioner:v6.4.0). The address is
// written to -addr-file once every image is in; the registry serves until SIGTERM. -retag serves
// the image SRC also as DST (a second tag for an upgrade).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type entry struct {
	Ref     string `json:"ref"`
	Tarball string `json:"tarball"`
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "Address to serve on; loopback only.")
	addrFile := flag.String("addr-file", "", "Write the address here once the images are in.")
	images := flag.String("images", "", "Comma-separated images.json files whose images to serve.")
	retag := flag.String("retag", "", "Comma-separated SRC=DST: serve the image SRC also as DST.")
	flag.Parse()
	if err := run(*listen, *addrFile, *images, *retag); err != nil {
		fmt.Fprintln(os.Stderr, "registry:", err)
		os.Exit(1)
	}
}

func run(listen, addrFile, images, retag string) error {
	also := map[string][]string{}
	for _, pair := range strings.Split(retag, ",") {
		if src, dst, ok := strings.Cut(pair, "="); ok {
			also[src] = append(also[src], dst)
		}
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-listen %s: only loopback addresses", listen)
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(os.Stderr, "", log.LstdFlags))), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	addr := lis.Addr().String()

	for _, index := range strings.Split(images, ",") {
		if index == "" {
			continue
		}
		data, err := os.ReadFile(index)
		if err != nil {
			return err
		}
		entries := map[string]entry{}
		if err := json.Unmarshal(data, &entries); err != nil {
			return fmt.Errorf("%s: %w", index, err)
		}
		for _, e := range entries {
			for _, ref := range append([]string{e.Ref}, also[e.Ref]...) {
				dst, err := push(e, ref, addr)
				if err != nil {
					return err
				}
				log.Printf("%s -> %s", e.Ref, dst)
			}
		}
	}
	if addrFile != "" {
		if err := os.WriteFile(addrFile+".tmp", []byte(addr), 0o644); err != nil {
			return err
		}
		if err := os.Rename(addrFile+".tmp", addrFile); err != nil {
			return err
		}
	}
	log.Printf("serving on %s", addr)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
		return srv.Close()
	case err := <-served:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// push copies the tarball's image to addr under the repository path and tag of ref.
func push(e entry, ref, addr string) (string, error) {
	src, err := name.NewTag(e.Ref)
	if err != nil {
		return "", err
	}
	img, err := tarball.ImageFromPath(e.Tarball, &src)
	if err != nil {
		return "", fmt.Errorf("%s: %w", e.Tarball, err)
	}
	as, err := name.NewTag(ref)
	if err != nil {
		return "", err
	}
	dst, err := name.NewTag(addr+"/"+as.RepositoryStr()+":"+as.TagStr(), name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(dst, img); err != nil {
		return "", fmt.Errorf("pushing %s: %w", dst, err)
	}
	return dst.String(), nil
}
