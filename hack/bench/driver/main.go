// Command driver measures the Cistern CSI driver's volume lifecycle against the floor: the same
// storage steps run directly (fallocate, mkfs, loop attach, mount, bind mount and teardown), in
// the same run, on the same disk. It prints a Markdown report.
//
//	go run ./hack/bench/driver -volumes 100 -size 64Mi -dir /var/tmp
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/cistern-csi/cistern/pkg/driver"
)

func main() {
	n := flag.Int("volumes", 100, "volumes per lifecycle run")
	sizeFlag := flag.String("size", "64Mi", "volume size")
	dirFlag := flag.String("dir", os.TempDir(), "directory on the disk under test")
	scale := flag.Int("scale", 1000, "existing volumes for the CreateVolume scaling check")
	flag.Parse()
	klog.SetOutput(os.Stderr)
	q := resource.MustParse(*sizeFlag)
	size := q.Value()

	dir, err := os.MkdirTemp(*dirFlag, "cistern-bench-")
	must(err)
	defer os.RemoveAll(dir)

	env := startDriver(dir)
	defer env.stop()
	// Floor and driver samples alternate, so both see the same background load.
	var floor, lifecycle []time.Duration
	for i := 0; i < *n; i++ {
		floor = append(floor, floorOnce(dir, i, size))
		lifecycle = append(lifecycle, driverOnce(env, i, size))
	}
	for _, k := range []string{"CreateVolume", "NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume", "DeleteVolume"} {
		fmt.Fprintf(os.Stderr, "%-20s mean %s\n", k, fmtD(stepTimes[k]/time.Duration(*n)))
	}

	// Two more drivers, one holding 10 volumes and one holding -scale, sampled alternately.
	smallEnv, largeEnv := startDriver(filepath.Join(dir, "small")), startDriver(filepath.Join(dir, "large"))
	defer smallEnv.stop()
	defer largeEnv.stop()
	small, large := createLatency(smallEnv, largeEnv, 10, *scale, 100)

	fmt.Printf("## CSI driver volume lifecycle\n\n")
	fmt.Printf("%d volumes of %s, ext4, pool on %s. Each sample is one volume's CreateVolume → NodeStage → NodePublish → NodeUnpublish → NodeUnstage → DeleteVolume; the floor runs the same storage steps directly (fallocate, mkfs.ext4, losetup, mount(2), bind mount(2), umount(2) ×2, losetup -d, rm).\n\n", *n, *sizeFlag, *dirFlag)
	fmt.Printf("| path | p50 | p99 | mean |\n|---|---|---|---|\n")
	row("floor (direct)", floor)
	row("driver (gRPC)", lifecycle)
	fmt.Printf("\nRatio driver/floor: p50 **%.2f×**, p99 %.2f× (goal: p50 ≤ 1.3×)\n\n", ratio(p(lifecycle, 50), p(floor, 50)), ratio(p(lifecycle, 99), p(floor, 99)))
	fmt.Printf("## CreateVolume with many existing volumes\n\n")
	fmt.Printf("| existing volumes | CreateVolume p50 | p99 |\n|---|---|---|\n")
	fmt.Printf("| 10 | %s | %s |\n| %d | %s | %s |\n", fmtD(p(small, 50)), fmtD(p(small, 99)), *scale, fmtD(p(large, 50)), fmtD(p(large, 99)))
	fmt.Printf("\nRatio %d/10: p50 **%.2f×** (goal ≤ 1.2×)\n", *scale, ratio(p(large, 50), p(small, 50)))
}

func row(name string, d []time.Duration) {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	fmt.Printf("| %s | %s | %s | %s |\n", name, fmtD(p(d, 50)), fmtD(p(d, 99)), fmtD(sum/time.Duration(len(d))))
}

func fmtD(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func p(d []time.Duration, pct int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*pct + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(args ...string) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		must(fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out))
	}
}

func output(args ...string) string {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		must(fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out))
	}
	return strings.TrimSpace(string(out))
}

