package nfs4source

import (
	"testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestBuiltWithLibnfs: the suites run with -tags libnfs (make test-datasource); a run without
// it has no NFSv4 tests, which under CI must fail, not pass by running none.
func TestBuiltWithLibnfs(t *testing.T) {
	if !Supported {
		_, err := New(Config{Host: "server", Path: "/data"})
		if source.KindOf(err) != source.Invalid {
			t.Errorf("New without libnfs: %v, want an Invalid error", err)
		}
		testutil.Unavailable(t, "built without libnfs (cgo and -tags libnfs; Debian: libnfs-dev): New says %q", err)
	}
}

// TestClassify: libnfs failures get the source kinds the engine and the gRPC codes go by.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  *libnfsError
		want source.Kind
	}{
		{&libnfsError{errno: 2, msg: "NFS4: (path /x) failed with NFS4ERR_NOENT(-2)"}, source.NotFound},
		{&libnfsError{errno: 13, msg: "NFS4: OPEN (path /x) failed with NFS4ERR_ACCESS(-13)"}, source.Denied},
		{&libnfsError{errno: 40, msg: "Symlink encountered during open(O_NOFOLLOW)"}, source.Unsafe},
		{&libnfsError{errno: 5, msg: "NFS4ERR_MINOR_VERS_MISMATCH"}, source.Invalid},
		{&libnfsError{errno: 111, msg: "connection refused"}, source.Retryable},
	} {
		if got := source.KindOf(classify(tc.err, "reading %s", "x")); got != tc.want {
			t.Errorf("%q: kind %v, want %v", tc.err.msg, got, tc.want)
		}
	}
}
