package driver

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/cistern-csi/cistern/pkg/image"
	"github.com/cistern-csi/cistern/pkg/pool"
	"github.com/cistern-csi/cistern/pkg/volume"
	"github.com/cistern-csi/cistern/pkg/writeback/credstore"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// The write-back's tenant rules (docs/security.md, "Write-back"): a namespace's share of the
// node's budget, the age limit of pending uploads, the credentials kept sealed, each claim of a
// class its own target, and tenants' NFS targets below their namespace's directory.

// wbPublisher publishes writable inline volumes of the "shared" dataset for pods of a
// namespace, with the owner's keys: publish(id, ns, pod, attrs) returns the target path.
type wbPublisher struct {
	t     *testing.T
	env   *testEnv
	s     *testpeers.S3
	proxy *testpeers.Proxy
}

func (p wbPublisher) publish(id, ns, pod string, attrs map[string]string) (string, error) {
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://shared/set", "endpoint": p.proxy.URL,
		"pathStyle": "true", "size": "64Mi", "csi.storage.k8s.io/pod.namespace": ns, "csi.storage.k8s.io/pod.name": pod,
		"csi.storage.k8s.io/pod.uid": "uid-" + pod}
	for k, v := range attrs {
		vc[k] = v
	}
	target := filepath.Join(p.env.dir, "target", id)
	return target, retryUnavailable(p.t, func() error {
		_, err := p.env.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
			VolumeCapability: mountCap(""), VolumeContext: vc, Secrets: map[string]string{"accessKeyID": p.s.AccessKey, "secretAccessKey": p.s.SecretKey}})
		return err
	})
}

// refuseUploads makes proxy answer every write 503 but the probes of publish and stage, so that
// volumes are admitted and their uploads refused.
func refuseUploads(r *http.Request, n int64) testpeers.Fault {
	if strings.Contains(r.URL.Path, ".cistern-write-probe-") {
		return testpeers.None
	}
	return refuseWrites(r, n)
}

func (p wbPublisher) unpublish(id, target string) {
	p.t.Helper()
	if _, err := p.env.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		p.t.Fatal(err)
	}
}

// TestWriteBackNamespaceShare: a namespace whose target refuses holds outputs past its share of
// the node's budget; only its share counts against the node, so another namespace's volume is
// still admitted where the node's whole budget is held, while the namespace's own next one is
// refused (ResourceExhausted, naming its share). The metrics say what is held, what counts, and
// by namespace.
func TestWriteBackNamespaceShare(t *testing.T) {
	env, s, proxy, _ := writeBackEnv(t)
	env.stop()
	env.cfg.Writable.WriteBack.MaxPendingBytes = 12 << 20
	env.cfg.Writable.WriteBack.MaxPendingBytesPerNamespace = 8 << 20
	env.start()
	p := wbPublisher{t: t, env: env, s: s, proxy: proxy}
	attrs := map[string]string{"outputTarget": "s3://out/share/${pod.namespace}/${pod.name}"}
	proxy.SetFaults(refuseUploads)
	for i, pod := range []string{"train-0", "train-1"} {
		id := "wb-share-" + pod
		target, err := p.publish(id, "team", pod, attrs)
		if err != nil {
			t.Fatalf("%s: %v", pod, err)
		}
		writeOutputs(t, target, map[string][]byte{"model.bin": randomBytes(t, 6<<20)})
		p.unpublish(id, target)
		// Counted at the volume's capacity until the upload's first pass measures its changes.
		waitFor(t, "the refused upload's bytes to be measured", func() bool {
			return namespacePending(t, env)["team"] == float64((i+1)*6<<20)
		})
	}
	_, err := p.publish("wb-share-train-2", "team", "train-2", attrs)
	wantCode(t, err, codes.ResourceExhausted, `namespace "team" holds 12582912 bytes of outputs not uploaded yet on node node-1, its share of the node's budget (--writeback-max-pending-bytes-per-namespace`)
	// 12 MiB held, the node's whole budget; 8 MiB of it counts, the share of "team".
	if n := writeBackMetric(t, env, "cistern_writeback_pending_bytes"); n != 12<<20 {
		t.Errorf("cistern_writeback_pending_bytes = %v, want 12 MiB", n)
	}
	if n := writeBackMetric(t, env, "cistern_writeback_counted_bytes"); n != 8<<20 {
		t.Errorf("cistern_writeback_counted_bytes = %v, want the share, 8 MiB", n)
	}
	other, err := p.publish("wb-share-other", "other", "eval-0", attrs)
	if err != nil {
		t.Fatalf("another namespace's volume, with the node's budget held by one whose target refuses: %v", err)
	}
	proxy.SetFaults(nil)
	p.unpublish("wb-share-other", other)
	waitFor(t, "every upload once the target accepts", func() bool { return len(env.driver.volumes.Store().ListVolumes()) == 0 })
	if n := writeBackMetric(t, env, "cistern_writeback_counted_bytes"); n != 0 {
		t.Errorf("cistern_writeback_counted_bytes = %v once uploaded", n)
	}
}

