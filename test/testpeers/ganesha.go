package testpeers

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	nfs "github.com/willscott/go-nfs-client/nfs"
	"github.com/willscott/go-nfs-client/nfs/rpc"

	"github.com/cistern-csi/cistern/test/testutil"
)

var ganeshas atomic.Int32

// StartGanesha runs nfs-ganesha (Debian's ganesha.nfsd, the VFS FSAL, NFSv3 over TCP) exporting
// dir read-write without root squashing, and the rpcbind it registers with, and returns the
// server's address without a port: clients find MOUNT and NFS through rpcbind on port 111, as
// with any NFS server. Port 111 is the host's to give, so both run in a network namespace of
// their own, joined to the host by a veth pair on a /30 no interface of this machine uses, and in
// a mount namespace with a private /run, so that this rpcbind's socket is not the host's. The
// export's path at the server is dir itself. Everything (processes, namespace, link) goes when
// the test ends. Root only; skips (fails under CISTERN_REQUIRE_PEERS) without the binaries.
func StartGanesha(t testing.TB, dir string) string {
	t.Helper()
	return StartGaneshaExports(t, GaneshaExport{Dir: dir})
}

// StartGaneshaNFSv4 is StartGanesha serving NFSv4 as well as NFSv3, on port 2049 of the address
// it returns: the export's pseudo path (where NFSv4 clients find it) is dir too. The server
// starts graceless (no 90 s grace period: it has no clients to recover), sends and takes owners
// as numbers (no ID mapping: AUTH_SYS uids are what the files carry), and caches no attributes,
// so that a file the test changes under dir is seen changed at once.
func StartGaneshaNFSv4(t testing.TB, dir string) string {
	t.Helper()
	return startGanesha(t, true, GaneshaExport{Dir: dir})
}

// GaneshaExport is one export of a StartGaneshaExports server: Dir, read-write over NFSv3 with
// AUTH_SYS, at the server's path Dir. ganesha checks every request's uid and gid (after
// squashing) against the files' owners and modes, as the kernel does for a local process.
type GaneshaExport struct {
	Dir string
	// Squash is the export's squash rule: "" (No_Root_Squash: every uid as the client says),
	// Root_Squash (uid 0 becomes the anonymous identity) or All_Squash (every uid does).
	Squash string
	// AnonUID and AnonGID are the anonymous identity squashed requests take; 0 leaves ganesha's
	// (65534).
	AnonUID, AnonGID uint32
}

// config is the export's EXPORT block, with id id, over NFSv3 or, with v4, NFSv3 and NFSv4
// (attributes read from the directory every time: tests change files under it directly).
func (e GaneshaExport) config(id int, v4 bool) string {
	squash := e.Squash
	if squash == "" {
		squash = "No_Root_Squash"
	}
	extra := ""
	if e.AnonUID != 0 {
		extra += fmt.Sprintf("  Anonymous_Uid = %d;\n", e.AnonUID)
	}
	if e.AnonGID != 0 {
		extra += fmt.Sprintf("  Anonymous_Gid = %d;\n", e.AnonGID)
	}
	if v4 {
		extra += "  Attr_Expiration_Time = 0;\n"
	}
	return fmt.Sprintf(`EXPORT {
  Export_Id = %[1]d;
  Path = %[2]q;
  Pseudo = %[2]q;
  Protocols = %[5]s;
  Transports = TCP;
  Access_Type = RW;
  Squash = %[3]s;
%[4]s  SecType = sys;
  FSAL { Name = VFS; }
}
`, id, e.Dir, squash, extra, ganeshaProtocols(v4))
}

func ganeshaProtocols(v4 bool) string {
	if v4 {
		return "3, 4"
	}
	return "3"
}

// ganeshaConf is the configuration of exports: NLM and RQUOTA off; NFSv3 only unless v4, which
// adds NFSv4 with its recovery directory under work.
func ganeshaConf(work string, v4 bool, exports []GaneshaExport) []byte {
	v4conf := ""
	if v4 {
		v4conf = fmt.Sprintf(`NFSv4 {
  Graceless = true;
  Allow_Numeric_Owners = true;
  Only_Numeric_Owners = true;
  RecoveryBackend = fs;
  RecoveryRoot = %q;
}
`, filepath.Join(work, "recovery"))
	}
	var blocks strings.Builder
	for i, e := range exports {
		blocks.WriteString(e.config(i+1, v4))
	}
	return fmt.Appendf(nil, `NFS_CORE_PARAM {
  Protocols = %s;
  Enable_NLM = false;
  Enable_RQUOTA = false;
}
%s%s
LOG { Default_Log_Level = EVENT; }
`, ganeshaProtocols(v4), v4conf, blocks.String())
}

