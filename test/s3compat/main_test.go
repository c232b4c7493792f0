package s3compat

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// server is one S3 implementation under test. versitygw starts per test (it takes a moment);
// SeaweedFS and Ceph RGW start once, on first use, and stop after the package's tests.
type server struct {
	name string
	// start returns the running server, or fails (Unavailable without its programs).
	start func(t *testing.T) *testpeers.S3
}

var servers = []server{
	{"versitygw", func(t *testing.T) *testpeers.S3 { return testpeers.StartS3(t, "") }},
	{"seaweedfs", seaweedfs.get},
	{"rgw", rgw.get},
}

// shared is a server started once for the package.
type shared struct {
	once  sync.Once
	s     *testpeers.S3
	err   error
	skip  string // why it cannot run here
	start func() (*testpeers.S3, func(), time.Duration, error)
	close func()
	name  string
}

var (
	seaweedfs = &shared{name: "seaweedfs", start: func() (*testpeers.S3, func(), time.Duration, error) {
		bin := testpeers.SeaweedFSBinary()
		if bin == "" {
			return nil, nil, 0, errUnavailable("CISTERN_SEAWEEDFS: weed missing; make seaweedfs builds it")
		}
		w, err := testpeers.StartSeaweedFS(context.Background(), bin, "")
		if err != nil {
			return nil, nil, 0, err
		}
		return w.S3, w.Close, w.Setup, nil
	}}
	rgw = &shared{name: "rgw", start: func() (*testpeers.S3, func(), time.Duration, error) {
		if err := testpeers.RGWAvailable(); err != nil {
			return nil, nil, 0, errUnavailable(err.Error())
		}
		r, err := testpeers.StartRGW(context.Background(), "")
		if err != nil {
			return nil, nil, 0, err
		}
		return r.S3, r.Close, r.Setup, nil
	}}
)

type errUnavailable string

func (e errUnavailable) Error() string { return string(e) }

func (p *shared) get(t *testing.T) *testpeers.S3 {
	t.Helper()
	p.once.Do(func() {
		s, closeFn, setup, err := p.start()
		if u, ok := err.(errUnavailable); ok {
			p.skip = string(u)
			return
		}
		p.s, p.close, p.err = s, closeFn, err
		if err == nil {
			fmt.Printf("s3compat: server=%s setup=%s\n", p.name, setup.Round(100*time.Millisecond))
		}
	})
	if p.skip != "" {
		testutil.Unavailable(t, "%s: %s", p.name, p.skip)
	}
	if p.err != nil {
		t.Fatalf("%s did not start: %v", p.name, p.err)
	}
	return p.s
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, p := range []*shared{seaweedfs, rgw} {
		if p.close != nil {
			p.close()
		}
	}
	os.Exit(code)
}
