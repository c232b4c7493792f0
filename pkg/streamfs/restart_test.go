package streamfs_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cistern-csi/cistern/pkg/datasource/s3source"
	"github.com/cistern-csi/cistern/pkg/datasource/source"
	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	"github.com/cistern-csi/cistern/pkg/streamfs"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// childEnv names the file that makes the test binary a streaming server (serveChild) instead of
// running tests.
const childEnv = "CISTERN_STREAMFS_CHILD"

func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		if err := serveChild(path); err != nil {
			fmt.Fprintln(os.Stderr, "streaming server:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// childConfig is what a server process needs: the same for every process serving the mount.
type childConfig struct {
	Dir, Keeper, Scratch, Cached   string
	Endpoint, AccessKey, SecretKey string
	Objects                        []source.Object
	Parts                          map[string][]source.Part
	// MaxOpenFiles is each process's bound (streamfs.NewOpenFiles).
	MaxOpenFiles int
}

// serveChild serves the mount the way the node plugin does: it takes the connection back from
// the keeper if the keeper holds one, or mounts afresh and hands a copy to the keeper; then it
// says so on stdout and serves until killed.
func serveChild(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var c childConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return err
	}
	src, err := s3source.New(s3source.Config{Bucket: "data", Endpoint: c.Endpoint, PathStyle: true,
		AccessKeyID: c.AccessKey, SecretAccessKey: c.SecretKey})
	if err != nil {
		return err
	}
	cfg := streamfs.Config{Objects: c.Objects, Scratch: c.Scratch, Files: streamfs.NewOpenFiles(c.MaxOpenFiles),
		Fetcher: partsFetcher{streamfs.SourceFetcher{Source: src}, c.Parts},
		Cached: func(o source.Object) (*os.File, error) {
			file, err := os.Open(filepath.Join(c.Cached, o.Key))
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return file, err
		}}
	held, err := fusekeeper.Take(c.Keeper)
	if err != nil {
		return err
	}
	how := "mounted"
	if len(held) > 0 {
		var conn streamfs.Conn
		if err := json.Unmarshal(held[0].Meta, &conn); err != nil {
			return err
		}
		conn.Dev = held[0].Dev
		if _, err := streamfs.Resume(c.Dir, conn, cfg); err != nil {
			return err
		}
		how = "resumed"
	} else {
		m, err := streamfs.Start(c.Dir, cfg)
		if err != nil {
			return err
		}
		conn, err := m.Conn()
		if err != nil {
			return err
		}
		meta, _ := json.Marshal(conn)
		err = fusekeeper.Keep(c.Keeper, "vol", conn.Dev, meta)
		conn.Dev.Close()
		if err != nil {
			return err
		}
	}
	fmt.Println(how)
	select {}
}

// TestRestartLosesNoRead: the process serving a streaming mount is killed (SIGKILL) while
// several readers read cached and uncached files through it, and a new process takes the
// connection over from the keeper: every read completes, byte-identical to S3. Twice. Each
// process's bound is 2 open files, so backing files are dropped and registered again all along:
// a process taking over must not answer with one dropped before (EIO at open).
func TestRestartLosesNoRead(t *testing.T) {
	f := newFixture(t)
	// Every GET waits: the kills land while reads wait for fetches.
	f.proxy.SetFaults(func(r *http.Request, _ int64) testpeers.Fault {
		if r.Method == http.MethodGet {
			return testpeers.Fault{ResetAfter: -1, Delay: 100 * time.Millisecond}
		}
		return testpeers.None
	})
	srv := startServers(t, f, 2)
	start := srv.start
	child := start("mounted")
	unmount := srv.unmount

	files := []string{"big.bin", "cached.bin", "ahead.bin", "dir/small.txt", "control.bin", "cached2.bin", "dir/sub/flip.txt"}
	var (
		whole, failed, bytesRead atomic.Int64
		inRead                   atomic.Int64 // readers inside a read(2) on the mount
		inFetch                  atomic.Int64 // of those, readers of a file not in the cache
		stop                     atomic.Bool
		errMu                    sync.Mutex
		errs                     []string
		wg                       sync.WaitGroup
	)
	cached := map[string]bool{"cached.bin": true, "cached2.bin": true}
	readFile := func(key string) error {
		file, err := os.Open(filepath.Join(f.dir, key))
		if err != nil {
			return err
		}
		defer file.Close()
		var got bytes.Buffer
		buf := make([]byte, 256<<10)
		for {
			inRead.Add(1)
			if !cached[key] {
				inFetch.Add(1)
			}
			n, err := file.Read(buf)
			if !cached[key] {
				inFetch.Add(-1)
			}
			inRead.Add(-1)
			got.Write(buf[:n])
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
		if !bytes.Equal(got.Bytes(), f.want[key]) {
			return fmt.Errorf("%d bytes differ from the source's %d", got.Len(), len(f.want[key]))
		}
		bytesRead.Add(int64(got.Len()))
		return nil
	}
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := r; !stop.Load(); i++ {
				key := files[i%len(files)]
				if err := readFile(key); err != nil {
					failed.Add(1)
					errMu.Lock()
					errs = append(errs, key+": "+err.Error())
					errMu.Unlock()
					continue
				}
				whole.Add(1)
			}
		}()
	}
	finished := false
	t.Cleanup(func() {
		stop.Store(true)
		if !finished {
			unmount() // readers waiting on a dead server get ENOTCONN
		}
		wg.Wait()
	})

	// waitFor polls a counter: reads, not time, say when to go on.
	// A server that dies unasked fails every read at once (ENOTCONN): say so, with how it ended.
	waitFor := func(what string, ok func() bool) {
		for deadline := time.Now().Add(2 * time.Minute); !ok(); time.Sleep(time.Millisecond) {
			if err := child.died(); err != nil {
				t.Fatalf("waiting for %s: the server process %v, %d files read, %d failed", what, err, whole.Load(), failed.Load())
			}
			if time.Now().After(deadline) {
				errMu.Lock()
				first := errs[:min(len(errs), 5)]
				errMu.Unlock()
				t.Fatalf("waiting for %s: %d files read, %d failed, the first: %q", what, whole.Load(), failed.Load(), first)
			}
		}
	}
	const kills = 2
	var inFlight []int64
	for k := range kills {
		before := whole.Load()
		waitFor("reads before the kill", func() bool {
			return whole.Load() >= before+4 && inRead.Load() >= 2 && inFetch.Load() >= 1
		})
		inFlight = append(inFlight, inFetch.Load())
		if err := child.kill(); err != nil {
			t.Fatal(err)
		}
		t.Logf("kill %d: %d readers of uncached files inside read(2), %d files read so far", k+1, inFlight[k], whole.Load())
		child = start("resumed")
	}
	after := whole.Load()
	waitFor("reads after the last takeover", func() bool { return whole.Load() >= after+2*int64(len(files)) })
	stop.Store(true)
	wg.Wait()
	finished = true
	t.Logf("%d whole files read (%d MiB), byte-identical to S3; %d failed; readers of uncached files inside read(2) at the kills: %v",
		whole.Load(), bytesRead.Load()>>20, failed.Load(), inFlight)
	if failed.Load() != 0 {
		t.Errorf("%d reads failed across the restarts: %v", failed.Load(), errs)
	}
}

