package driver

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	mount "k8s.io/mount-utils"

	"github.com/cistern-csi/cistern/pkg/sarole"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// TestInlineWebIdentity: through the CSI socket, an inline volume naming credentials=webIdentity
// and a role is filled from a private bucket with no Secret, with the keys the STS hands the
// pod's ServiceAccount token from the volume context (as kubelet passes it for the CSIDriver's
// tokenRequests); a pod of a ServiceAccount the role does not trust is refused, a publish
// without the token is a configuration error, and no token reaches the node's state.
func TestInlineWebIdentity(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "private")
	s.Put(t, "private", "set/model.bin", []byte("weights of team a"))
	const audience, role = "sts.amazonaws.com", "arn:aws:iam::000000000000:role/team-a"
	issuer := testpeers.StartOIDCIssuer(t)
	sts := testpeers.StartSTS(t, issuer.URL, audience, map[string]testpeers.Role{
		role: {Trusts: []string{"system:serviceaccount:team-a:trainer"}, AccessKey: s.AccessKey, SecretKey: s.SecretKey},
	})
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	env.cfg.Datasets.STSEndpoint = sts.URL
	env.start()

	tokens := map[string]string{}
	publish := func(id, serviceAccount string) error {
		vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "source": "s3://private/set",
			"endpoint": s.Endpoint, "pathStyle": "true", "credentials": "webIdentity", "roleARN": role,
			"csi.storage.k8s.io/pod.namespace": strings.Split(serviceAccount+"/", "/")[0], "csi.storage.k8s.io/pod.name": id}
		if serviceAccount != "" {
			tok := issuer.Token(t, serviceAccount, audience)
			tokens[id] = tok
			b, _ := json.Marshal(map[string]map[string]string{audience: {"token": tok, "expirationTimestamp": "2030-01-01T00:00:00Z"}})
			vc["csi.storage.k8s.io/serviceAccount.tokens"] = string(b)
		}
		_, err := env.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id,
			TargetPath: filepath.Join(env.dir, "target", id), VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: true})
		return err
	}

	if err := retryUnavailable(t, func() error { return publish("trainer-pod", "team-a/trainer") }); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(env.dir, "target", "trainer-pod", "model.bin")); err != nil || string(b) != "weights of team a" {
		t.Fatalf("the pod's volume: %q %v", b, err)
	}
	wantCode(t, publish("other-pod", "team-b/trainer"), codes.PermissionDenied, "access denied")
	wantCode(t, publish("no-token-pod", ""), codes.InvalidArgument, "tokenRequests")

	records := 0 // the volume's record, with its attributes, is among the files
	err := filepath.Walk(env.cfg.StateDir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), role) {
			records++
		}
		for id, tok := range tokens {
			if strings.Contains(string(b), tok) {
				t.Errorf("%s holds %s's ServiceAccount token", p, id)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if records == 0 {
		t.Fatalf("no state record under %s names the volume's role: nothing was checked", env.cfg.StateDir)
	}
	for _, id := range []string{"trainer-pod"} {
		if _, err := env.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(env.dir, "target", id)}); err != nil {
			t.Fatal(err)
		}
	}
}

// saTokens is the volume context kubelet adds to NodePublishVolume for a pod of serviceAccount
// (namespace/name) under the CSIDriver's tokenRequests and podInfoOnMount.
func saTokens(t *testing.T, issuer *testpeers.OIDCIssuer, serviceAccount, pod string) map[string]string {
	t.Helper()
	return saTokensUntil(t, issuer, serviceAccount, pod, time.Now().Add(time.Hour))
}

// saTokensUntil is saTokens with a token that expires at exp.
func saTokensUntil(t *testing.T, issuer *testpeers.OIDCIssuer, serviceAccount, pod string, exp time.Time) map[string]string {
	t.Helper()
	const audience = "sts.amazonaws.com"
	ns, name, _ := strings.Cut(serviceAccount, "/")
	b, _ := json.Marshal(map[string]map[string]string{audience: {"token": issuer.TokenUntil(t, serviceAccount, audience, exp),
		"expirationTimestamp": exp.UTC().Format(time.RFC3339)}})
	return map[string]string{"csi.storage.k8s.io/serviceAccount.tokens": string(b), "csi.storage.k8s.io/pod.namespace": ns,
		"csi.storage.k8s.io/pod.name": pod, "csi.storage.k8s.io/pod.uid": "uid-" + pod, "csi.storage.k8s.io/serviceAccount.name": name}
}

