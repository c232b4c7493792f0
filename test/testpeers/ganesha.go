package testpeers

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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
	return startGanesha(t, dir, false)
}

// StartGaneshaNFSv4 is StartGanesha serving NFSv4 as well as NFSv3, on port 2049 of the address
// it returns: the export's pseudo path (where NFSv4 clients find it) is dir too. The server
// starts graceless (no 90 s grace period: it has no clients to recover), sends and takes owners
// as numbers (no ID mapping: AUTH_SYS uids are what the files carry), and caches no attributes,
// so that a file the test changes under dir is seen changed at once.
func StartGaneshaNFSv4(t testing.TB, dir string) string {
	t.Helper()
	return startGanesha(t, dir, true)
}

// ganeshaConf is the configuration: NLM and RQUOTA off; NFSv3 only unless v4, which adds NFSv4
// with its recovery directory under work.
func ganeshaConf(dir, work string, v4 bool) []byte {
	protocols, v4conf, attrs := "3", "", ""
	if v4 {
		protocols = "3, 4"
		// Tests change files under dir directly: attributes are read from it every time.
		attrs = "\n  Attr_Expiration_Time = 0;"
		v4conf = fmt.Sprintf(`NFSv4 {
  Graceless = true;
  Allow_Numeric_Owners = true;
  Only_Numeric_Owners = true;
  RecoveryBackend = fs;
  RecoveryRoot = %q;
}
`, filepath.Join(work, "recovery"))
	}
	return fmt.Appendf(nil, `NFS_CORE_PARAM {
  Protocols = %[2]s;
  Enable_NLM = false;
  Enable_RQUOTA = false;
}
%[3]sEXPORT {
  Export_Id = 1;
  Path = %[1]q;
  Pseudo = %[1]q;
  Protocols = %[2]s;
  Transports = TCP;
  Access_Type = RW;
  Squash = No_Root_Squash;
  SecType = sys;%[4]s
  FSAL { Name = VFS; }
}
LOG { Default_Log_Level = EVENT; }
`, dir, protocols, v4conf, attrs)
}

func startGanesha(t testing.TB, dir string, v4 bool) string {
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
	if err := os.WriteFile(conf, ganeshaConf(dir, work, v4), 0o644); err != nil {
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
	// Ready once both MOUNT's and NFS's ports answer; ganesha registers them with rpcbind first.
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

// ganeshaListens says whether rpcbind and ganesha's NFS port answer at ip.
func ganeshaListens(ip string) bool {
	for _, port := range []string{"111", "2049"} {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, port), time.Second)
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
