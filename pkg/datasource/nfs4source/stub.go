//go:build !(cgo && libnfs)

package nfs4source

import "github.com/cistern-csi/cistern/pkg/datasource/source"

// Supported says whether this build reads NFSv4 (cgo and -tags libnfs).
const Supported = false

// New fails: this build has no NFSv4 client.
func New(cfg Config) (source.Source, error) {
	return nil, source.Errorf(source.Invalid, "nfs://%s%s with nfsVersion 4: this build has no NFSv4 support (built without libnfs)", cfg.Host, cfg.Path)
}
