package testpeers

import (
	"os"
	"path"
	"testing"
)

// NFSExport is a directory an NFS server exports, as nfs:// URLs name it.
type NFSExport struct {
	// Host is the server as a URL and --nfs-servers name it: host:port for go-nfs (one port for
	// MOUNT and NFS), a bare address for nfs-ganesha (its ports from rpcbind).
	Host string
	// Path is the export's path at the server.
	Path string
}

// URL is the nfs:// URL of rel, a slash-separated path below the export ("" for the export).
func (e NFSExport) URL(rel string) string {
	return "nfs://" + e.Host + path.Join(e.Path, rel)
}

// NFSServer is an NFSv3 server the NFS tests run against.
type NFSServer struct {
	Name string
	// Start serves dir, read-write, until the test ends.
	Start func(t testing.TB, dir string) NFSExport
}

// NFSServers are the servers every NFS source and target test runs against, each as a subtest
// named after it: go-nfs (in the test's process, AUTH_UNIX ignored: every request may read and
// write everything) and nfs-ganesha (StartGanesha, No_Root_Squash: the export's file permissions
// apply to the client's uid and gid, as on a real server). For ganesha dir itself is made
// searchable and readable by all (0755; t.TempDir makes it 0700), as an export's root is: what
// lies below keeps the modes the test gave it.
var NFSServers = []NFSServer{
	{Name: "go-nfs", Start: func(t testing.TB, dir string) NFSExport {
		return NFSExport{Host: StartNFS(t, dir), Path: "/export"}
	}},
	{Name: "ganesha", Start: func(t testing.TB, dir string) NFSExport {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return NFSExport{Host: StartGanesha(t, dir), Path: dir}
	}},
}

// EachNFSServer runs fn as a subtest for each of NFSServers.
func EachNFSServer(t *testing.T, fn func(t *testing.T, srv NFSServer)) {
	t.Helper()
	for _, srv := range NFSServers {
		t.Run(srv.Name, func(t *testing.T) { fn(t, srv) })
	}
}
