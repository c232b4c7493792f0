package main

import (
	"context"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

type identity struct {
	csi.UnimplementedIdentityServer
}

func (identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "test.csi.dev", VendorVersion: "v1"}, nil
}

type controller struct {
	csi.UnimplementedControllerServer
	expand bool
}

func (c controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	rpc := csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME
	if c.expand {
		rpc = csi.ControllerServiceCapability_RPC_EXPAND_VOLUME
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: rpc}},
	}}}, nil
}

// serve starts a CSI driver on a socket and returns a connection to it.
func serve(t *testing.T, c controller) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, identity{})
	csi.RegisterControllerServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := connection.Connect(context.Background(), sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The driver's name comes back only when it expands volumes in its controller service.
func TestCheckDriver(t *testing.T) {
	name, err := checkDriver(context.Background(), serve(t, controller{expand: true}), time.Minute)
	if err != nil || name != "test.csi.dev" {
		t.Errorf("checkDriver = %q, %v", name, err)
	}
	if _, err := checkDriver(context.Background(), serve(t, controller{}), time.Minute); err == nil || !strings.Contains(err.Error(), "EXPAND_VOLUME") {
		t.Errorf("checkDriver of a driver without EXPAND_VOLUME = %v", err)
	}
}

func TestNodeDeploymentFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	if err := run(context.Background(), options{nodeDeployment: true}); err == nil || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Errorf("--node-deployment without NODE_NAME: %v", err)
	}
	t.Setenv("NODE_NAME", "node-a")
	if err := run(context.Background(), options{nodeDeployment: true, leaderElection: true}); err == nil || !strings.Contains(err.Error(), "exclude") {
		t.Errorf("--node-deployment with --leader-election: %v", err)
	}
}

func TestSanitize(t *testing.T) {
	if got := sanitize("cistern.csi.dev"); got != "cistern-csi-dev" {
		t.Errorf("sanitize = %q", got)
	}
}

// The arguments the storage e2e suite's component passes (test/k8se2e/resizer) parse, so that
// a renamed flag fails here rather than in a crash-looping container.
func TestComponentFlagsParse(t *testing.T) {
	data, err := os.ReadFile("../../../test/k8se2e/resizer/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var component struct {
		Patches []struct {
			Patch string `json:"patch"`
		} `json:"patches"`
	}
	if err := yaml.Unmarshal(data, &component); err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, p := range component.Patches {
		var ops []struct {
			Value struct {
				Name string   `json:"name"`
				Args []string `json:"args"`
			} `json:"value"`
		}
		if err := yaml.Unmarshal([]byte(p.Patch), &ops); err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			if op.Value.Name == "csi-resizer" {
				args = op.Value.Args
			}
		}
	}
	if len(args) == 0 {
		t.Fatal("no csi-resizer container arguments in the component")
	}
	fs := flag.NewFlagSet("csi-resizer", flag.ContinueOnError)
	klog.InitFlags(fs)
	var o options
	bindFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	if !o.nodeDeployment || o.csiAddress != "/csi/csi.sock" {
		t.Errorf("parsed %+v", o)
	}
}
