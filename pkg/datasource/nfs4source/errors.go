package nfs4source

import (
	"strings"
	"syscall"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// libnfsError is a failed libnfs call: the negated errno it returned and nfs_get_error's text.
type libnfsError struct {
	errno syscall.Errno
	msg   string
}

func (e *libnfsError) Error() string {
	if e.msg == "" {
		return e.errno.Error()
	}
	return e.msg
}

func (e *libnfsError) Unwrap() error { return e.errno }

// classify gives a libnfs failure its source kind. libnfs maps most NFSv4 statuses to errnos,
// but not all (it passes NFSv4 statuses through its NFSv3 table), so its message, which names
// the status (NFS4ERR_NOENT), is read too.
func classify(err error, format string, args ...any) error {
	e, ok := err.(*libnfsError)
	if !ok {
		return source.Wrap(source.Retryable, err, format, args...)
	}
	m := e.msg
	switch {
	case e.errno == syscall.ENOENT || strings.Contains(m, "NFS4ERR_NOENT"):
		return source.Wrap(source.NotFound, err, format+": not found", args...)
	case e.errno == syscall.EACCES || e.errno == syscall.EPERM || strings.Contains(m, "NFS4ERR_ACCESS") ||
		strings.Contains(m, "NFS4ERR_PERM") || strings.Contains(m, "NFS4ERR_WRONGSEC"):
		return source.Wrap(source.Denied, err, format+": access denied", args...)
	case e.errno == syscall.ELOOP:
		return source.Wrap(source.Unsafe, err, format+": a symlink where a file was listed", args...)
	case e.errno == syscall.ENOTDIR || strings.Contains(m, "NFS4ERR_NOTDIR"):
		return source.Wrap(source.Changed, err, format+": not a directory", args...)
	case strings.Contains(m, "NFS4ERR_MINOR_VERS_MISMATCH"):
		return source.Wrap(source.Invalid, err, format+": the server does not speak NFSv4.0 (this client's only version)", args...)
	}
	return source.Wrap(source.Retryable, err, format, args...)
}
