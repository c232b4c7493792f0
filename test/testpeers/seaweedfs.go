package testpeers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/cistern-csi/cistern/test/framework/kit"
)

// SeaweedFS is `weed server -s3` on loopback: a master, a volume server, a filer and the S3
// gateway in one process, with one admin identity.
type SeaweedFS struct {
	*S3
	// Setup is how long the server took to accept a write.
	Setup time.Duration
	dir   string
	d     *daemon
	// sockets are the gRPC sockets weed makes in /tmp whatever its flags, by service and port.
	sockets []string
}

// SeaweedFSBinary is $CISTERN_SEAWEEDFS (make seaweedfs builds it into the cache), or "".
func SeaweedFSBinary() string {
	p := os.Getenv("CISTERN_SEAWEEDFS")
	if p == "" {
		return ""
	}
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// StartSeaweedFS runs bin in a fresh directory under parent ("" for the system's temporary
// directory) until Close. Every port is chosen here (gRPC ones too: weed's default, HTTP port
// + 10000, may not exist); the Iceberg and Lance catalogues are off. On failure everything is
// stopped and removed.
func StartSeaweedFS(ctx context.Context, bin, parent string) (w *SeaweedFS, err error) {
	start := time.Now()
	dir, err := os.MkdirTemp(parent, "cistern-seaweedfs-")
	if err != nil {
		return nil, err
	}
	c := &SeaweedFS{dir: dir}
	defer func() {
		if err != nil {
			c.Close() // not w: a failing return has already set it to nil
		}
	}()
	w = c
	p, err := kit.FreePorts(8)
	if err != nil {
		return nil, err
	}
	s := &S3{Endpoint: "http://127.0.0.1:" + strconv.Itoa(p[0]), AccessKey: "cistern-test", SecretKey: "cistern-test-secret"}
	conf := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(conf, seaweedIdentities(s.AccessKey, s.SecretKey), 0o600); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		return nil, err
	}
	port := func(i int) string { return strconv.Itoa(p[i]) }
	for svc, i := range map[string]int{"master": 2, "volume": 4, "filer": 6, "s3": 7} {
		c.sockets = append(c.sockets, fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%d.sock", svc, p[i]))
	}
	w.d, err = startDaemon("weed", filepath.Join(dir, "weed.log"), bin, "server",
		"-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-dir="+data, "-volume.max=256",
		"-master.port="+port(1), "-master.port.grpc="+port(2), "-master.volumeSizeLimitMB=64",
		"-master.telemetry=false",
		"-volume.port="+port(3), "-volume.port.grpc="+port(4),
		"-filer", "-filer.port="+port(5), "-filer.port.grpc="+port(6),
		"-filer.localSocket="+filepath.Join(dir, "filer.sock"),
		"-s3", "-s3.port="+port(0), "-s3.port.grpc="+port(7), "-s3.config="+conf,
		"-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.localSocket="+filepath.Join(dir, "s3.sock"))
	if err != nil {
		return nil, err
	}
	if err := kit.WaitListening(s.Endpoint[len("http://"):], 2*time.Minute, w.d.done); err != nil {
		return nil, fmt.Errorf("weed: %w; log:\n%s", err, tailFile(w.d.log, 30))
	}
	s.Client = s.NewClient(s.Endpoint)
	// The gateway listens before the volume server has joined the master: wait for a write.
	if err := probeWrite(ctx, s.Client, time.Minute); err != nil {
		return nil, fmt.Errorf("weed: %w; log:\n%s", err, tailFile(w.d.log, 30))
	}
	w.S3, w.Setup = s, time.Since(start)
	return w, nil
}

// seaweedIdentities is an S3 identity file with one admin.
func seaweedIdentities(access, secret string) []byte {
	type cred struct {
		AccessKey string `json:"accessKey"`
		SecretKey string `json:"secretKey"`
	}
	type identity struct {
		Name        string   `json:"name"`
		Credentials []cred   `json:"credentials"`
		Actions     []string `json:"actions"`
	}
	b, _ := json.Marshal(map[string][]identity{"identities": {{
		Name: "cistern", Credentials: []cred{{access, secret}},
		Actions: []string{"Admin", "Read", "Write", "List", "Tagging"},
	}}})
	return b
}

// probeWrite creates a bucket, writes an object into it and deletes both, once that works.
func probeWrite(ctx context.Context, c *s3.Client, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	b := aws.String("cistern-probe")
	for {
		_, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: b})
		if err == nil || isCode(err, "BucketAlreadyOwnedByYou", "BucketAlreadyExists") {
			_, err = c.PutObject(ctx, &s3.PutObjectInput{Bucket: b, Key: aws.String("p"), Body: bytes.NewReader([]byte("p"))})
		}
		if err == nil {
			_, _ = c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: b, Key: aws.String("p")})
			_, err = c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: b})
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no write accepted after %s: %w", timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Close stops weed and removes its directory and sockets.
func (w *SeaweedFS) Close() {
	if w.d != nil {
		w.d.stop()
	}
	for _, f := range w.sockets {
		_ = os.Remove(f)
	}
	if err := os.RemoveAll(w.dir); err != nil {
		fmt.Fprintf(os.Stderr, "removing %s: %v\n", w.dir, err)
	}
}

// isCode reports whether err is an S3 error with one of codes.
func isCode(err error, codes ...string) bool {
	var api smithy.APIError
	return errors.As(err, &api) && slices.Contains(codes, api.ErrorCode())
}
