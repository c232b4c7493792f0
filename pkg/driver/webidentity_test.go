package driver

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

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