// namespacePending is cistern_writeback_namespace_pending_bytes by namespace.
func namespacePending(t *testing.T, env *testEnv) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(env.driver.volumes.WriteBackCollectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "cistern_writeback_namespace_pending_bytes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "namespace" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// TestWriteBackExpiry: an upload whose target refuses for longer than --writeback-max-age
// expires: a Warning Event on the pod or claim says so and what happens to the data, the
// credentials kept for it are gone from the disk, it counts against nothing (metrics), an
// inline volume is deleted, and a claim keeps its data but is no longer held (DeleteVolume
// deletes it).
func TestWriteBackExpiry(t *testing.T) {
	env, s, proxy, events := writeBackEnv(t)
	env.stop()
	env.cfg.Writable.WriteBack.MaxAge = 2 * time.Second
	env.start()
	ctx := context.Background()
	p := wbPublisher{t: t, env: env, s: s, proxy: proxy}
	proxy.SetFaults(refuseUploads)
	target, err := p.publish("wb-expire", "team", "train-0", map[string]string{"outputTarget": "s3://out/expire"})
	if err != nil {
		t.Fatal(err)
	}
	writeOutputs(t, target, map[string][]byte{"model.bin": randomBytes(t, 3<<20)})
	p.unpublish("wb-expire", target)

	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	vol, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "claim-expire", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Secrets: owner,
		Parameters: map[string]string{"source": "s3://shared/set", "endpoint": proxy.URL, "pathStyle": "true", "pool": "fast", "outputTarget": "s3://out/expire-claim",
			"csi.storage.k8s.io/pvc/name": "work", "csi.storage.k8s.io/pvc/namespace": "team"}})
	if err != nil {
		t.Fatal(err)
	}
	claimID := vol.Volume.VolumeId
	ctarget := stageClaim(t, env, vol.Volume, owner)
	writeOutputs(t, ctarget, map[string][]byte{"eval.csv": []byte("a,b\n")})
	env.unpublishAndUnstage(claimID)

	pod := volume.ObjectRef{Kind: "Pod", Namespace: "team", Name: "train-0", UID: "uid-train-0"}
	claim := volume.ObjectRef{Kind: "PersistentVolumeClaim", Namespace: "team", Name: "work"}
	waitFor(t, "both uploads to expire", func() bool {
		return events.has(pod, true, volume.ReasonOutputUploadExpired, "wb-expire", "--writeback-max-age 2s", "deleted with the volume") &&
			events.has(claim, true, volume.ReasonOutputUploadExpired, claimID, "the claim keeps them")
	})
	waitFor(t, "the inline volume to be deleted", func() bool {
		_, ok := env.driver.volumes.Store().GetVolume("wb-expire")
		return !ok
	})
	if _, err := os.Stat(image.VolumePath(env.pools[0].path, pool.MetaDir, "wb-expire")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the expired inline volume's image: %v, want it gone", err)
	}
	waitFor(t, "the claim to be released", func() bool { return env.driver.volumes.WriteBackHolds(claimID) == "" })
	if n := writeBackMetric(t, env, "cistern_writeback_expired_total"); n != 2 {
		t.Errorf("cistern_writeback_expired_total = %v, want 2", n)
	}
	if n := writeBackMetric(t, env, "cistern_writeback_counted_bytes"); n != 0 {
		t.Errorf("cistern_writeback_counted_bytes = %v after both expired", n)
	}
	if creds := credentialFiles(t, env); len(creds) != 0 {
		t.Errorf("credentials kept after the uploads expired: %v", creds)
	}
	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: claimID}); err != nil {
		t.Errorf("DeleteVolume of the claim whose upload expired: %v", err)
	}
}

