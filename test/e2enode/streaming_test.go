package e2enode

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/pkg/fusekeeper"
	"github.com/cistern-csi/cistern/pkg/streamfs"
	"github.com/cistern-csi/cistern/test/framework"
	"github.com/cistern-csi/cistern/test/framework/realnode"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// reads is what the checker's -read-loop records (hack/images/checker).
type reads struct {
	Rounds, Reads, Failed, Differ, Bytes int64
	Current                              string
	Errors                               []string
	First                                map[string]string
}

const streamPrefix = "stream"

// testStreamingRestart: a pod reads a streaming dataset volume in a loop (every file whole, its
// page cache dropped before each read, each read compared with the file's first, whose sha256 is
// compared with S3's) while the node plugin is killed (SIGKILL, a crash) and started again, and
// then stopped (SIGTERM, as a DaemonSet rollout restart does) and started again, the FUSE keeper
// running beside it as its own DaemonSet does: no read fails, and the reads are counted before,
// across and after each restart; then the keeper is restarted, the plugin hands it the volume
// again, and one more kill of the plugin loses no read either. Every GET of an object is delayed by the test's S3 proxy and
// the staging throttled, so that the large files stay uncached and the first kill lands while
// the pod waits for one (a read of a file not staged yet waits for the staging to fetch it,
// first: 24 MiB at 2 MiB/s).
func testStreamingRestart(t *testing.T, c *cluster, d *dataset) {
	large := map[string]bool{}
	want := map[string]string{} // key -> sha256
	for key, size := range map[string]int{"a/large-0.bin": 24 << 20, "a/large-1.bin": 24 << 20, "large-2.bin": 16 << 20,
		"small/config.json": 700, "small/vocab.txt": 64 << 10, "empty": 0} {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		d.s3.Put(t, datasetBucket, streamPrefix+"/"+key, data)
		sum := sha256.Sum256(data)
		want[key] = hex.EncodeToString(sum[:])
		large[key] = size >= 16<<20
	}
	proxy := testpeers.StartProxy(t, d.s3.Endpoint, func(r *http.Request, _ int64) testpeers.Fault {
		if q := r.URL.Query(); r.Method == http.MethodGet && !q.Has("list-type") && !q.Has("attributes") {
			return testpeers.Fault{ResetAfter: -1, Delay: 1500 * time.Millisecond}
		}
		return testpeers.None
	})

	// The keeper, and a staging slow enough that the large files stay uncached meanwhile, and
	// fast enough for the reads, which wait for it, to go round within the waits below.
	args := slices.Clone(c.node.DriverArgs)
	c.node.StartKeeper(t)
	c.node.DriverArgs = append(c.node.DriverArgs, "--staging-bandwidth=2097152")
	c.node.RestartDriver()
	c.node.WaitRegistered(t, c.cp)
	defer func() {
		// The keeper stays (the other scenarios do not stream); the staging speed is restored.
		c.node.DriverArgs = append(args, c.node.DriverArgs[len(args)])
		c.node.RestartDriver()
		c.node.WaitRegistered(t, c.cp)
	}()

	attrs := map[string]string{"pool": realnode.PoolName, "source": "s3://" + datasetBucket + "/" + streamPrefix,
		"endpoint": proxy.URL, "pathStyle": "true", "dataMode": "streaming", "size": "256Mi"}
	pod := checkerPod(c.checkerImage, c.resultsDir, "streaming",
		[]corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: consts.DriverName, ReadOnly: ptr.To(true), VolumeAttributes: attrs,
			NodePublishSecretRef: &corev1.LocalObjectReference{Name: datasetSecret},
		}}}},
		[]corev1.VolumeMount{{Name: "model", MountPath: "/model", ReadOnly: true}},
		"-dir", "/model", "-read-loop")
	createPod(t, c.cp, c.ns, pod)
	defer deletePodAndWait(t, c.cp, c.ns, "streaming")
	waitPodRunning(t, c.cp, c.ns, "streaming")
	if n := mountsOfType(t, "fuse."+streamfs.Subtype, c.kubelet.RootDir); n == 0 {
		t.Fatal("the pod's volume is not a streaming (FUSE) mount: it was staged instead")
	}

	path := filepath.Join(c.resultsDir, "streaming.reads.json")
	read := func() reads {
		var r reads
		for {
			// The checker renames a whole file into place; a read between two renames may
			// still see none.
			b, err := os.ReadFile(path)
			if err == nil && json.Unmarshal(b, &r) == nil {
				return r
			}
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitReads := func(what string, ok func(reads) bool) reads {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			r := read()
			if ok(r) {
				return r
			}
			if time.Now().After(deadline) || r.Failed > 0 {
				t.Fatalf("waiting for %s: %+v", what, r)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	key := func(p string) string { return strings.TrimPrefix(p, "/model/") }

	// 1. Killed while the pod waits for the first read of an uncached large file.
	before := waitReads("a first read of a large file", func(r reads) bool {
		_, seen := r.First[r.Current]
		return large[key(r.Current)] && !seen
	})
	c.node.KillDriver()
	c.node.WaitRegistered(t, c.cp)
	tookOver(t, c)
	across := read()
	after := waitReads("two rounds after the kill", func(r reads) bool { return r.Rounds >= across.Rounds+2 })
	t.Logf("SIGKILL while reading %s (uncached): reads before %d, by the time the new plugin registered %d, two rounds later %d; failed %d",
		key(before.Current), before.Reads, across.Reads, after.Reads, after.Failed)

	// 2. Stopped as a DaemonSet rollout stops its pod (SIGTERM), while the pod reads.
	before = waitReads("reads before the rollout", func(r reads) bool { return r.Reads >= after.Reads+3 && r.Current != "" })
	c.node.RestartDriver()
	c.node.WaitRegistered(t, c.cp)
	tookOver(t, c)
	across = read()
	after = waitReads("two rounds after the rollout", func(r reads) bool { return r.Rounds >= across.Rounds+2 })
	t.Logf("SIGTERM while reading %s: reads before %d, by the time the new plugin registered %d, two rounds later %d; failed %d; %d MiB read",
		key(before.Current), before.Reads, across.Reads, after.Reads, after.Failed, after.Bytes>>20)

	// 3. The keeper restarted (its pod deleted: it lets go of what it held): the plugin hands it
	// the volume again, and the plugin's next restart still loses no read.
	c.node.RestartKeeper(t)
	deadline := time.Now().Add(time.Minute)
	for held := 0; held == 0; {
		kept, err := fusekeeper.Take(c.node.KeeperSocket)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range kept {
			h.Dev.Close()
		}
		if held = len(kept); held == 0 && time.Now().After(deadline) {
			t.Fatal("the plugin did not hand the restarted keeper its streaming volume")
		}
		time.Sleep(200 * time.Millisecond)
	}
	before = read()
	c.node.KillDriver()
	c.node.WaitRegistered(t, c.cp)
	tookOver(t, c)
	across = read()
	after = waitReads("two rounds after the kill that followed the keeper's restart", func(r reads) bool { return r.Rounds >= across.Rounds+2 })
	t.Logf("keeper restarted, then SIGKILL while reading %q: reads before %d, by the time the new plugin registered %d, two rounds later %d; failed %d",
		key(before.Current), before.Reads, across.Reads, after.Reads, after.Failed)

	if after.Failed != 0 || after.Differ != 0 {
		t.Errorf("%d reads failed and %d differed from the file's first read across the restarts: %v", after.Failed, after.Differ, after.Errors)
	}
	got := map[string]string{}
	for p, sum := range after.First {
		got[key(p)] = sum
	}
	for k, sum := range want {
		if got[k] != sum {
			t.Errorf("%s: first read's sha256 %q, S3's %q", k, got[k], sum)
		}
	}
	if len(got) != len(want) {
		t.Errorf("the pod read %d files, the dataset has %d", len(got), len(want))
	}
	if n := mountsOfType(t, "fuse."+streamfs.Subtype, c.kubelet.RootDir); n == 0 {
		t.Error("the streaming mount is gone after the restarts")
	}
	if t.Failed() {
		return
	}

	// 4. The source changed since the listing: the next process cannot prove the caller reads
	// what the kernel was shown, and the volume answers EIO, never other bytes.
	d.s3.Put(t, datasetBucket, streamPrefix+"/small/config.json", []byte(`{"changed": true}`))
	c.node.KillDriver()
	c.node.WaitRegistered(t, c.cp)
	if b, err := os.ReadFile(c.node.DriverLog()); err != nil || !strings.Contains(string(b), "its reads fail with EIO") {
		t.Fatalf("the plugin's new process did not refuse the volume (%v); its log ends:\n%s", err, framework.Tail(c.node.DriverLog(), 30))
	}
	var r reads
	for deadline := time.Now().Add(time.Minute); r.Failed == 0; time.Sleep(50 * time.Millisecond) {
		if r = read(); time.Now().After(deadline) {
			t.Fatalf("no read failed after the source changed: %+v", r)
		}
	}
	if r.Differ != 0 || !strings.Contains(strings.Join(r.Errors, "\n"), "input/output error") {
		t.Errorf("after the source changed: %d reads differed, errors %v; want EIO only", r.Differ, r.Errors)
	}
	t.Logf("source changed, then SIGKILL: the new process refused the volume; reads fail with %q", r.Errors[0])
}

// tookOver checks that the plugin's new process took the streaming volume over from the keeper
// (its log says so), rather than the reads going on some other way.
func tookOver(t *testing.T, c *cluster) {
	t.Helper()
	b, err := os.ReadFile(c.node.DriverLog())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "Took over a streaming volume") {
		t.Fatalf("the plugin's new process did not take the streaming volume over; its log (%s) ends:\n%s", c.node.DriverLog(), framework.Tail(c.node.DriverLog(), 30))
	}
}