// TestClaimWebIdentity: a claim of a StorageClass with credentials=webIdentity, through the CSI
// socket against versitygw and the STS stand-in. NodeStageVolume brings no pod token: it stages
// the volume pending, touching no data (nothing mounted, no exchange), also across a driver
// restart. The first publish of a pod the role trusts exchanges its token, fills the volume at
// the staging path and binds it; a pod of another ServiceAccount is refused, before and after
// that, at every publish of the same claim; a publish without a token is a configuration error.
// Unstage leaves nothing mounted, and a later stage of the filled volume needs no token.
func TestClaimWebIdentity(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "private")
	s.Put(t, "private", "set/model.bin", []byte("weights of team a"))
	const role = "arn:aws:iam::000000000000:role/team-a"
	issuer := testpeers.StartOIDCIssuer(t)
	sts := testpeers.StartSTS(t, issuer.URL, "sts.amazonaws.com", map[string]testpeers.Role{
		role: {Trusts: []string{"system:serviceaccount:team-a:trainer"}, AccessKey: s.AccessKey, SecretKey: s.SecretKey},
	})
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	env.cfg.Datasets.STSEndpoint = sts.URL
	env.start()
	ctx := context.Background()
	vol := env.create("claim-wi", 64<<20, map[string]string{"source": "s3://private/set", "endpoint": s.Endpoint,
		"pathStyle": "true", "credentials": "webIdentity", "roleARN": role, "pool": "fast"})
	staging := filepath.Join(env.dir, "staging", vol.VolumeId)
	stage := func() error {
		_, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
			StagingTargetPath: staging, VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext})
		return err
	}
	publish := func(pod, serviceAccount string) error {
		vc := maps.Clone(vol.VolumeContext)
		if serviceAccount != "" {
			maps.Copy(vc, saTokens(t, issuer, serviceAccount, pod))
		}
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
			TargetPath: filepath.Join(env.dir, "target", pod), VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: true})
		return err
	}
	mounted := func(p string) bool {
		notMnt, err := mount.New("").IsLikelyNotMountPoint(p)
		return err == nil && !notMnt
	}

	for range 2 { // idempotent
		if err := stage(); err != nil {
			t.Fatalf("NodeStageVolume without a pod token: %v", err)
		}
	}
	if mounted(staging) || sts.Exchanges() != 0 {
		t.Fatalf("staging pending mounted something (%v) or exchanged a token (%d)", mounted(staging), sts.Exchanges())
	}
	env.restart() // a pending stage survives the driver's restart (nothing is mounted to find)
	health, err := env.node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging})
	if err != nil || len(health.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Fatalf("health of a pending stage: %v %v, want healthy", health, err)
	}
	wantCode(t, publish("other-pod", "team-b/trainer"), codes.PermissionDenied, "access denied")
	wantCode(t, publish("no-token-pod", ""), codes.InvalidArgument, "tokenRequests")
	if mounted(staging) {
		t.Fatal("a refused first publish left the staging path mounted")
	}
	if err := retryUnavailable(t, func() error { return publish("trainer-pod", "team-a/trainer") }); err != nil {
		t.Fatalf("first publish of a trusted pod: %v", err)
	}
	checkFiles(t, filepath.Join(env.dir, "target", "trainer-pod"), map[string]string{"model.bin": "weights of team a"})
	if !mounted(staging) || sts.Exchanges() == 0 {
		t.Fatalf("the first publish did not stage the volume (mounted %v) with an exchange (%d)", mounted(staging), sts.Exchanges())
	}
	if err := publish("trainer-pod", "team-a/trainer"); err != nil {
		t.Fatalf("publish again: %v", err)
	}
	if err := publish("second-trainer", "team-a/trainer"); err != nil {
		t.Fatalf("a second pod of the trusted ServiceAccount: %v", err)
	}
	wantCode(t, publish("other-pod", "team-b/trainer"), codes.PermissionDenied, "access denied")
	if mounted(filepath.Join(env.dir, "target", "other-pod")) {
		t.Fatal("the refused pod's target is mounted")
	}
	for _, pod := range []string{"trainer-pod", "second-trainer", "other-pod"} {
		if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: filepath.Join(env.dir, "target", pod)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if mounted(staging) {
		t.Fatal("unstage left the staging path mounted")
	}

	// Filled now: staging mounts it without a token; each publish still proves its pod's right.
	if err := stage(); err != nil {
		t.Fatal(err)
	}
	if !mounted(staging) {
		t.Fatal("staging the filled volume mounted nothing")
	}
	wantCode(t, publish("other-pod", "team-b/trainer"), codes.PermissionDenied, "access denied")
	if err := publish("trainer-pod", "team-a/trainer"); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, filepath.Join(env.dir, "target", "trainer-pod"), map[string]string{"model.bin": "weights of team a"})
	// The source changes: a new pod proves it reads the new version, which is not the claim's.
	s.Put(t, "private", "set/model.bin", []byte("weights of team a, retrained"))
	err = retryUnavailable(t, func() error { return publish("late-pod", "team-a/trainer") })
	wantCode(t, err, codes.PermissionDenied, "holds another version")
	for _, pod := range []string{"trainer-pod", "late-pod"} {
		if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: filepath.Join(env.dir, "target", pod)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}

