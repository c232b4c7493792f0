package chaos

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cistern-csi/cistern/test/framework/kit"
	"github.com/cistern-csi/cistern/test/testutil"
)

// node is the real csi-driver binary as a process (mode all) with one pool on a loop-mounted
// ext4 filesystem, so that it can be SIGKILLed and started again on the same state.
type node struct {
	t        *testing.T
	bin      string
	dir      string // the kubelet root: targets and staging paths are below
	pool     string
	sock     string
	logPath  string
	extra    []string // flags besides the suite's own
	points   *points  // the driver's test points (pkg/testpoint), where kills land
	cmd      *exec.Cmd
	exited   chan struct{}
	mu       sync.Mutex // guards the clients, replaced at each start
	conn     *grpc.ClientConn
	ctrl     csi.ControllerClient
	nodeRPC  csi.NodeClient
	restarts int
}

// nodeC and ctrlC are the clients of the driver running now.
func (n *node) nodeC() csi.NodeClient {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nodeRPC
}

func (n *node) ctrlC() csi.ControllerClient {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ctrl
}

func startNode(t *testing.T, poolBytes int64, extra ...string) *node {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	n := &node{t: t, dir: dir, bin: filepath.Join(dir, "csi-driver"), sock: filepath.Join(dir, "csi.sock"),
		logPath: filepath.Join(dir, "driver.log"), extra: extra}
	// Under CI=true with the race detector: a race report in its log fails the test (below).
	build := testutil.GoBuildRace(n.bin, "./cmd/csi-driver")
	build.Dir = kit.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the driver: %v\n%s", err, out)
	}
	n.pool = testutil.LoopFS(t, "ext4", poolBytes)
	if err := os.WriteFile(filepath.Join(dir, "pools.yaml"), []byte("pools:\n- name: fast\n  path: "+n.pool+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.points = startPoints(t, dir)
	t.Cleanup(func() {
		n.stop()
		testutil.UnmountUnder(dir)
		testutil.DetachLoopsUnder(n.pool)
		if races := n.raceReports(); len(races) > 0 {
			t.Errorf("the driver reported %d data races; the first:\n%s", len(races), races[0])
		}
		if t.Failed() {
			t.Logf("driver log: %s", n.logPath)
			if b, err := os.ReadFile(n.logPath); err == nil {
				lines := strings.Split(string(b), "\n")
				if len(lines) > 40 {
					lines = lines[len(lines)-40:]
				}
				t.Logf("last lines:\n%s", strings.Join(lines, "\n"))
			}
		}
	})
	n.start()
	return n
}

func (n *node) start() {
	t := n.t
	log, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	n.cmd = exec.Command(n.bin, "--endpoint=unix://"+n.sock, "--node-id=chaos-node", "--mode=all",
		"--pools-config="+filepath.Join(n.dir, "pools.yaml"), "--state-dir="+filepath.Join(n.dir, "state"),
		"--kubelet-root="+n.dir, "--default-volume-size=67108864", "--pool-check-interval=1s",
		// Stalled reads are cut and retried after a short grace, as an admin with a fast store sets it.
		"--staging-read-grace=3s", "--shutdown-timeout=5s", "-v=2",
		// The test S3 server (and its fault proxy) is on loopback, named in volumes as tenants do.
		"--tenant-s3-endpoints=127.0.0.1")
	n.cmd.Args = append(n.cmd.Args, n.extra...)
	n.cmd.Env = append(os.Environ(), n.points.env())
	n.cmd.Stdout, n.cmd.Stderr = log, log
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	log.Close()
	n.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(n.cmd, n.exited)
	conn, err := grpc.NewClient("unix://"+n.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.conn, n.ctrl, n.nodeRPC = conn, csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := csi.NewIdentityClient(conn)
	for {
		r, err := id.Probe(ctx, &csi.ProbeRequest{})
		if err == nil && r.GetReady().GetValue() {
			return
		}
		select {
		case <-n.exited:
			t.Fatalf("the driver exited at start; log %s", n.logPath)
		case <-ctx.Done():
			t.Fatalf("the driver is not ready after a minute: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// raceReports are the race detector's reports in the driver's log, of every process so far.
func (n *node) raceReports() []string {
	b, err := os.ReadFile(n.logPath)
	if err != nil {
		return nil
	}
	return testutil.RaceReports(b)
}

// kill SIGKILLs the driver, as the kernel's OOM killer or a node crash would.
func (n *node) kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.exited
	n.conn.Close()
	n.cmd = nil
}

func (n *node) restart() {
	n.kill()
	n.restarts++
	n.start()
}

func (n *node) stop() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(15 * time.Second):
		_ = n.cmd.Process.Signal(syscall.SIGKILL)
		<-n.exited
	}
	n.conn.Close()
	n.cmd = nil
}

// leaks lists what a round left behind once every volume was unpublished and deleted: mounts
// below the kubelet root, loop devices on the pool's volume images, volume references in the
// cache (they keep a dataset from eviction for ever) and trash not removed.
func (n *node) leaks() []string {
	var out []string
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) > 4 && strings.HasPrefix(fields[4], n.dir+"/") && !strings.HasPrefix(fields[4], n.pool) {
				out = append(out, "mount "+fields[4])
			}
		}
		f.Close()
	}
	if b, err := exec.Command("losetup", "-a").Output(); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, n.pool+"/") {
				out = append(out, "loop "+l)
			}
		}
	}
	cache := filepath.Join(n.pool, ".cistern-cache")
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".trash-") {
			out = append(out, "cache trash "+e.Name())
			continue
		}
		refs, _ := os.ReadDir(filepath.Join(cache, e.Name(), "refs"))
		for _, r := range refs {
			out = append(out, fmt.Sprintf("cache reference %s/refs/%s", e.Name(), r.Name()))
		}
	}
	return out
}