// stageClaim stages and publishes a claim's volume with secrets and returns its target path.
func stageClaim(t *testing.T, env *testEnv, vol *csi.Volume, secrets map[string]string) string {
	t.Helper()
	ctx := context.Background()
	id := vol.VolumeId
	staging, target := filepath.Join(env.dir, "staging", id), filepath.Join(env.dir, "target", id)
	if err := retryUnavailable(t, func() error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext, Secrets: secrets})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap("")}); err != nil {
		t.Fatal(err)
	}
	return target
}

// credentialFiles lists the credential files the node keeps for uploads.
func credentialFiles(t *testing.T, env *testEnv) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(env.cfg.Writable.WriteBack.Dir, "secrets"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestWriteBackCredentialsLost: a node that reboots loses the key its uploads' credentials are
// sealed with (the kernel held it, never the disk): an upload to an S3 target cannot go on, a
// Warning Event on its pod or claim says so, and the data is kept. A claim's next
// NodeStageVolume brings credentials again, which the upload goes on with once they wrote the
// probe; an inline volume's upload expires at its age limit, also when that passed while the
// node plugin was down.
func TestWriteBackCredentialsLost(t *testing.T) {
	env, s, proxy, events := writeBackEnv(t)
	ctx := context.Background()
	p := wbPublisher{t: t, env: env, s: s, proxy: proxy}
	proxy.SetFaults(refuseUploads)
	id := "wb-lost"
	target, err := p.publish(id, "team", "train-0", map[string]string{"outputTarget": "s3://out/lost"})
	if err != nil {
		t.Fatal(err)
	}
	writeOutputs(t, target, map[string][]byte{"model.bin": randomBytes(t, 1<<20)})
	p.unpublish(id, target)
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	vol, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "claim-lost", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Secrets: owner,
		Parameters: map[string]string{"source": "s3://shared/set", "endpoint": proxy.URL, "pathStyle": "true", "pool": "fast", "outputTarget": "s3://out/lost-claim",
			"csi.storage.k8s.io/pvc/name": "work", "csi.storage.k8s.io/pvc/namespace": "team"}})
	if err != nil {
		t.Fatal(err)
	}
	claimID := vol.Volume.VolumeId
	claimFiles := map[string][]byte{"eval.csv": []byte("a,b\n1,2\n")}
	writeOutputs(t, stageClaim(t, env, vol.Volume, owner), claimFiles)
	env.unpublishAndUnstage(claimID)

	env.stop()
	if err := credstore.Drop(filepath.Join(env.cfg.Writable.WriteBack.Dir, "secrets")); err != nil { // a reboot
		t.Fatal(err)
	}
	proxy.SetFaults(nil)
	env.start()
	pod := volume.ObjectRef{Kind: "Pod", Namespace: "team", Name: "train-0", UID: "uid-train-0"}
	claim := volume.ObjectRef{Kind: "PersistentVolumeClaim", Namespace: "team", Name: "work"}
	waitFor(t, "the lost credentials to be reported", func() bool {
		return events.has(pod, true, volume.ReasonOutputUploadFailed, id, "credentials kept for it are lost", "the data is kept") &&
			events.has(claim, true, volume.ReasonOutputUploadFailed, claimID, "credentials kept for it are lost")
	})
	if _, ok := env.driver.volumes.Store().GetVolume(id); !ok {
		t.Fatal("the volume was deleted when its upload's credentials were lost")
	}
	if got := objectsAt(t, s, "lost/"); len(got) != 0 {
		t.Errorf("%d objects at the target without the tenant's credentials", len(got))
	}

	// The claim is staged again: its upload takes the stage's credentials, and then it stages.
	staging := filepath.Join(env.dir, "staging", claimID)
	_, err = env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: claimID, StagingTargetPath: staging,
		VolumeCapability: mountCap(""), VolumeContext: vol.Volume.VolumeContext, Secrets: owner})
	wantCode(t, err, codes.Unavailable, "outputs are uploaded")
	waitFor(t, "the claim's upload with the stage's credentials", func() bool { return env.driver.volumes.WriteBackHolds(claimID) == "" })
	checkOutputs(t, s, "lost-claim/", claimFiles)

	env.stop()
	env.cfg.Writable.WriteBack.MaxAge = time.Millisecond // passed while the plugin was down
	env.start()
	waitFor(t, "the upload to expire at start", func() bool {
		return events.has(pod, true, volume.ReasonOutputUploadExpired, id, "deleted with the volume")
	})
	waitFor(t, "the volume to be deleted", func() bool {
		_, ok := env.driver.volumes.Store().GetVolume(id)
		return !ok
	})
}

