package peer

import (
	"context"
	"crypto/rand"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

// fileStore serves every entry of one ready version from one file of size bytes, through
// openPiece as CacheStore serves a ready dataset.
type fileStore struct {
	name string
	size int64
}

func (s fileStore) Versions(string) []string { return []string{testDigest} }

func (s fileStore) Have(string, string) (*Have, bool) { return &Have{Ready: true}, true }

func (s fileStore) Open(_, _ string, _, off, n int64) (io.ReadCloser, error) {
	return openPiece(filepath.Dir(s.name), []string{filepath.Base(s.name)}, source.Object{Size: s.size}, off, n)
}

type anyNode struct{}

func (anyNode) Authenticate(context.Context, string) (string, error) { return "node-1", nil }

// BenchmarkPieces measures what moving a piece between two nodes costs, both ends in this process:
// a peer server over TLS on loopback serving a file, a fetcher reading 32 MiB pieces with four
// streams at once into a 1 MiB buffer, as the staging engine does (stage.copyAt). It reports the
// CPU (user and system, both ends) per GiB moved: docs/benchmarks.md, "Peer fan-out".
func BenchmarkPieces(b *testing.B) {
	const piece, streams = 32 << 20, 4
	name := filepath.Join(b.TempDir(), "entry")
	data := make([]byte, 2*piece)
	_, _ = rand.Read(data)
	if err := os.WriteFile(name, data, 0o600); err != nil {
		b.Fatal(err)
	}
	cert, hash, err := SelfSigned("a")
	if err != nil {
		b.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Store: fileStore{name, int64(len(data))}, Auth: anyNode{}, Self: "a", Cert: cert, MaxUploads: 8})
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, l) }()
	b.Cleanup(func() { cancel(); <-done })
	p := Peer{Node: "a", Address: l.Addr().String(), CertHash: hash}
	n, err := NewNetwork(NetworkConfig{Self: "node-1", Directory: fixedPeers{p}, Token: func() (string, error) { return "t", nil }})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(piece)
	cpu0 := cpuTime()
	b.ResetTimer()
	var wg sync.WaitGroup
	next := make(chan int)
	for range streams {
		wg.Go(func() {
			buf := make([]byte, 1<<20)
			for k := range next {
				rc, err := n.OpenPiece(ctx, p, testID, testDigest, 0, int64(k%2)*piece, piece)
				if err != nil {
					b.Error(err)
					continue
				}
				for got := 0; got < piece; {
					m, err := io.ReadFull(rc, buf)
					got += m
					if err != nil {
						if got < piece {
							b.Error(err)
						}
						break
					}
				}
				rc.Close()
			}
		})
	}
	for k := range b.N {
		next <- k
	}
	close(next)
	wg.Wait()
	b.StopTimer()
	b.ReportMetric((cpuTime()-cpu0).Seconds()/(float64(b.N)*piece/(1<<30)), "cpu-s/GiB")
}

// cpuTime is this process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