// servers runs the processes serving one mount, each taking it over from the keeper.
type servers struct {
	keeper  string
	cfgPath string
	conn    string // the mount's FUSE connection, once mounted
	t       *testing.T
	dir     string
}

// startServers starts a keeper; the mount goes when the test ends, its connection aborted, so
// that the keeper's copy and any reader left waiting go too.
func startServers(t *testing.T, f *fixture, maxOpenFiles int) *servers {
	ctx, cancel := context.WithCancel(context.Background())
	keeper, err := fusekeeper.Listen(filepath.Join(t.TempDir(), "keeper.sock"))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- keeper.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-served })
	cfg := childConfig{Dir: f.dir, Keeper: keeper.Path(), Scratch: t.TempDir(), Cached: f.cached,
		Endpoint: f.proxy.URL, AccessKey: f.s3.AccessKey, SecretKey: f.s3.SecretKey, Objects: f.objs, Parts: f.parts,
		MaxOpenFiles: maxOpenFiles}
	s := &servers{keeper: keeper.Path(), cfgPath: filepath.Join(t.TempDir(), "child.json"), t: t, dir: f.dir}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(s.cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.unmount)
	return s
}

func (s *servers) unmount() {
	if s.conn != "" {
		_ = streamfs.AbortConn(s.conn)
	}
	_ = syscall.Unmount(s.dir, syscall.MNT_DETACH)
}

