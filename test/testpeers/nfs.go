package testpeers

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-billy/v5"
	"github.com/go-git/go-billy/v5/osfs"
	nfs "github.com/willscott/go-nfs"
	nfshelper "github.com/willscott/go-nfs/helpers"
)

// StartNFS serves dir over NFSv3 on loopback (MOUNT and NFS on one port) as export "/export";
// mounting a path below it is refused, as many servers do, so clients must look it up.
func StartNFS(t testing.TB, dir string) string {
	return startNFS(t, dir, false)
}

// StartNFSSubdirs is StartNFS with mounts of the directories below "/export" allowed too, as
// Linux knfsd allows them: each is served as a filesystem of its own, rooted there.
func StartNFSSubdirs(t testing.TB, dir string) string {
	return startNFS(t, dir, true)
}

func startNFS(t testing.TB, dir string, subdirs bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &exportHandler{Handler: nfshelper.NewCachingHandler(nfshelper.NewNullAuthHandler(osfs.New(dir)), 4096)}
	if subdirs {
		h.dir = dir
	}
	go nfs.Serve(l, h)
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// exportHandler serves "/export" and, with dir set, the directories below it.
type exportHandler struct {
	nfs.Handler
	dir string
}

func (h *exportHandler) Mount(ctx context.Context, c net.Conn, req nfs.MountRequest) (nfs.MountStatus, billy.Filesystem, []nfs.AuthFlavor) {
	p := strings.TrimSuffix(string(req.Dirpath), "/")
	if p == "/export" {
		return h.Handler.Mount(ctx, c, req)
	}
	if rel, ok := strings.CutPrefix(p, "/export/"); ok && h.dir != "" && !strings.Contains("/"+rel+"/", "/../") {
		if fi, err := os.Stat(filepath.Join(h.dir, rel)); err == nil && fi.IsDir() {
			return nfs.MountStatusOk, osfs.New(filepath.Join(h.dir, rel)), []nfs.AuthFlavor{nfs.AuthFlavorNull}
		}
	}
	return nfs.MountStatusErrNoEnt, nil, nil
}

// ToHandle tolerates the nil filesystem go-nfs passes after a refused mount.
func (h *exportHandler) ToHandle(fs billy.Filesystem, path []string) []byte {
	if fs == nil {
		return nil
	}
	return h.Handler.ToHandle(fs, path)
}
