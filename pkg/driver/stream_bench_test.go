package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/cistern-csi/cistern/pkg/datasource"
	cparams "github.com/cistern-csi/cistern/pkg/params"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/test/testpeers"
	"github.com/cistern-csi/cistern/test/testutil"
)

// TestStreamingPublishBench (make bench-streaming; skipped unless CISTERN_BENCH_STREAMING=1): how
// long a static PV of an uncached one-object dataset takes from its first NodeStageVolume to
// NodePublishVolume returning, streaming against staged (the same driver, server and object,
// samples interleaved), and, for the streaming volume, the first byte of the object read through
// it right after. Each volume names the object through its own include pattern, so every sample
// is a dataset of its own, staged from S3 (versitygw) afresh; a streaming volume's staging ends
// before the next sample starts. The pool and the S3 server's disk are the tests' tmpfs.
func TestStreamingPublishBench(t *testing.T) {
	if os.Getenv("CISTERN_BENCH_STREAMING") != "1" {
		t.Skip("a benchmark: make bench-streaming")
	}
	testutil.RequireRoot(t)
	size := int64(512 << 20)
	if mib, err := strconv.ParseInt(os.Getenv("CISTERN_BENCH_STREAM_PUBLISH_MIB"), 10, 64); err == nil && mib > 0 {
		size = mib << 20
	}
	env := startDriver(t, testPool{name: "fast"})
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "models")
	s.PutMultipart(t, "models", "model.bin", size, 8<<20, func(i int, buf []byte) {
		for k := range buf {
			buf[k] = byte(i + k)
		}
	})
	secrets := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	roMany := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
	}
	// publish stages and publishes volume id (retrying while the driver answers Unavailable, as
	// kubelet does) and returns the time it took and the target.
	publish := func(id, mode, include string) (time.Duration, string) {
		vc := map[string]string{"source": "s3://models", "endpoint": s.Endpoint, "pathStyle": "true",
			"include": include, "dataMode": mode}
		staging := filepath.Join(env.dir, "staging", id)
		target := filepath.Join(env.dir, "target", id)
		start := time.Now()
		if err := retryUnavailable(t, func() error {
			_, err := env.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: id,
				StagingTargetPath: staging, VolumeCapability: roMany, VolumeContext: vc, Secrets: secrets})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id,
			StagingTargetPath: staging, TargetPath: target, VolumeCapability: roMany, VolumeContext: vc, Readonly: true}); err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		t.Cleanup(func() {
			_, _ = env.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			_, _ = env.node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		})
		return d, target
	}
	var streamed, staged, firstByte []time.Duration
	patterns := []string{"model*", "mode*", "mod*", "mo*", "m*", "*.bin"}
	for i := range 3 {
		d, target := publish(fmt.Sprintf("stream-%d", i), "streaming", patterns[2*i])
		streamed = append(streamed, d)
		start := time.Now()
		f, err := os.Open(filepath.Join(target, "model.bin"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadAt(make([]byte, 1), size/2); err != nil {
			t.Fatal(err)
		}
		f.Close()
		firstByte = append(firstByte, time.Since(start))
		// The streaming volume's staging ends before the staged sample starts: no contention.
		spec := datasource.SpecOf(mustParse(t, map[string]string{"source": "s3://models", "endpoint": s.Endpoint,
			"pathStyle": "true", "include": patterns[2*i]}).Dataset)
		for deadline := time.Now().Add(5 * time.Minute); ; {
			if st, _, _ := env.driver.cache.Status("fast", spec); st.Ready() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the streaming volume's staging did not end")
			}
			time.Sleep(50 * time.Millisecond)
		}
		d, _ = publish(fmt.Sprintf("staged-%d", i), "staged", patterns[2*i+1])
		staged = append(staged, d)
	}
	fmt.Printf("streaming: dataset=model-%dm publish_s=%.3f staged_publish_s=%s streaming_publish_s=%s publish_ratio=%.3f first_byte_after_publish_s=%s\n",
		size>>20, med(streamed).Seconds(), spreadS(staged), spreadS(streamed), med(streamed).Seconds()/med(staged).Seconds(), spreadS(firstByte))
}

func mustParse(t *testing.T, m map[string]string) cparams.Volume {
	t.Helper()
	v, err := volume.ParseParams(m, cparams.StaticPV)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func med(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func spreadS(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%.3f/%.3f/%.3f", s[0].Seconds(), med(s).Seconds(), s[len(s)-1].Seconds())
}