// server is one server process.
type server struct {
	cmd    *exec.Cmd
	killed atomic.Bool
	exited chan struct{}
	err    error // how it ended, once exited is closed
}

// kill SIGKILLs the server and waits for its end.
func (p *server) kill() error {
	p.killed.Store(true)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-p.exited
	return nil
}

// died says how the server ended, if it ended without being killed (a panic, a race report).
func (p *server) died() error {
	select {
	case <-p.exited:
		if !p.killed.Load() {
			return fmt.Errorf("exited unasked: %v", p.err)
		}
	default:
	}
	return nil
}

// start starts a server process, which says want ("mounted" or "resumed") once it serves.
func (s *servers) start(want string) *server {
	t := s.t
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+s.cfgPath)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &server{cmd: cmd, exited: make(chan struct{})}
	line, err := bufio.NewReader(out).ReadString('\n')
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { _ = p.kill() })
	if err != nil || line != want+"\n" {
		t.Fatalf("server process: %q, %v; want %q", line, err, want)
	}
	if s.conn == "" {
		if s.conn, err = streamfs.ConnOf(s.dir); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// TestRefuseAnswersEIO: a mount whose server died and whose caller's access cannot be proved
// again is taken over by Refuse: a read of a file opened before, a new open, a listing and a
// lookup all fail with EIO, none hangs, and nothing is served.
func TestRefuseAnswersEIO(t *testing.T) {
	f := newFixture(t)
	srv := startServers(t, f, 0)
	child := srv.start("mounted")
	// Opened (and partly read) while the server ran: its next read goes to the next server.
	open, err := os.Open(filepath.Join(f.dir, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	buf := make([]byte, 4096)
	if _, err := open.Read(buf); err != nil {
		t.Fatal(err)
	}
	if err := child.kill(); err != nil {
		t.Fatal(err)
	}
	held, err := fusekeeper.Take(srv.keeper)
	if err != nil || len(held) != 1 {
		t.Fatalf("keeper holds %d connections, %v", len(held), err)
	}
	var conn streamfs.Conn
	if err := json.Unmarshal(held[0].Meta, &conn); err != nil {
		t.Fatal(err)
	}
	conn.Dev = held[0].Dev
	m, err := streamfs.Refuse(f.dir, conn, "the test lost the credentials")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := open.ReadAt(buf, int64(len(f.want["big.bin"]))-int64(len(buf))); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of a file opened before: %v, want EIO", err)
	}
	if _, err := os.ReadFile(filepath.Join(f.dir, "dir/small.txt")); !errors.Is(err, syscall.EIO) {
		t.Errorf("a new open: %v, want EIO", err)
	}
	if _, err := os.ReadDir(f.dir); !errors.Is(err, syscall.EIO) {
		t.Errorf("listing: %v, want EIO", err)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "never-looked-up")); !errors.Is(err, syscall.EIO) {
		t.Errorf("lookup: %v, want EIO", err)
	}
}
