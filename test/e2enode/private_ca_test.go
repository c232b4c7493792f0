package e2enode

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/cistern-csi/cistern/pkg/consts"
	"github.com/cistern-csi/cistern/test/testpeers"
)

// privateCABundle is the key of the administrator's CA bundles (the driver's --s3-ca-bundles
// directory, as a mounted ConfigMap lays it out) that verifies the TLS S3 server.
const privateCABundle = "private-ca.pem"

// testPrivateCA: an S3 server on TLS with a certificate of its own CA. A pod whose inline volume
// names the administrator's bundle of that CA mounts the dataset, byte-identical; one naming
// none is refused (the certificate is not trusted: InvalidArgument, not retried).
func testPrivateCA(t *testing.T, c *cluster) {
	s3 := testpeers.StartS3TLS(t, "")
	s3.Bucket(t, datasetBucket)
	d := &dataset{s3: s3.S3, source: "s3://" + datasetBucket + "/" + datasetPrefix}
	d.files = uploadDataset(t, s3.S3)
	if err := os.WriteFile(filepath.Join(c.caBundles, privateCABundle), s3.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	pod := func(name, bundle string) *corev1.Pod {
		attrs := d.attributes()
		attrs["size"] = "64Mi"
		if bundle != "" {
			attrs[consts.ParamCABundle] = bundle
		}
		return checkerPod(c.checkerImage, c.resultsDir, name,
			[]corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: consts.DriverName, ReadOnly: ptr.To(true), VolumeAttributes: attrs,
				NodePublishSecretRef: &corev1.LocalObjectReference{Name: datasetSecret},
			}}}},
			[]corev1.VolumeMount{{Name: "model", MountPath: "/model", ReadOnly: true}},
			"-dir", "/model", "-hash")
	}
	createPod(t, c.cp, c.ns, pod("private-ca", privateCABundle))
	waitPodRunning(t, c.cp, c.ns, "private-ca")
	d.checkFiles(t, "private-ca", readResult(t, c.resultsDir, "private-ca").Dirs[0])

	createPod(t, c.cp, c.ns, pod("private-ca-untrusted", ""))
	waitFailedMount(t, c, "private-ca-untrusted", "certificate is not trusted")

	for _, name := range []string{"private-ca", "private-ca-untrusted"} {
		deletePodAndWait(t, c.cp, c.ns, name)
	}
}