// TestServiceAccountRoleWebIdentity: a claim of a StorageClass with roleFrom=serviceAccount takes
// the role its publishing pod's ServiceAccount names (Cistern's annotation, or IRSA's), against
// versitygw and the STS stand-in, whose roles trust named ServiceAccounts only. A pod author who
// annotates their own ServiceAccount with the role is refused by the STS (the trust decision is
// the role's, never the annotation's); a role outside the administrator's --web-identity-roles is
// refused before any exchange; a ServiceAccount naming no role is a configuration error.
func TestServiceAccountRoleWebIdentity(t *testing.T) {
	s := testpeers.StartS3(t, "")
	s.Bucket(t, "private")
	s.Put(t, "private", "set/model.bin", []byte("weights of team a"))
	const role, admin = "arn:aws:iam::000000000000:role/team-a", "arn:aws:iam::000000000000:role/admin"
	issuer := testpeers.StartOIDCIssuer(t)
	sts := testpeers.StartSTS(t, issuer.URL, "sts.amazonaws.com", map[string]testpeers.Role{
		role:  {Trusts: []string{"system:serviceaccount:team-a:trainer", "system:serviceaccount:team-a:irsa"}, AccessKey: s.AccessKey, SecretKey: s.SecretKey},
		admin: {Trusts: []string{"system:serviceaccount:team-a:outsider"}, AccessKey: s.AccessKey, SecretKey: s.SecretKey},
	})
	sa := func(name string, annotations map[string]string) *corev1.ServiceAccount {
		return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, Annotations: annotations}}
	}
	client := fake.NewClientset(
		sa("trainer", map[string]string{"cistern.csi.dev/role-arn": role}),
		sa("irsa", map[string]string{"eks.amazonaws.com/role-arn": role}),
		sa("intruder", map[string]string{"cistern.csi.dev/role-arn": role}), // annotated by a pod author
		sa("outsider", map[string]string{"cistern.csi.dev/role-arn": admin}),
		sa("plain", nil),
	)
	env := startDriver(t, testPool{name: "fast"})
	env.stop()
	env.cfg.Datasets.STSEndpoint = sts.URL
	env.cfg.Datasets.ServiceAccountRoles = sarole.Reader{Client: client.CoreV1()}
	env.cfg.Datasets.WebIdentityRoles = []string{"arn:aws:iam::000000000000:role/team-*"}
	env.start()
	ctx := context.Background()
	vol := env.create("claim-sa", 64<<20, map[string]string{"source": "s3://private/set", "endpoint": s.Endpoint,
		"pathStyle": "true", "credentials": "webIdentity", "roleFrom": "serviceAccount", "pool": "fast"})
	staging := filepath.Join(env.dir, "staging", vol.VolumeId)
	if _, err := env.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
		StagingTargetPath: staging, VolumeCapability: mountCap(""), VolumeContext: vol.VolumeContext}); err != nil {
		t.Fatal(err)
	}
	publish := func(serviceAccount string) error {
		vc := maps.Clone(vol.VolumeContext)
		pod := strings.ReplaceAll(serviceAccount, "/", "-")
		maps.Copy(vc, saTokens(t, issuer, serviceAccount, pod))
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
			TargetPath: filepath.Join(env.dir, "target", pod), VolumeCapability: mountCap(""), VolumeContext: vc, Readonly: true})
		return err
	}

	wantCode(t, publish("team-a/intruder"), codes.PermissionDenied, "access denied")
	exchanges := sts.Exchanges()
	wantCode(t, publish("team-a/outsider"), codes.PermissionDenied, "--web-identity-roles")
	wantCode(t, publish("team-a/plain"), codes.InvalidArgument, "cistern.csi.dev/role-arn")
	wantCode(t, publish("team-a/ghost"), codes.InvalidArgument, "does not exist")
	if sts.Exchanges() != exchanges {
		t.Fatalf("refused before any exchange, yet the STS exchanged %d tokens", sts.Exchanges()-exchanges)
	}
	for _, sa := range []string{"team-a/trainer", "team-a/irsa"} {
		if err := retryUnavailable(t, func() error { return publish(sa) }); err != nil {
			t.Fatalf("%s: %v", sa, err)
		}
		checkFiles(t, filepath.Join(env.dir, "target", strings.ReplaceAll(sa, "/", "-")), map[string]string{"model.bin": "weights of team a"})
	}
	wantCode(t, publish("team-a/intruder"), codes.PermissionDenied, "access denied") // after the volume is filled too
	if sts.Exchanges() <= exchanges {
		t.Fatal("the trusted pods' tokens were not exchanged")
	}
	for _, pod := range []string{"team-a-trainer", "team-a-irsa", "team-a-intruder", "team-a-outsider", "team-a-plain", "team-a-ghost"} {
		if _, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: filepath.Join(env.dir, "target", pod)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}
