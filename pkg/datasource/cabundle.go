package datasource

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cistern-csi/cistern/pkg/datasource/s3source"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// maxCABundleBytes bounds a CA bundle file (a few hundred certificates).
const maxCABundleBytes = 4 << 20

// s3TLS is how the S3 source of spec trusts its endpoint: the CA bundle the dataset names, out
// of the administrator's directory (Config.S3CABundleDir, a ConfigMap or Secret the node plugin
// mounts), and whether plain HTTP off the node is allowed (Config.S3AllowPlainHTTP). The bundle
// is read on every open, so a rotated ConfigMap takes effect without a restart.
func (m *Manager) s3TLS(spec *Spec) (s3source.TLS, error) {
	t := s3source.TLS{AllowPlainHTTP: m.cfg.S3AllowPlainHTTP}
	if spec.CABundle == "" {
		return t, nil
	}
	if m.cfg.S3CABundleDir == "" {
		return t, source.Errorf(source.Invalid, "%s names CA bundle %q, but the driver has no --s3-ca-bundles directory", spec.Describe(), spec.CABundle)
	}
	// params admits only a ConfigMap key: no separator, never "." or "..".
	path := filepath.Join(m.cfg.S3CABundleDir, filepath.Base(spec.CABundle))
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return t, source.Errorf(source.Invalid, "%s: CA bundle %q is not in %s", spec.Describe(), spec.CABundle, m.cfg.S3CABundleDir)
	}
	if err != nil {
		return t, err
	}
	defer f.Close()
	pem := make([]byte, maxCABundleBytes+1)
	n, err := readFull(f, pem)
	if err != nil {
		return t, err
	}
	if n > maxCABundleBytes {
		return t, source.Errorf(source.Invalid, "CA bundle %q is larger than %d bytes", spec.CABundle, maxCABundleBytes)
	}
	if t.RootCAs, err = s3source.ParseCABundle(spec.CABundle, pem[:n]); err != nil {
		return t, err
	}
	return t, nil
}

// readFull reads until buf is full or the file ends.
func readFull(f *os.File, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := f.Read(buf[n:])
		n += k
		if err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, err
		}
	}
	return n, nil
}
