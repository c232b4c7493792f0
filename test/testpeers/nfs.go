package testpeers

import (
	"context"
	"net"
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
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &exportHandler{Handler: nfshelper.NewCachingHandler(nfshelper.NewNullAuthHandler(osfs.New(dir)), 4096)}
	go nfs.Serve(l, h)
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

type exportHandler struct{ nfs.Handler }

func (h *exportHandler) Mount(ctx context.Context, c net.Conn, req nfs.MountRequest) (nfs.MountStatus, billy.Filesystem, []nfs.AuthFlavor) {
	if strings.TrimSuffix(string(req.Dirpath), "/") != "/export" {
		return nfs.MountStatusErrNoEnt, nil, nil
	}
	return h.Handler.Mount(ctx, c, req)
}

// ToHandle tolerates the nil filesystem go-nfs passes after a refused mount.
func (h *exportHandler) ToHandle(fs billy.Filesystem, path []string) []byte {
	if fs == nil {
		return nil
	}
	return h.Handler.ToHandle(fs, path)
}
