package poolpublisher

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	spv1 "github.com/cistern-csi/cistern/pkg/rpc/storagepool/v1alpha1"
)

func TestCheckSupported(t *testing.T) {
	t.Run("driver serving StoragePoolController", func(t *testing.T) {
		d := &fakeDriver{}
		d.set(localPool("fast", "node-1", gi, gi))
		if err := startFakeDriver(t, d, 0).CheckSupported(context.Background()); err != nil {
			t.Errorf("CheckSupported: %v", err)
		}
	})
	t.Run("failure case - driver without the service", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "csi.sock")
		lis, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer() // serves nothing
		go srv.Serve(lis)       //nolint:errcheck // ends with Stop
		t.Cleanup(srv.Stop)
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		err = NewDriverPools(conn, 0).CheckSupported(context.Background())
		if err == nil || !strings.Contains(err.Error(), spv1.StoragePoolController_ServiceDesc.ServiceName) {
			t.Errorf("CheckSupported = %v, want an error naming the missing service", err)
		}
	})
}

func TestListPaginates(t *testing.T) {
	d := &fakeDriver{}
	d.set(localPool("a", "n", gi, gi), localPool("b", "n", gi, gi), localPool("c", "n", gi, gi))
	pools, gen, err := startFakeDriver(t, d, 2).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pools) != 3 || gen != 1 {
		t.Errorf("List = %d pools, generation %d; want 3 pools, generation 1", len(pools), gen)
	}
}