// noSecretOnDisk fails if the node plugin's state or write-back directory holds secret in any
// file.
func noSecretOnDisk(t *testing.T, env *testEnv, secret string) {
	t.Helper()
	for _, dir := range []string{env.cfg.StateDir, env.cfg.Writable.WriteBack.Dir} {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			data, err := os.ReadFile(p)
			if bytes.Contains(data, []byte(secret)) {
				t.Errorf("%s holds the tenant's secret key in plaintext", p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestWriteBackClaimTargets: a class's output target naming its claims (${pvc.namespace},
// ${pvc.name}) gives each claim its own prefix, replaced at CreateVolume (the volume context says
// which) from what external-provisioner names with --extra-create-metadata; two claims of the
// class write two prefixes. A class target naming a claim without that metadata, or naming the
// pod, and an inline volume naming a claim, are refused.
func TestWriteBackClaimTargets(t *testing.T) {
	env, s, proxy, _ := writeBackEnv(t)
	ctx := context.Background()
	owner := map[string]string{"accessKeyID": s.AccessKey, "secretAccessKey": s.SecretKey}
	class := map[string]string{"source": "s3://shared/set", "endpoint": proxy.URL, "pathStyle": "true", "pool": "fast",
		"outputTarget": "s3://out/claims/${pvc.namespace}/${pvc.name}"}
	create := func(name string, extra map[string]string) (*csi.CreateVolumeResponse, error) {
		params := map[string]string{}
		for _, m := range []map[string]string{class, extra} {
			for k, v := range m {
				params[k] = v
			}
		}
		return env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap("")}, Secrets: owner, Parameters: params})
	}
	t.Run("failure case - a claim's placeholder without --extra-create-metadata", func(t *testing.T) {
		_, err := create("pvc-nometa", nil)
		wantCode(t, err, codes.InvalidArgument, "uses ${pvc.namespace}, but CreateVolume names no claim (external-provisioner passes it with --extra-create-metadata)")
	})
	t.Run("failure case - a class target naming the pod", func(t *testing.T) {
		_, err := create("pvc-pod", map[string]string{"outputTarget": "s3://out/${pod.name}", "csi.storage.k8s.io/pvc/name": "x",
			"csi.storage.k8s.io/pvc/namespace": "team"})
		wantCode(t, err, codes.InvalidArgument, "NodeStageVolume knows no pod")
	})
	t.Run("failure case - an inline volume naming a claim", func(t *testing.T) {
		p := wbPublisher{t: t, env: env, s: s, proxy: proxy}
		_, err := p.publish("wb-inline-pvc", "team", "train-0", map[string]string{"outputTarget": "s3://out/${pvc.name}"})
		wantCode(t, err, codes.InvalidArgument, "${pvc.name}")
	})
	want := map[string]map[string][]byte{}
	for _, claim := range []string{"work-a", "work-b"} {
		meta := map[string]string{"csi.storage.k8s.io/pvc/name": claim, "csi.storage.k8s.io/pvc/namespace": "team",
			"csi.storage.k8s.io/pv/name": "pvc-" + claim}
		vol, err := create("pvc-"+claim, meta)
		if err != nil {
			t.Fatal(err)
		}
		if got := vol.Volume.VolumeContext["outputTarget"]; got != "s3://out/claims/team/"+claim {
			t.Errorf("%s: outputTarget %q in the volume context, want s3://out/claims/team/%s", claim, got, claim)
		}
		if again, err := create("pvc-"+claim, meta); err != nil || again.Volume.VolumeId != vol.Volume.VolumeId {
			t.Errorf("a repeated CreateVolume of %s: %v, %v; want the same volume", claim, again, err)
		}
		target := stageClaim(t, env, vol.Volume, owner)
		want[claim] = map[string][]byte{"result.txt": []byte("written by " + claim)}
		writeOutputs(t, target, want[claim])
		env.unpublishAndUnstage(vol.Volume.VolumeId)
		id := vol.Volume.VolumeId
		waitFor(t, claim+"'s upload", func() bool { return env.driver.volumes.WriteBackHolds(id) == "" })
	}
	for claim, files := range want {
		checkOutputs(t, s, "claims/team/"+claim+"/", files)
	}
}
