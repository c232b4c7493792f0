package testpeers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cistern-csi/cistern/test/framework/kit"
)

// RGW is a Ceph cluster of one monitor, one in-memory OSD and one radosgw on loopback: an S3
// server with RGW's own ETags, checksums (none) and key handling. It takes about a minute to
// start, so a package starts it once (TestMain) and closes it after its tests.
type RGW struct {
	*S3
	// Setup is how long the cluster took to start.
	Setup   time.Duration
	dir     string
	conf    string
	daemons []*daemon
}

// RGWBinaries are the Debian packages' programs StartRGW runs (radosgw, ceph-mon, ceph-osd,
// ceph-common); make host-packages installs them.
var RGWBinaries = []string{"ceph-mon", "ceph-osd", "radosgw", "ceph", "monmaptool", "radosgw-admin"}

// RGWAvailable reports the first of RGWBinaries missing from the PATH, or nil.
func RGWAvailable() error {
	for _, b := range RGWBinaries {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("%s missing: make host-packages installs radosgw, ceph-mon, ceph-osd and ceph-common", b)
		}
	}
	return nil
}

// StartRGW starts the cluster in a fresh directory under parent ("" for the system's temporary
// directory) and creates an S3 user. On failure everything started is stopped and removed, and
// the error carries the end of the failing daemon's log. A port taken by another process
// between being chosen and bound fails an attempt: it is tried three times, on new ports.
func StartRGW(ctx context.Context, parent string) (*RGW, error) {
	if err := RGWAvailable(); err != nil {
		return nil, err
	}
	var errs []error
	for range 3 {
		r, err := startRGW(ctx, parent)
		if err == nil || ctx.Err() != nil {
			return r, err
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func startRGW(ctx context.Context, parent string) (r *RGW, err error) {
	start := time.Now()
	dir, err := os.MkdirTemp(parent, "cistern-rgw-")
	if err != nil {
		return nil, err
	}
	c := &RGW{dir: dir, conf: filepath.Join(dir, "ceph.conf")}
	defer func() {
		if err != nil {
			c.Close() // not r: a failing return has already set it to nil
		}
	}()
	r = c
	ports, err := kit.FreePorts(2)
	if err != nil {
		return nil, err
	}
	mon := fmt.Sprintf("[v1:127.0.0.1:%d]", ports[0])
	rgwAddr := "127.0.0.1:" + strconv.Itoa(ports[1])
	fsid, err := uuid()
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"mon", "osd", "run", "log", "rgw"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(r.conf, []byte(rgwConf(dir, fsid, mon, rgwAddr)), 0o644); err != nil {
		return nil, err
	}
	monmap := filepath.Join(dir, "monmap")
	if err := r.run(ctx, "monmaptool", "--create", "--addv", "a", mon, "--fsid", fsid, monmap); err != nil {
		return nil, err
	}
	if err := r.run(ctx, "ceph-mon", "-c", r.conf, "--mkfs", "-i", "a", "--monmap", monmap); err != nil {
		return nil, err
	}
	if err := r.daemon("ceph-mon", "-c", r.conf, "-f", "-i", "a"); err != nil {
		return nil, err
	}
	monAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	if err := kit.WaitListening(monAddr, time.Minute, r.daemons[0].done); err != nil {
		return nil, fmt.Errorf("ceph-mon: %w; log:\n%s", err, tailFile(filepath.Join(dir, "log", "mon.a.log"), 20))
	}
	// The OSD's id comes from the monitor, which takes the first command once it has quorum.
	if err := r.run(ctx, "ceph", "-c", r.conf, "--connect-timeout", "60", "osd", "create"); err != nil {
		return nil, err
	}
	if err := r.run(ctx, "ceph-osd", "-c", r.conf, "-i", "0", "--mkfs"); err != nil {
		return nil, err
	}
	if err := r.daemon("ceph-osd", "-c", r.conf, "-f", "-i", "0"); err != nil {
		return nil, err
	}
	if err := r.waitOSD(ctx); err != nil {
		return nil, err
	}
	// radosgw creates its pools itself once the OSD is up.
	if err := r.daemon("radosgw", "-c", r.conf, "-f", "-n", "client.rgw"); err != nil {
		return nil, err
	}
	rgw := r.daemons[len(r.daemons)-1]
	if err := kit.WaitListening(rgwAddr, 3*time.Minute, rgw.done); err != nil {
		return nil, fmt.Errorf("radosgw: %w; log:\n%s", err, tailFile(filepath.Join(dir, "log", "client.rgw.log"), 20))
	}
	s := &S3{Endpoint: "http://" + rgwAddr, AccessKey: "cistern-test", SecretKey: "cistern-test-secret"}
	if err := r.run(ctx, "radosgw-admin", "-c", r.conf, "user", "create", "--uid", "cistern",
		"--display-name", "cistern", "--access-key", s.AccessKey, "--secret", s.SecretKey); err != nil {
		return nil, err
	}
	s.Client = s.NewClient(s.Endpoint)
	r.S3, r.Setup = s, time.Since(start)
	return r, nil
}

// rgwConf is the cluster's configuration: no authentication, v1 (not msgr2) on loopback only,
// pools of one replica on one host, an OSD that keeps its objects in memory.
func rgwConf(dir, fsid, mon, rgwAddr string) string {
	return fmt.Sprintf(`[global]
fsid = %[2]s
mon host = %[3]s
auth cluster required = none
auth service required = none
auth client required = none
ms bind msgr2 = false
ms bind ipv6 = false
public addr = 127.0.0.1
cluster addr = 127.0.0.1
osd objectstore = memstore
memstore device bytes = 1073741824
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd crush chooseleaf type = 0
osd pool default pg num = 8
osd pool default pgp num = 8
mon max pg per osd = 1000
osd pool default pg autoscale mode = off
mon data avail warn = 1
mon data avail crit = 1
run dir = %[1]s/run
admin socket = %[1]s/run/$name.asok
log file = %[1]s/log/$name.log
pid file = %[1]s/run/$name.pid
[mon.a]
mon data = %[1]s/mon
[osd.0]
osd data = %[1]s/osd
[client.rgw]
rgw frontends = beast endpoint=%[4]s
rgw data = %[1]s/rgw
`, dir, fsid, mon, rgwAddr)
}

// run runs a setup command to completion.
func (r *RGW) run(ctx context.Context, bin string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, out)
	}
	return nil
}

// daemon starts one of the cluster's daemons in the foreground.
func (r *RGW) daemon(bin string, args ...string) error {
	d, err := startDaemon(bin, filepath.Join(r.dir, "log", bin+".out"), bin, args...)
	if err != nil {
		return err
	}
	r.daemons = append(r.daemons, d)
	return nil
}

// waitOSD waits until the monitor reports the OSD up.
func (r *RGW) waitOSD(ctx context.Context) error {
	osd := r.daemons[len(r.daemons)-1]
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := exec.CommandContext(ctx, "ceph", "-c", r.conf, "--connect-timeout", "10", "osd", "stat", "-f", "json").Output()
		var st struct {
			Up int `json:"num_up_osds"`
		}
		if err == nil && json.Unmarshal(out, &st) == nil && st.Up == 1 {
			return nil
		}
		if osd.exited() || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("ceph-osd not up (%s %v); log:\n%s", out, err, tailFile(filepath.Join(r.dir, "log", "osd.0.log"), 20))
		}
		time.Sleep(time.Second)
	}
}

// Close stops the daemons (radosgw first) and removes the cluster's directory.
func (r *RGW) Close() {
	for i := len(r.daemons) - 1; i >= 0; i-- {
		r.daemons[i].stop()
	}
	r.daemons = nil
	if err := os.RemoveAll(r.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "removing %s: %v\n", r.dir, err)
	}
}

func uuid() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}

// tailFile returns the last n lines of a log.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