// StartGaneshaExports is StartGanesha serving several exports from one server (one start, a few
// seconds, for the tests of several export rules).
func StartGaneshaExports(t testing.TB, exports ...GaneshaExport) string {
	t.Helper()
	return startGanesha(t, false, exports...)
}

func startGanesha(t testing.TB, v4 bool, exports ...GaneshaExport) string {
	t.Helper()
	testutil.RequireRoot(t)
	for _, b := range []string{"ganesha.nfsd", "rpcbind", "ip", "unshare"} {
		if _, err := exec.LookPath(b); err != nil {
			testutil.Unavailable(t, "%s missing: make host-packages installs nfs-ganesha, nfs-ganesha-vfs and rpcbind", b)
		}
	}
	n := ganeshas.Add(1)
	ns := fmt.Sprintf("cistern-ganesha-%d-%d", os.Getpid(), n)
	hostIf := fmt.Sprintf("cgan%d-%d", os.Getpid()%100000, n%100)
	hostIP, serverIP := freeLink(t, int(n))
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", ns)
	// Deleting the namespace deletes the veth pair with it.
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	run("ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns)
	run("ip", "addr", "add", hostIP+"/30", "dev", hostIf)
	run("ip", "link", "set", hostIf, "up")
	run("ip", "-n", ns, "addr", "add", serverIP+"/30", "dev", "eth0")
	run("ip", "-n", ns, "link", "set", "eth0", "up")
	run("ip", "-n", ns, "link", "set", "lo", "up")

	work := t.TempDir()
	conf := filepath.Join(work, "ganesha.conf")
	if err := os.WriteFile(conf, ganeshaConf(work, v4, exports), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(work, "ganesha.log")
	script := fmt.Sprintf(`set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/ganesha
rpcbind -f -w &
for i in $(seq 50); do [ -S /run/rpcbind.sock ] && break; sleep 0.1; done
exec ganesha.nfsd -F -f %q -L %q -p /run/ganesha/pid -N NIV_EVENT`, conf, logFile)
	cmd := exec.Command("ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(work, "out.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		_ = out.Close()
	})
	// Ready once rpcbind tells MOUNT's and NFS's ports and both answer.
	deadline := time.Now().Add(time.Minute)
	for {
		if ganeshaListens(serverIP) {
			return serverIP
		}
		select {
		case <-done:
			log, _ := os.ReadFile(logFile)
			early, _ := os.ReadFile(out.Name())
			t.Fatalf("ganesha exited: %s\n%s", early, tail(log, 2000))
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile)
			t.Fatalf("ganesha not serving after a minute:\n%s", tail(log, 2000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ganeshaListens says whether rpcbind at ip knows MOUNT's and NFS's ports (version 3, TCP) and
// both accept connections: ganesha listens on 2049 before it registers MOUNT, and a client
// asking rpcbind in between would be told port 0.
func ganeshaListens(ip string) bool {
	pm, err := rpc.DialPortmapper("tcp", ip)
	if err != nil {
		return false
	}
	defer pm.Close()
	for _, prog := range []rpc.Mapping{{Prog: nfs.MountProg, Vers: nfs.MountVers}, {Prog: nfs.Nfs3Prog, Vers: nfs.Nfs3Vers}} {
		prog.Prot = rpc.IPProtoTCP
		port, err := pm.Getport(prog)
		if err != nil || port == 0 {
			return false
		}
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(port)), time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
	}
	return true
}

// freeLink picks a /30 in 10.249.0.0/16 that no interface of this machine has an address in:
// the host's end and the server's.
func freeLink(t testing.TB, n int) (string, string) {
	t.Helper()
	used := map[string]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			used[ipn.IP.Mask(net.CIDRMask(30, 32)).String()] = true
		}
	}
	for i := range 16384 {
		k := (os.Getpid()*64 + n + i) % 16384
		base := net.IPv4(10, 249, byte(k>>6), byte(k&63)<<2)
		if !used[base.String()] {
			return net.IPv4(10, 249, byte(k>>6), byte(k&63)<<2+1).String(), net.IPv4(10, 249, byte(k>>6), byte(k&63)<<2+2).String()
		}
	}
	t.Fatal("no free /30 in 10.249.0.0/16")
	return "", ""
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
