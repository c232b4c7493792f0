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
	h := &exportHandler{Handler: nfshelper.NewNullAuthHandler(osfs.New(dir))}
	go nfs.Serve(l, nfshelper.NewCachingHandler(h, 4096))
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
