// Package nfs4source reads datasets from NFSv4 servers (EFS, NetApp, nfs-ganesha, knfsd) through
// libnfs, a userspace client in C: nodes need no kernel NFS client and no mount. The NFSv3 source
// (nfssource) is pure Go; no Go client speaks NFSv4, so this one needs cgo and libnfs, and only
// builds that ask for it (`-tags libnfs` with cgo: the node plugin) have it. Elsewhere New
// returns an Invalid error that says so.
//
// libnfs 4.0 (Debian bookworm's libnfs13) speaks NFSv4.0 only: SETCLIENTID, no sessions. Servers
// that require NFSv4.1 or later (Azure Files' NFS shares) refuse it.
package nfs4source

// Config says where a dataset is and who reads it.
type Config struct {
	// Host is "server" (NFS on port 2049) or "server:port".
	Host string
	// Path is the dataset's directory in the server's NFSv4 namespace (its pseudo path).
	Path string
	// UID and GID are the AUTH_SYS identity requests carry: the server's export rules and file
	// permissions apply to it.
	UID, GID uint32
	// MaxIdle is how many idle connections are kept for later reads (0: 8).
	MaxIdle int
}