// floorOnce runs the storage steps the driver performs for one volume, without the driver.
func floorOnce(dir string, i int, size int64) time.Duration {
	base := filepath.Join(dir, "floor")
	must(os.MkdirAll(base, 0o755))
	img := filepath.Join(base, fmt.Sprintf("v%d.img", i))
	staging := filepath.Join(base, fmt.Sprintf("s%d", i))
	target := filepath.Join(base, fmt.Sprintf("t%d", i))
	start := time.Now()
	f, err := os.Create(img)
	must(err)
	must(unix.Fallocate(int(f.Fd()), 0, 0, size))
	must(f.Sync())
	f.Close()
	dev := output("losetup", "--find", "--show", "--direct-io=on", img)
	run("mkfs.ext4", "-q", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", "-F", "-m0", dev)
	must(os.MkdirAll(staging, 0o750))
	// mount(2) and umount(2), not mount(8): the floor is the least work the steps take, so it
	// forks only what has no system call to stand for it here (mkfs, losetup).
	must(unix.Mount(dev, staging, "ext4", 0, ""))
	must(os.MkdirAll(target, 0o750))
	must(unix.Mount(staging, target, "", unix.MS_BIND, ""))
	must(unix.Unmount(target, 0))
	must(os.Remove(target))
	must(unix.Unmount(staging, 0))
	must(os.Remove(staging))
	run("losetup", "--detach", dev)
	must(os.Remove(img))
	return time.Since(start)
}

type env struct {
	dir  string
	ctrl csi.ControllerClient
	node csi.NodeClient
	stop func()
}

func startDriver(dir string) *env {
	must(os.MkdirAll(dir, 0o755))
	poolDir := filepath.Join(dir, "pool")
	must(os.MkdirAll(poolDir, 0o755))
	cfgPath := filepath.Join(dir, "pools.yaml")
	must(os.WriteFile(cfgPath, []byte("pools:\n- name: bench\n  path: "+poolDir+"\n"), 0o644))
	endpoint := "unix://" + filepath.Join(dir, "csi.sock")
	d, err := driver.New(driver.Config{DriverName: "cistern.csi.dev", Endpoint: endpoint, NodeID: "bench", Mode: driver.ModeAll,
		PoolsConfig: cfgPath, StateDir: filepath.Join(dir, "state"), PoolCheckInterval: time.Minute, KubeletRoot: dir})
	must(err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	<-d.Ready()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	must(err)
	return &env{dir: dir, ctrl: csi.NewControllerClient(conn), node: csi.NewNodeClient(conn), stop: func() {
		conn.Close()
		cancel()
		<-done
	}}
}

var mountCap = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// stepTimes accumulates time per RPC, for the report's breakdown.
var stepTimes = map[string]time.Duration{}

func timed(name string, f func() error) {
	start := time.Now()
	must(f())
	stepTimes[name] += time.Since(start)
}

// driverOnce runs one volume's lifecycle through the driver's gRPC API.
func driverOnce(e *env, i int, size int64) time.Duration {
	ctx := context.Background()
	staging := filepath.Join(e.dir, "staging", fmt.Sprint(i))
	target := filepath.Join(e.dir, "target", fmt.Sprint(i))
	start := time.Now()
	var id string
	timed("CreateVolume", func() error {
		v, err := e.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("life-%d", i),
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{mountCap}})
		id = v.GetVolume().GetVolumeId()
		return err
	})
	timed("NodeStageVolume", func() error {
		_, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap})
		return err
	})
	timed("NodePublishVolume", func() error {
		_, err := e.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap})
		return err
	})
	timed("NodeUnpublishVolume", func() error {
		_, err := e.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		return err
	})
	timed("NodeUnstageVolume", func() error {
		_, err := e.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	})
	timed("DeleteVolume", func() error {
		_, err := e.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	})
	return time.Since(start)
}

// createLatency fills driver a with na volumes and driver b with nb (1 MiB block volumes: cheap
// to make), then times CreateVolume calls of the same kind on each, alternating so both see the
// same background load.
func createLatency(a, b *env, na, nb, samples int) (da, db []time.Duration) {
	ctx := context.Background()
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	mk := func(e *env, name string) time.Duration {
		start := time.Now()
		_, err := e.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{block}})
		must(err)
		return time.Since(start)
	}
	for i := 0; i < na; i++ {
		mk(a, fmt.Sprintf("fill-%d", i))
	}
	for i := 0; i < nb; i++ {
		mk(b, fmt.Sprintf("fill-%d", i))
	}
	for i := 0; i < samples; i++ {
		da = append(da, mk(a, fmt.Sprintf("sample-%d", i)))
		db = append(db, mk(b, fmt.Sprintf("sample-%d", i)))
	}
	return da, db
}
